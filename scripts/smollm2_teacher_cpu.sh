#!/usr/bin/env bash
# SmolLM2-135M's greedy answers made on a CPU (fp32), for the next GPU leg's self-distillation
# (scripts/device/smollm2_legs.sh distill; pack with ANSWERS=runs/smollm2_teacher_cpu_r16 scripts/device/pack_lease.sh pack).
# Prompts of rounds 16-23 of this machine's train-split list (per_file 24; FIRST = the number of prompts that
# per_file 16 gives here, 20,177 on a Python 3.11 stdlib with Lib/test). The device's rounds 0-15 are legs 4-5's
# answers and the `distill` stage's own; a file's cut in one round is never reused by a later round, so a file that
# is byte-identical on both machines gives no repeated prompt. The corpus is each machine's own stdlib (the device
# runs another Python, without Lib/test), so a file that differs between the two versions may give a near-repeat,
# and prompt ids number each machine's own list. Resumable: rerun the same command (in the background, in legs).
# To ship what is done so far (pack_lease.sh takes complete folders only), rerun with N_ANSWERS = 128 x the chunks
# on disk: every chunk is kept and the folder is marked complete; a later run with a larger N_ANSWERS extends it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n 10 "${PY:-.venv/bin/python}" -m workbench.cli deer teacher --config workbench/configs/smollm2_teacher.yaml \
  --first "${FIRST:-20177}" --per_file 24 --n_answers "${N_ANSWERS:-4096}" --batch_size 32 --chunk_size 128 \
  --precision fp32 --device cpu --out_dir "${OUT_DIR:-runs/smollm2_teacher_cpu_r16}"
