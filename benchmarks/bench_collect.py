"""Collection cost, measured in one process on the same work items:

- ``speedup_shared_prefix``: :func:`collect_item` decoding every block from its own prefilled context
  (``share_prefix=False``, the collector before 2026-11-26) ÷ the same items with each prompt prefilled once and its
  real blocks appended to the KV cache (``share_prefix=True``, the default);
- ``ratio_collect_over_bare``: ``workbench collect`` wall time ÷ bare decoding of the same chains without records
  (target ≤ 1.25: features, records and store writes cost at most a quarter on top of the model).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding.base import cast_for_precision
from workbench.decoding.diffusion import diffusion_decode
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model
from workbench.tokenizer import is_byte_tokenizer
from workbench.trajectories.collect import CollectConfig, _rule, build_specs, collect_item, prompt_chains, run_collect


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--policy", default="serial")
    ap.add_argument("--block_length", type=int, default=32)
    ap.add_argument("--n_prompts", type=int, default=32)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--precision", default="bf16")
    a = ap.parse_args()
    model, tok, _ = load_model(a.model, "cpu")
    cast_for_precision(model, a.precision)
    cfg = CollectConfig(model=a.model, policy=a.policy, block_lengths=[a.block_length], n_prompts=a.n_prompts,
                        batch_size=a.batch_size, precision=a.precision, progress_bar=False, accelerator="cpu")
    enc = None if is_byte_tokenizer(tok) else tok
    prompts = make_prompts(by_split(load_corpus(cfg.corpus), cfg.split), cfg.n_prompts, cfg.context_len,
                           cfg.blocks_per_prompt * a.block_length, enc)
    specs = build_specs(prompts, sorted({p.category for p in prompts}), a.block_length, cfg.blocks_per_prompt,
                        cfg.context_len)
    items = [specs[s:s + a.batch_size] for s in range(0, len(specs), a.batch_size)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rule, sees = _rule(a.policy, cfg.threshold)
    b = a.block_length
    collect_item(model, items[0][:2], a.policy, cfg.threshold, pad, a.precision)     # warm-up, not timed

    t0 = time.perf_counter()
    for item in items:                                      # bare decoding of the chains collect decodes
        chains = prompt_chains(item)
        for n in sorted({len(c) for c in chains}):
            group = [c for c in chains if len(c) == n]
            diffusion_decode(model, [list(item[c[0]].context) for c in group], n * b, b, rule,
                             real_continuation=[[t for i in c for t in item[i].truth] for c in group], pad_id=pad,
                             precision=a.precision, rule_sees_truth=sees, commit_last_block=False)
    bare = time.perf_counter() - t0
    timings = {}
    for share in (False, True):
        t0 = time.perf_counter()
        for item in items:
            collect_item(model, item, a.policy, cfg.threshold, pad, a.precision, share_prefix=share)
        timings[share] = time.perf_counter() - t0
    tmp = tempfile.mkdtemp()
    try:
        cfg.out = f"{tmp}/bench.zarr"
        r = run_collect(cfg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = r["rows_written_total_this_run"]
    print(json.dumps({"benchmark": "collect", "model": a.model, "policy": a.policy, "block_length": b,
                      "precision": a.precision, "trajectories": len(specs), "rows": rows,
                      "per_block_prefill_s": round(timings[False], 2), "shared_prefix_s": round(timings[True], 2),
                      "speedup_shared_prefix": round(timings[False] / timings[True], 3),
                      "bare_decode_s": round(bare, 2), "collect_s": round(r["wall_s"], 2),
                      "store_write_s": round(r["write_s"], 2), "ratio_collect_over_bare": round(r["wall_s"] / bare, 3),
                      "rows_per_s": round(rows / r["wall_s"], 1), "target_collect_over_bare": "<= 1.25",
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
