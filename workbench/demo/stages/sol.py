"""Demo stage: the speed-of-light analysis (NLD §4) on held-out prompts, with its table and figures."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...evaluation.report import markdown_table
from ..config import DemoConfig, sol_config


def run(cfg: DemoConfig, model, tok, run: Path, adapter: str | None = None, sol_cache: dict | None = None) -> dict:
    """Run the SOL analysis into ``run/sol``; its searches go into ``sol_cache`` for the leaderboard's ceilings."""
    from ...sol.run import run_sol_eval

    r = run_sol_eval(sol_config(cfg, str(run / "sol"), adapter), model, tok, sol_cache)
    b_max = max(cfg.sol_block_lengths)
    cat = r["summary"][r["summary"]["block_length"] == b_max]
    return {"overall": r["overall"].to_dict(orient="records"), "by_category": cat.to_dict(orient="records"),
            "wall_s": r["wall_s"], "block_length_max": b_max, "n_prompts": cfg.sol_prompts, "gen_len": cfg.sol_gen_len}


def section(st: dict) -> list[str]:
    cols = ["block_length", "blocks", "sol_acceptance", "sol_real_tpf", "greedy_acceptance", "greedy_exact_rate",
            "confidence_tpf", "sol_over_confidence", "linear_ss_acceptance", "linear_ss_real_tpf",
            "linear_ss_lora_acceptance", "forced_commits_per_block", "budget_hits_per_block", "token_acc"]
    cols = [c for c in cols if c in pd.DataFrame(st["overall"])]
    return ["## Speed of light (NLD §4, Table 4 / Fig. 7 analogue)", "",
            f"{st['n_prompts']} held-out prompts, {st['gen_len']} tokens each, decoded block by block; the serial target "
            "(k = 1) of each block is the sequence reproduced and becomes the next block's context. SOL = recursive "
            "dynamic compaction (depth 1, 5000 simulation forwards per block); greedy = NLD's greedy acceptance, "
            "a lower-bound proxy (commit every argmax matching the target; when none matches, the most confident "
            "position's argmax, after which the block no longer reproduces the target: `greedy_exact_rate`); "
            "confidence = τ = 0.9 on the same blocks; linear SS = greedy linear "
            "self-speculation with draft length k = B, free-running from the same prompts, so scored on its own output, the "
            "AR-greedy continuation, as SOL is on the serial target (τ = tokens per cycle, real TPF with its two "
            "forwards per cycle; `_lora` with the demo's LoRA drafter). `token_acc` = the serial "
            "target's agreement with the real continuation. Results in `sol/`.", "",
            markdown_table(pd.DataFrame(st["overall"]), cols), "",
            "![SOL vs B](sol/sol_vs_B.png)", "", f"Per category at B = {st['block_length_max']}:", "",
            markdown_table(pd.DataFrame(st["by_category"]).sort_values("sol_acceptance"),
                           ["category", "blocks", "sol_acceptance", "sol_real_tpf", "greedy_acceptance", "confidence_tpf"]),
            "", "![SOL by category](sol/sol_by_category.png)", ""]
