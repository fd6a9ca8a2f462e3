#!/usr/bin/env bash
# DEER drafter depth probe for SmolLM2 (issue 29 §1): equal Stage I budgets at several depths; the choice is
# made on validation acceptance per drafter FLOP (table: python scripts/deer_depth_table.py). Usage: deer_depth_probe.sh STEPS DEPTH...
set -euo pipefail
cd "$(dirname "$0")/.."
steps=$1; shift
for n in "$@"; do
  .venv/bin/workbench train deer --config workbench/configs/smollm2_deer_stage1.yaml --shared_layers "$n" \
    --max_steps "$steps" --val_every "$steps" --checkpoint_every "$steps" --warmup_steps 20 \
    --out_dir "runs/smollm2_deer/probe_L$n" --progress_bar false --max_time null
done
