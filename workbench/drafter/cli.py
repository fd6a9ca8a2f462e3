"""``workbench drafter``: LoRA drafter evaluation (NLD §3.3, Tab. 6).

* ``workbench drafter eval --adapters '[runs/lora_tiny/adapter]'``: linear self-speculation (greedy,
  k = 8 by default) with and without each adapter on held-out prompts, per category: τ, TPF, real TPF,
  max accepted, share of cycles accepting ≥ 8, accuracy metrics, tokens/s. Writes ``results.parquet``,
  ``summary.parquet``, ``gains.parquet``, ``report.md`` and ``config.json``.
* ``workbench drafter ablation --train_config workbench/configs/lora_tiny.yaml --losses '[lk_hybrid_ce, kl]'``:
  trains one adapter per loss variant (same steps, seed, data) into ``<out_dir>/<loss>/`` and evaluates
  them the same way; writes ``ablation.parquet`` and ``ablation.md`` next to the evaluation files.

Evaluation files are written into ``<out_dir>.partial`` (eval) or as ``*.partial`` files (ablation,
whose directory also holds the resumable training runs) and renamed when complete.
"""
from __future__ import annotations

import sys

from .config import AblationConfig, DrafterEvalConfig

SUBCOMMANDS = ("eval", "ablation")


def main(argv: list[str]) -> int:
    """``workbench drafter eval|ablation [options]``."""
    from ..cli_args import parse_dataclass

    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: workbench drafter {'|'.join(SUBCOMMANDS)} [options]", file=sys.stderr)
        return 2
    fmt = lambda x: f"{x:.3f}"  # noqa: E731
    from .commands import run_ablation, run_eval

    if argv[0] == "eval":
        r = run_eval(parse_dataclass("workbench drafter eval", DrafterEvalConfig, argv[1:]))
        g = r["gains"]
        print(g[g["category"] == "all"].to_string(index=False, float_format=fmt))
        print(f"results: {r['out_dir']} ({r['wall_s']:.0f} s)")
        return 0
    r = run_ablation(parse_dataclass("workbench drafter ablation", AblationConfig, argv[1:]))
    print(r["table"].to_string(index=False, float_format=fmt))
    print(f"ablation: {r['out_dir'] / 'ablation.md'}")
    return 0
