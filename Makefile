# Two entry points on a fresh machine (each creates ./.venv first; see scripts/setup_env.sh):
#   make demo   - the main job on the embedded default (shipped tiny model, stdlib corpus)
#   make test   - the default test suite (slow and GPU tests are skipped)
.PHONY: env demo test test-all bench

env:
	@bash scripts/setup_env.sh

demo: env
	.venv/bin/workbench demo $(ARGS)

test: env
	.venv/bin/python -m pytest $(ARGS)

test-all: env
	.venv/bin/python -m pytest -m "" $(ARGS)

bench: env
	.venv/bin/python benchmarks/run_all.py
