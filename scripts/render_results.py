"""Render the README's headline table from the results table (``benchmarks/results.jsonl``).

    python scripts/render_results.py            # rewrite the block between the README's headline markers
    python scripts/render_results.py --check    # exit 1 if the README's block is not what the table gives

The block is :func:`workbench.results.headline_markdown` of the table's current figures (the latest line of each
key) for :data:`HEADLINE_MODEL`; ``tests/test_docs.py`` checks that the README holds exactly that.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.results import RESULTS_TABLE, headline_markdown, load_results  # noqa: E402

README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
#: The model whose leaderboard figures make the headline (the demo's).
HEADLINE_MODEL = "smollm2-135m-trimode"


def render(readme: str, table: Path = RESULTS_TABLE) -> str:
    """``readme`` with the headline block replaced by the table's rendering. Raises ``ValueError`` when the markers
    are missing."""
    if START not in readme or END not in readme:
        raise ValueError(f"README has no {START} … {END} block")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{headline_markdown(load_results(table), HEADLINE_MODEL)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the README's headline is not the table's")
    args = ap.parse_args(argv)
    old = README.read_text()
    new = render(old)
    if args.check:
        if new != old:
            print("README.md's headline table differs from benchmarks/results.jsonl; run python "
                  "scripts/render_results.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
