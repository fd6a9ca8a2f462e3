"""Collection overhead: ``workbench collect`` wall time ÷ bare decoding wall time of the same policy on
the same trajectories (target ≤ 1.25: features, records and store writes cost at most a quarter on
top of the model). Both run in this process on the same work items, bare decoding first.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding.diffusion import diffusion_decode
from workbench.model.load import load_model
from workbench.evaluation.prompts import make_prompts
from workbench.trajectories.collect import CollectConfig, _rule, build_specs, run_collect


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
    cfg = CollectConfig(model=a.model, policy=a.policy, block_lengths=[a.block_length], n_prompts=a.n_prompts,
                        batch_size=a.batch_size, precision=a.precision, progress_bar=False, accelerator="cpu")
    prompts = make_prompts(by_split(load_corpus(cfg.corpus), cfg.split), cfg.n_prompts, cfg.context_len,
                           cfg.blocks_per_prompt * a.block_length)
    cats = sorted({p.category for p in prompts})
    specs = build_specs(prompts, cats, a.block_length, cfg.blocks_per_prompt, cfg.context_len)
    rule, sees = _rule(a.policy, cfg.threshold)
    t0 = time.perf_counter()
    for s in range(0, len(specs), a.batch_size):
        chunk = specs[s:s + a.batch_size]
        diffusion_decode(model, [list(x.context) for x in chunk], a.block_length, a.block_length, rule,
                         real_continuation=[list(x.truth) for x in chunk], pad_id=tok.pad_token_id,
                         precision=a.precision, rule_sees_truth=sees, commit_last_block=False)
    bare = time.perf_counter() - t0
    tmp = tempfile.mkdtemp()
    try:
        cfg.out = f"{tmp}/bench.zarr"
        r = run_collect(cfg)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = r["rows_written_total_this_run"]
    print(json.dumps({"benchmark": "collect_overhead", "policy": a.policy, "block_length": a.block_length,
                      "trajectories": len(specs), "rows": rows, "bare_decode_s": round(bare, 2),
                      "collect_s": round(r["wall_s"], 2), "store_write_s": round(r["write_s"], 2),
                      "ratio_collect_over_bare": round(r["wall_s"] / bare, 3), "rows_per_s": round(rows / r["wall_s"], 1),
                      "target": "<= 1.25", "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
