"""``workbench deer teacher|eval``: DEER teacher data and DEER decoding evaluation (arXiv:2512.15176 §3–4).

Training is ``workbench train deer --stage 1|2 --config <yaml>`` (:mod:`workbench.deer.train`).
"""
from __future__ import annotations

import sys

USAGE = """usage: workbench deer <command> --config <yaml> [--field value ...]

commands:
  teacher   the AR target answers train-split prompts; Parquet chunks (resumable)
  eval      DEER vs AR (speedup, τ, acceptance distribution), Stage I vs II, α sweep, vs linear SS
  retrain   reproduce a shipped drafter from the commands recorded in its shipped.json (resumable)"""


def _eval(argv: list[str]) -> int:
    import pandas as pd

    from ..cli_args import parse_dataclass
    from .evaluate import DeerEvalConfig, run_deer_eval

    cfg = parse_dataclass("workbench deer eval", DeerEvalConfig, argv)
    out = run_deer_eval(cfg)
    table = pd.read_parquet(out / "by_category.parquet")
    cols = ["method", "tau", "max_accepted", "share_accept_ge8", "tpf_real", "tpf_cost", "speedup", "agree_ar"]
    print(table[table["category"] == "all"][cols].to_string(index=False))
    print(f"results: {out}")
    return 0


def main(argv: list[str]) -> int:
    """Dispatch ``workbench deer <command>``; exit status 2 with the usage for an unknown command."""
    from . import retrain, teacher

    commands = {"teacher": teacher.main, "eval": _eval, "retrain": retrain.main}
    if not argv or argv[0] not in commands:
        print(USAGE, file=sys.stderr)
        return 2
    return int(commands[argv[0]](argv[1:]) or 0)
