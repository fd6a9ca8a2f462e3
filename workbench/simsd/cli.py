"""``workbench simsd precision``: SimSD's verification approximation, measured (arXiv:2606.02544 §4.3). Decoding is
``workbench decode --policy simsd`` and a ``simsd`` row of ``workbench leaderboard``."""
from __future__ import annotations

import sys

USAGE = """usage: workbench simsd <command> [--field value ...]

commands:
  precision   per draft step: max logit deviation, KL and top-1 agreement of the one-forward verification
              against sequential denoising, with and without the RoPE copy"""


def main(argv: list[str]) -> int:
    """Dispatch ``workbench simsd <command>``; exit status 2 with the usage for an unknown command."""
    if not argv or argv[0] != "precision":
        print(USAGE, file=sys.stderr)
        return 2
    from .precision import main as precision

    return precision(argv[1:])
