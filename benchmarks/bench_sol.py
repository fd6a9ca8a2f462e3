"""SOL speed: batched (many blocks in lockstep per forward) vs one block state per forward on the same
blocks (target ≥ 5× on a 2-core CPU), and SOL wall time per block at B = 32. One JSON line.

Also prints the model-forward part of that ceiling: the cost of one block-state forward alone vs its
share of a forward over 4 / 16 / 64 states (same prefixes). The rest of any speed-up comes from
amortising per-forward Python work (scheduler, softmax, cache assembly) over many states.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from workbench.corpus import by_split, load_corpus
from workbench.model.load import load_model
from workbench.evaluation.prompts import make_prompts
from workbench.sol.bank import PrefixBank
from workbench.sol.runner import run_sol


def forward_ceiling(model, ids: list[list[int]], block_length: int, pad_id: int, precision: str,
                    widths=(4, 16, 64)) -> dict:
    """Milliseconds per block state with one state per forward and with ``widths`` states per forward;
    ``batching_ceiling`` = alone / best batched."""
    bank = PrefixBank(model, ids, block_length, pad_id, precision)
    ms = {}
    for r in (1, *widths):
        idx = torch.arange(r) % len(ids)
        states = torch.full((r, block_length), model.mask_token_id)
        bank.evaluate(idx, states)                      # warm-up
        reps = max(3, 128 // r)
        t0 = time.perf_counter()
        for _ in range(reps):
            bank.evaluate(idx, states)
        ms[r] = (time.perf_counter() - t0) / reps / r * 1000
    best = min(ms[r] for r in widths)
    return {"ms_per_state_by_width": {r: round(v, 2) for r, v in ms.items()},
            "batching_ceiling": round(ms[1] / best, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--n_prompts", type=int, default=32)
    ap.add_argument("--block_length", type=int, default=32)
    ap.add_argument("--n_blocks", type=int, default=1)
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    model, tok, _ = load_model(a.model, "cpu")
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, 192, a.n_blocks * a.block_length, tok)
    ids = [list(p.prompt) for p in prompts]
    res = {}
    for name, rows, spec in (("batched", 256, False), ("batched_speculative", 256, True), ("one_at_a_time", 1, False)):
        t0 = time.perf_counter()
        recs = run_sol(model, ids, a.block_length, a.n_blocks, tok.pad_token_id, max_rows=rows, precision=a.precision,
                       speculative_checks=spec)
        res[name] = (time.perf_counter() - t0, recs)
    same = all(torch.equal(x["target"], y["target"]) and x["sol_forwards"] == y["sol_forwards"]
               and x["sim_forwards"] == y["sim_forwards"]
               for name in ("batched", "batched_speculative")
               for x, y in zip(res[name][1], res["one_at_a_time"][1]))
    n_blocks = len(res["batched"][1])
    print(json.dumps({"benchmark": "sol_batching", "block_length": a.block_length, "blocks": n_blocks,
                      "batched_s": round(res["batched"][0], 2), "one_at_a_time_s": round(res["one_at_a_time"][0], 2),
                      "batched_speculative_s": round(res["batched_speculative"][0], 2),
                      "speedup": round(res["one_at_a_time"][0] / res["batched"][0], 2),
                      "speedup_speculative": round(res["one_at_a_time"][0] / res["batched_speculative"][0], 2),
                      "target": ">= 5",
                      "batched_s_per_block": round(res["batched"][0] / n_blocks, 3), "identical_results": same,
                      "threads": torch.get_num_threads(), "precision": a.precision,
                      **forward_ceiling(model, ids, a.block_length, tok.pad_token_id, a.precision)}))


if __name__ == "__main__":
    main()
