#!/usr/bin/env bash
# Issue 24's GPU items, for a session that is lent a device machine (run from the repository root there):
#
#   tests     the gpu-marked tests: the compiled flex path against dense (logits and gradients), FSDP
#   bench     benchmarks/bench_attention.py on the GPU: dense, eager, sdpa_bool and flex at sequence 2048, small
#   train     one resumable leg of the `small` preset in bf16 on the flex path (workbench/configs/small_gpu.yaml),
#             LEG_TIME long (default 25 min); rerun to continue
#   collect   copy the leg's log, metrics and model to $OUT (the model only if it fits 50 MB)
#
# Each stage writes under $OUT when set, so the results come back with the run's files.
set -euo pipefail
STAGE=${1:?stage: tests | bench | train | collect}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/issue24_out}
LEG_TIME=${LEG_TIME:-00:00:25:00}
mkdir -p "$OUT"
case "$STAGE" in
  tests)
    $PY -m pytest -m gpu -q tests/test_attention_paths.py tests/test_distributed.py 2>&1 | tee "$OUT/gpu_tests.log" ;;
  bench)
    $PY benchmarks/bench_attention.py --seq 2048 --steps 5 --warmup 2 2>&1 | tee "$OUT/bench_attention_gpu.log" ;;
  train)
    $PY -m workbench.cli train lm --config workbench/configs/small_gpu.yaml --max_time "$LEG_TIME" \
      --progress_bar false 2>&1 | tee -a "$OUT/train_small.log" ;;
  collect)
    cp runs/train_small/metrics.json runs/train_small/config.yaml "$OUT/" 2>/dev/null || true
    cp runs/train_small/logs/version_0/metrics.csv "$OUT/train_small_metrics.csv" 2>/dev/null || true
    if [ -d runs/train_small/model ] && [ "$(du -sm runs/train_small/model | cut -f1)" -le 50 ]; then
      cp -r runs/train_small/model "$OUT/small_model"
    fi ;;
  *) echo "unknown stage $STAGE; valid: tests bench train collect" >&2; exit 2 ;;
esac
