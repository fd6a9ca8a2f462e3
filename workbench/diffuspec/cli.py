"""``workbench diffuspec proxy|eval|tune``: DiffuSpec's n-gram proxy, ablation table and ADL sweep."""
from __future__ import annotations

import sys

USAGE = """usage: workbench diffuspec <command> [--field value ...]

commands:
  proxy   build CPS's causal 3-gram proxy (Kneser-Ney, kenlm) on the train split
  eval    ablation table: argmax, +CPS, +ADL, both, fixed lengths; MAT, TPF, speed-up vs AR greedy
  tune    Optuna sweep of ADL's k_min, k_max and delta on validation prompts"""


def main(argv: list[str]) -> int:
    """Dispatch ``workbench diffuspec <command>``; exit status 2 with the usage for an unknown command."""
    import importlib

    commands = {"proxy": "proxy", "eval": "evaluate", "tune": "tune"}
    if not argv or argv[0] not in commands:
        print(USAGE, file=sys.stderr)
        return 2
    module = importlib.import_module(f"workbench.diffuspec.{commands[argv[0]]}")
    return int(module.main(argv[1:]) or 0)
