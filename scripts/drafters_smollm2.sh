#!/usr/bin/env bash
# Issue 29 on SmolLM2-135M after the DEER Stage I leg: Stage II, ship the drafter, then every measurement of the
# closing note (DEER eval, DiffuSpec ablations with both drafters, leaderboard rows, SimSD precision).
set -euo pipefail
cd "$(dirname "$0")/.."
WB=.venv/bin/workbench
$WB train deer --config workbench/configs/smollm2_deer_stage2.yaml --progress_bar false
.venv/bin/python scripts/ship_deer_drafter.py --stage1 runs/smollm2_deer/stage1 --stage2 runs/smollm2_deer/stage2 \
  --model smollm2-135m
$WB deer eval --config workbench/configs/smollm2_deer_eval.yaml --stage1_drafter runs/smollm2_deer/stage1/drafter \
  --progress_bar false
$WB diffuspec eval --model smollm2-135m-trimode --drafters "[self, workbench/assets/smollm2-135m-deer-drafter]" \
  --n_prompts 4 --gen_len 48 --out_dir runs/diffuspec/eval_smollm2 --progress_bar false
$WB leaderboard --model smollm2-135m-trimode --decoders "[confidence, deer, diffuspec, diffuspec_cps, diffuspec_adl, diffuspec_argmax, simsd]" \
  --n_prompts 4 --gen_len 32 --block_lengths "[4,8]" --thresholds "[0.7,0.9]" --precision fp32 \
  --out_dir runs/leaderboard_smollm2_drafters --progress_bar false
$WB simsd precision --model smollm2-135m-trimode --n_prompts 4 --out_dir runs/simsd/precision_smollm2
