#!/usr/bin/env bash
# Issue 57 §6 on a lent GPU (never run yet; run from the repository root there, one stage per call):
#
#   make      a random-initialised checkpoint of NLD-3B's real shape (Ministral3: hidden 3072, 26 layers, 32 heads,
#             8 KV heads, head 128, MLP 9216, vocab 131072) in NLD's on-disk layout, bf16, at $CKPT (~6.5 GB)
#   collect   `workbench collect` on it at B = 32, batch $BATCH, bf16-true, one GPU: rows/s, wall, peak memory
#   bare      the same prompts decoded by the collect policy without collection (confidence τ = 0.9, B = 32,
#             batch $BATCH): the collection ÷ bare decoding ratio's denominator
#
# Targets (issue 57): collect ≥ 1,000 rows/s at B = 32 on one H200, collection ÷ bare decoding ≤ 1.25.
# Each stage writes its log and JSON under $OUT, so the figures come back with the run's files.
set -euo pipefail
STAGE=${1:?stage: make | collect | bare}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/issue57_out}
CKPT=${CKPT:-/tmp/nld3b}
BATCH=${BATCH:-32}
PROMPTS=${PROMPTS:-256}
mkdir -p "$OUT"
case "$STAGE" in
  make)
    $PY - <<PYEOF 2>&1 | tee "$OUT/make.log"
import time, torch
from workbench.model.families.fixtures import write_family_checkpoint
t = time.time()
write_family_checkpoint("nld", "$CKPT", vocab_size=131072, dtype=torch.bfloat16, sizes=dict(
    hidden_size=3072, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=262144))
print(f"written in {time.time() - t:.0f} s")
PYEOF
    $PY -m workbench.cli models inspect "$CKPT" | tee -a "$OUT/make.log" ;;
  collect)
    rm -rf /tmp/nld3b_store
    /usr/bin/time -v $PY -m workbench.cli collect --model "$CKPT" --out /tmp/nld3b_store --block_lengths "[32]" \
      --policy confidence --threshold 0.9 --n_prompts "$PROMPTS" --blocks_per_prompt 4 --context_len 256 --batch_size "$BATCH" --precision bf16-true \
      --accelerator gpu --devices 1 --progress_bar false 2>&1 | tee "$OUT/collect.log"
    $PY -m workbench.cli store info --store /tmp/nld3b_store 2>&1 | tee -a "$OUT/collect.log" ;;
  bare)
    $PY - <<PYEOF 2>&1 | tee "$OUT/bare.log"
import json, time, torch
from workbench.corpus import by_split, load_corpus
from workbench.decoding import get_policy
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model
model, tok, _ = load_model("$CKPT", "cuda", dtype=torch.bfloat16)
prompts = [list(p.prompt) for p in make_prompts(by_split(load_corpus("stdlib"), "train"), $PROMPTS, 256, 128, tok)]
torch.cuda.reset_peak_memory_stats()
t = time.time()
for i in range(0, len(prompts), $BATCH):
    get_policy("confidence")(model, prompts[i:i + $BATCH], 128, block_length=32, threshold=0.9,
                             pad_id=tok.pad_token_id or 0, precision="bf16-true")
torch.cuda.synchronize()
print(json.dumps({"bare_decode_s": time.time() - t, "prompts": len(prompts), "blocks_per_prompt": 4,
                  "peak_gib": torch.cuda.max_memory_allocated() / 2**30}))
PYEOF
    ;;
  *) echo "unknown stage $STAGE; valid: make collect bare" >&2; exit 2 ;;
esac
