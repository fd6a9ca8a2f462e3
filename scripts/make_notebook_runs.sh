#!/usr/bin/env bash
# The small run folders the documentation site's notebooks read (docs/notebook_runs/), made on the shipped tiny
# model. The site's build executes every notebook against them (docs/_ext/notebook_pages.py), so the rendered
# outputs are that execution's. Rerun after a change to what the notebooks read; about 3 minutes on 2 cores.
set -euo pipefail
W=${W:-.venv/bin/workbench}
OUT=docs/notebook_runs
rm -rf "$OUT" && mkdir -p "$OUT"
$W sol --model tiny --n_prompts 6 --gen_len 32 --block_lengths "[4,8,16]" --budget 500 --device cpu \
  --out_dir "$OUT/sol" --progress_bar false
$W leaderboard --model tiny --n_prompts 4 --gen_len 32 --block_lengths "[8]" --thresholds "[0.5,0.9]" --device cpu \
  --sol_budget 500 --out_dir "$OUT/leaderboard" --progress_bar false
$W drafter ablation --train_config workbench/configs/lora_tiny.yaml --max_steps 10 --n_prompts 4 --gen_len 32 \
  --device cpu --out_dir "$OUT/lora_ablation" --progress_bar false
# keep what the notebooks read (tables, logs, metrics), not the checkpoints or the adapters (whose configs name this
# machine's paths)
find "$OUT" \( -name "*.ckpt" -o -name "*.safetensors" -o -name "*.lock" \) -delete
find "$OUT" -type d -name adapter -prune -exec rm -rf {} +
find "$OUT" -type d -empty -delete
du -sh "$OUT"
