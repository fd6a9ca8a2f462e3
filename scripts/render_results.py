"""Render the README's headline table and the results pages from the results table (``benchmarks/results.jsonl``).

    python scripts/render_results.py            # rewrite the README's two blocks and docs/results/<name>.md
    python scripts/render_results.py --check    # exit 1 if the README's block or a page is not what the table gives

The headline block is :func:`workbench.results.headline_markdown` of the table's current figures (the latest line
of each key) for :data:`HEADLINE_MODEL`, the HumanEval block :func:`workbench.results.task_markdown`; ``tests/test_docs.py`` checks that the README holds exactly that. The pages are
:func:`workbench.results_pages.results_pages` (one per model, the benchmark figures, the methodology), written to
:data:`PAGES_DIR`; ``tests/test_results_pages.py`` checks them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.results import RESULTS_TABLE, headline_markdown, load_results, task_markdown  # noqa: E402
from workbench.results_pages import results_pages  # noqa: E402

README = ROOT / "README.md"
START, END = "<!-- headline:start -->", "<!-- headline:end -->"
#: The README's HumanEval table (:func:`workbench.results.task_markdown`).
TASK_START, TASK_END = "<!-- humaneval:start -->", "<!-- humaneval:end -->"
#: The model whose leaderboard figures make the headline (the demo's).
HEADLINE_MODEL = "smollm2-135m-trimode"
#: Where the results pages are written (one ``<name>.md`` per page; the folder holds nothing else).
PAGES_DIR = ROOT / "docs" / "results"


def render(readme: str, table: Path = RESULTS_TABLE) -> str:
    """``readme`` with the headline block and the HumanEval block replaced by the table's renderings. Raises
    ``ValueError`` when a block's markers are missing."""
    rows = load_results(table)
    for start, end, text in ((START, END, lambda: headline_markdown(rows, HEADLINE_MODEL)),
                             (TASK_START, TASK_END, lambda: task_markdown(rows, "humaneval", subsets=False))):
        if start not in readme or end not in readme:
            raise ValueError(f"README has no {start} … {end} block")
        head, rest = readme.split(start, 1)
        _, tail = rest.split(end, 1)
        readme = f"{head}{start}\n{text()}\n{end}{tail}"
    return readme


def pages(table: Path = RESULTS_TABLE) -> dict[str, str]:
    """The results pages of the table, ``{file name: text}`` (``<name>.md``)."""
    return {f"{name}.md": text for name, text in results_pages(load_results(table)).items()}


def stale_pages(out_dir: Path = PAGES_DIR, table: Path = RESULTS_TABLE) -> list[str]:
    """The pages of ``out_dir`` that differ from the table's rendering, are missing, or are no longer rendered."""
    want = pages(table)
    have = {p.name for p in out_dir.glob("*.md")} if out_dir.is_dir() else set()
    bad = [n for n, text in want.items() if not (out_dir / n).is_file() or (out_dir / n).read_text() != text]
    return sorted(bad + sorted(have - set(want)))


def write_pages(out_dir: Path = PAGES_DIR, table: Path = RESULTS_TABLE) -> None:
    """Write the table's pages to ``out_dir`` and remove pages it no longer renders."""
    want = pages(table)
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in out_dir.glob("*.md"):
        if p.name not in want:
            p.unlink()
    for name, text in want.items():
        if not (out_dir / name).is_file() or (out_dir / name).read_text() != text:
            (out_dir / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the README's headline or a results page is not the table's")
    args = ap.parse_args(argv)
    old = README.read_text()
    new = render(old)
    if args.check:
        rc = 0
        if new != old:
            print("README.md's headline table differs from benchmarks/results.jsonl; run python "
                  "scripts/render_results.py", file=sys.stderr)
            rc = 1
        stale = stale_pages()
        if stale:
            print(f"results pages differ from benchmarks/results.jsonl ({', '.join(stale)} in "
                  f"{PAGES_DIR.relative_to(ROOT)}); run python scripts/render_results.py", file=sys.stderr)
            rc = 1
        return rc
    README.write_text(new)
    write_pages()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
