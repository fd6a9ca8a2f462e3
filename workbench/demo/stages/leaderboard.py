"""Demo stage: the leaderboard (``workbench leaderboard``) of every registered decoder on held-out prompts, with
the demo's own sampler, LoRA adapter and DEER drafter, against SOL(serial) and SOL(AR greedy): the report's
headline table."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...evaluation.report import markdown_table
from ..config import DemoConfig, leaderboard_config

#: Columns of the report's headline table.
HEADLINE_COLUMNS = ["decoder", "block_length", "threshold", "tpf", "cost_tpf", "tau", "speedup", "agree_ar",
                    "lossless", "agree_serial", "repetition", "ceiling", "distance"]


def run(cfg: DemoConfig, model_spec, model, tok, run_dir: Path, adapter: str | None, sampler: str | None,
        drafter: str | None, decode_cache: dict | None = None, sol_cache: dict | None = None) -> dict:
    """Run the leaderboard into ``run_dir/leaderboard`` (fp32, so that lossless decoders are exact). Runs of the
    demo's sweep in ``decode_cache`` (same prompts, precision and batch size: ``--leaderboard_prompts`` and
    ``--leaderboard_gen_len`` equal to ``--n_prompts`` and ``--gen_len``, and ``--precision`` resolving to
    ``--leaderboard_precision``) are reused, not decoded again, with their decode time, and so are
    the SOL stage's searches in ``sol_cache`` for the ceilings (same prompts: ``--sol_prompts``, ``--sol_gen_len``)."""
    from ...leaderboard.run import run_leaderboard

    lcfg = leaderboard_config(cfg, model_spec, str(run_dir / "leaderboard"), sampler, drafter, adapter)
    df, out = run_leaderboard(lcfg, model, tok, decode_cache, sol_cache)
    ceilings = pd.read_parquet(out / "ceilings.parquet")
    return {"rows": df.to_dict(orient="records"), "ceilings": ceilings.to_dict(orient="records"),
            "n_prompts": cfg.leaderboard_prompts, "gen_len": cfg.leaderboard_gen_len,
            "precision": cfg.leaderboard_precision}


def section(st: dict) -> list[str]:
    """The report's headline: the free-running leaderboard, then its ceilings (real-context rows in
    ``leaderboard/leaderboard.md``)."""
    df = pd.DataFrame(st["rows"])
    ok = df[df["status"] == "ok"]
    free = ok[ok["mode"] == "free"].sort_values(["block_length", "decoder", "threshold"])
    claims = ok[ok["claims_lossless"].astype(bool) & (ok["decoder"] != "ar_greedy")]
    broken = sorted(set(claims[claims["lossless"].map(lambda v: v is not True and v != 1)]["decoder"]))
    lossless = ("every decoder that claims it is lossless" if not broken else
                "NOT every decoder that claims it is lossless: " + ", ".join(broken))
    lines = ["## Leaderboard: every decoder on the same prompts, against the SOL ceilings", "",
             f"{st['n_prompts']} held-out prompts × {st['gen_len']} tokens, {st['precision']}; free-running rows shown "
             "(real-context rows in [`leaderboard/leaderboard.md`](leaderboard/leaderboard.md)). tpf = tokens per "
             "target forward; cost_tpf = tokens per one-token-forward of FLOPs (AR = 1); tau = tokens per cycle, "
             "bonus counted; speedup = tokens/s over AR greedy in this process (a row reused from the evaluation "
             "sweep, on the same prompts, keeps the sweep's time); distance = tpf ÷ SOL(serial) for "
             f"diffusion decoders, ÷ SOL(AR greedy) for lossless speculative ones. In {st['precision']}, {lossless}.", "",
             markdown_table(free, [c for c in HEADLINE_COLUMNS if c in free]), "",
             "![leaderboard](leaderboard/leaderboard.png)", ""]
    if st["ceilings"]:
        lines += ["SOL ceilings on the same prompts (acceptance = B ÷ forwards; greedy = NLD §4.1's greedy acceptance):",
                  "", markdown_table(pd.DataFrame(st["ceilings"]), ["ceiling", "block_length", "sol", "greedy"]), ""]
    return lines
