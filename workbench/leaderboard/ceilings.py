"""The two SOL ceilings on the leaderboard's own prompts (NLD §4.1), free-running.

* **SOL(serial)**: the search of ``workbench sol``: each block's target is the serial target, which becomes the
  next block's context. The ceiling of the diffusion decoders (confidence, sampler).
* **SOL(AR greedy)**: the same search with AR greedy's continuation as the target (block ``b`` of it is the
  target, the blocks before it the context): the tokens per forward recursive dynamic compaction (NLD's SOL
  scheme, a search, not an exhaustive optimum) reaches while reproducing AR greedy. The ceiling of the lossless
  speculative decoders. Where no position's argmax matches that target, the search forces the target's token
  in; ``forced_per_block`` counts those commits.

Each is reported per B as acceptance = Σ B ÷ Σ SOL (recursive dynamic compaction) forwards, with NLD §4.1's
greedy acceptance beside it (a lower-bound proxy; ``greedy_exact``: the share of blocks it reproduced exactly).
"""
from __future__ import annotations

import pandas as pd

from ..sol.runner import run_sol


def sol_ceilings(model, prompts: list[list[int]], lengths: list[int], gen_len: int, pad_id: int,
                 ar_tokens: list[list[int]] | None, precision: str, budget: int = 5000,
                 progress_bar: bool = True, cache: dict | None = None) -> pd.DataFrame:
    """One row per (ceiling, B): ``ceiling`` ('serial' or 'ar_greedy'), ``block_length``, ``sol`` (acceptance),
    ``greedy`` (greedy acceptance), ``greedy_exact`` (share of blocks greedy acceptance reproduced),
    ``forced_per_block`` (compaction's forced commits per block), ``blocks``. ``ar_tokens``: AR greedy's ``gen_len`` tokens per prompt
    (None: SOL(AR greedy) is skipped). ``cache``: shared searches (:func:`~workbench.sol.runner.run_sol`)."""
    from tqdm.auto import tqdm

    rows = []
    n_runs = len(lengths) * (2 if ar_tokens is not None else 1)
    bar = tqdm(total=n_runs * len(prompts) * gen_len, desc="SOL ceilings", unit="tok", disable=not progress_bar)
    for b in lengths:
        n_blocks = gen_len // b
        runs = {"serial": None}
        if ar_tokens is not None:
            runs["ar_greedy"] = [list(t[:n_blocks * b]) for t in ar_tokens]
        for name, targets in runs.items():
            if targets is not None and any(len(t) < n_blocks * b for t in targets):
                continue                         # AR greedy stopped early (EOS): not a full target
            bar.set_postfix_str(f"{name} B={b}")
            recs = run_sol(model, prompts, b, n_blocks, pad_id, budget=budget, precision=precision, targets=targets,
                           progress=lambda k, b=b, base=bar.n: bar.update(base + k * b - bar.n), cache=cache)
            blocks = sum(1 for _ in recs)
            rows.append({"ceiling": name, "block_length": b, "blocks": blocks,
                         "sol": b * blocks / sum(r["sol_forwards"] for r in recs),
                         "greedy": b * blocks / sum(r["greedy_forwards"] for r in recs),
                         "greedy_exact": sum(r["greedy_exact"] for r in recs) / blocks,
                         "forced_per_block": sum(r["forced_commits"] for r in recs) / blocks})
    bar.close()
    return pd.DataFrame(rows)


__all__ = ["sol_ceilings"]
