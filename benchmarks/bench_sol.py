"""SOL speed: batched (many blocks in lockstep per forward) vs one block state per forward on the same
blocks (target ≥ 5× on a 2-core CPU), and SOL wall time per block at B = 32. One JSON line."""
from __future__ import annotations

import argparse
import json
import time

import torch

from workbench.corpus import by_split, load_corpus
from workbench.evaluation.harness import load_model
from workbench.evaluation.prompts import make_prompts
from workbench.sol.runner import run_sol


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--n_prompts", type=int, default=16)
    ap.add_argument("--block_length", type=int, default=32)
    ap.add_argument("--n_blocks", type=int, default=1)
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    model, tok, _ = load_model(a.model, "cpu")
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, 192, a.n_blocks * a.block_length)
    ids = [list(p.prompt) for p in prompts]
    res = {}
    for name, rows in (("batched", 256), ("one_at_a_time", 1)):
        t0 = time.perf_counter()
        recs = run_sol(model, ids, a.block_length, a.n_blocks, tok.pad_token_id, max_rows=rows, precision=a.precision)
        res[name] = (time.perf_counter() - t0, recs)
    same = all(torch.equal(x["target"], y["target"]) and x["sol_forwards"] == y["sol_forwards"]
               for x, y in zip(res["batched"][1], res["one_at_a_time"][1]))
    n_blocks = len(res["batched"][1])
    print(json.dumps({"benchmark": "sol_batching", "block_length": a.block_length, "blocks": n_blocks,
                      "batched_s": round(res["batched"][0], 2), "one_at_a_time_s": round(res["one_at_a_time"][0], 2),
                      "speedup": round(res["one_at_a_time"][0] / res["batched"][0], 2), "target": ">= 5",
                      "batched_s_per_block": round(res["batched"][0] / n_blocks, 3), "identical_results": same,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
