"""Results pages: the results table (``benchmarks/results.jsonl``) rendered as Markdown pages for the docs site.

:func:`results_pages` gives, from the table's current figures (:func:`~workbench.results.latest`), one page per model
(the second part of a ``leaderboard/<model>/…`` or ``results/<model>/…`` key), a ``bench`` page for the benchmark
scripts' figures (``bench/…`` keys, possibly empty) and a ``methodology`` page (the machines seen in the table, how
figures are keyed and appended, how to rerun one, and the measured run-to-run spread). Each figure is one table row:
figure, metric, value, unit, target, adapter, setting, command, date / commit, every cell under
:data:`MAX_CELL` characters. ``scripts/render_results.py`` writes the pages to ``docs/results/<name>.md`` and
``--check`` compares them; a test keeps the pages on disk equal to what this module renders.
"""
from __future__ import annotations

from workbench.results import FIELDS, latest

#: The longest a table cell may be (characters); longer text is cut with ``…``.
MAX_CELL = 199
#: Pages rendered whether or not the table has figures for them, in this order after the model pages.
FIXED_PAGES = ("bench", "methodology")
#: Section titles of the model pages, by the first part of a key.
SECTIONS = {"leaderboard": "Leaderboard figures (written by `workbench leaderboard` / the demo)",
            "results": "Measured figures (migrated from the tables of the results page)"}
#: Run-to-run spread measured outside the table (``benchmarks/RESULTS.md``), quoted on the methodology page.
MEASURED_SPREAD = (
    "`make demo` wall time, six clean-clone runs with the leg-7 tiny model (`benchmarks/RESULTS.md`): "
    "`workbench demo` 561 s, 474 s, 476 s, 521 s, 522 s and 549 s in-process (474–561 s, a range of 87 s, "
    "about ±8 % around the middle); `make demo` 10 min 33 s, 8 min 56 s, 8 min 56 s, 9 min 45 s, 9 min 51 s and "
    "10 min 15 s including the fresh environment set-up; two clean clones of commit 4a46f63: 642 s and "
    "657 s in-process. On the real model the demo's stages have run 1.3–2× slower on one machine from one period "
    "to another: compare wall-clock figures measured on the same machine and day.")


def page_of(key: str) -> str:
    """The page a figure's ``key`` belongs on: ``bench`` for ``bench/…``, else the key's second part (the model)."""
    parts = key.split("/")
    if parts[0] == "bench" or len(parts) < 2:
        return "bench"
    return parts[1]


def _cut(text: str, limit: int = MAX_CELL) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _cell(text) -> str:
    return _cut("" if text is None else text).replace("|", "\\|")


def _code(text) -> str:
    if not text:
        return ""
    return "`" + _cut(str(text).replace("`", "'"), MAX_CELL - 2).replace("|", "\\|") + "`"


def format_value(value) -> str:
    """A figure's value as a cell: ``yes`` / ``no`` for booleans, up to 6 significant digits for numbers."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, ".6g")
    return _cell(value)


def _figure_name(key: str, metric: str) -> str:
    parts = key.split("/")
    rest = parts[2:] if parts[0] != "bench" else parts[1:]
    if rest and rest[-1] == metric:
        rest = rest[:-1]
    return "/".join(rest) or metric


def _stamp(row: dict) -> str:
    commit = row.get("commit")
    return _cell(f"{row.get('date') or '?'}, {commit}" if commit else (row.get("date") or "?"))


def _adapter(row: dict, page: str) -> str:
    model, adapter = row.get("model"), row.get("adapter")
    text = adapter or ""
    if model and model != page:
        text = f"{model}: {adapter}" if adapter else model
    return _cell(text)


HEADER = ("| figure | metric | value | unit | target | adapter | setting | command | date, commit |\n"
          "|---|---|---|---|---|---|---|---|---|")


def figure_row(row: dict, page: str) -> str:
    """One figure as a Markdown table row (see :data:`HEADER`)."""
    cells = [_code(_figure_name(row["key"], row["metric"])), _code(row["metric"]), format_value(row["value"]),
             _cell(row.get("unit")), _cell(row.get("target")), _adapter(row, page), _cell(row.get("setting")),
             _code(row.get("command")), _stamp(row)]
    return "| " + " | ".join(cells) + " |"


def _machine_text(m) -> str:
    if not isinstance(m, dict):
        return "not recorded"
    bits = [m.get("cpu") or "no CPU recorded"]
    if m.get("cores"):
        bits.append(f"{m['cores']} cores")
    if m.get("gpu"):
        bits.append(f"GPU {m['gpu']}")
    return ", ".join(bits)


def _footer() -> list[str]:
    return ["", "Generated from `benchmarks/results.jsonl` by `python scripts/render_results.py` (each figure's "
            "latest line); edit the table, not this page.", ""]


def model_page(name: str, rows: list[dict]) -> str:
    """The page of one model (or ``bench``): its current figures, one table per key family."""
    title = "Benchmark figures" if name == "bench" else f"Results: `{name}`"
    lines = [f"# {title}", ""]
    if name == "bench":
        lines += ["Figures the benchmark scripts append (`python benchmarks/run_all.py --results_table "
                  "benchmarks/results.jsonl`), keyed `bench/<script>/<setting>/<metric>`.", ""]
    else:
        lines += [f"The current figures of `{name}` in the results table, {len(rows)} in all; each row names the "
                  "command that measured it.", ""]
    if not rows:
        lines += ["The table holds no such figure yet."]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["key"].split("/")[0], []).append(r)
    for family, members in groups.items():
        if len(groups) > 1 or family in SECTIONS:
            lines += [f"## {SECTIONS.get(family, family)}", ""]
        lines += [HEADER, *(figure_row(r, name) for r in members), ""]
    return "\n".join(lines).rstrip("\n") + "\n" + "\n".join(_footer())


def methodology_page(current: dict[str, dict]) -> str:
    """The methodology page: machines, keys, appending, rerunning, the run-to-run spread."""
    machines: dict[str, int] = {}
    for r in current.values():
        t = _machine_text(r.get("machine"))
        machines[t] = machines.get(t, 0) + 1
    lines = ["# Results methodology", "",
             "## The table", "",
             "Every measured figure is one line of `benchmarks/results.jsonl` (JSON lines) with the fields "
             + ", ".join(f"`{f}`" for f in FIELDS) + ". Keys name a figure: "
             "`leaderboard/<model>/<mode>/<decoder>/B<B>/t<τ>/<metric>` for the leaderboard's, "
             "`bench/<script>/<setting>/<metric>` for the benchmark scripts', and "
             "`results/<model>/<figure>/<metric>` for the figures of the results page's tables. The table is only "
             "ever appended to (`workbench.results.append_results`, one whole line per write): the latest line of a "
             "key is its current value and the earlier lines are its history. The pages of this section and the "
             "README's headline table are rendered from the current values (`python scripts/render_results.py`; "
             "`--check` fails when a page differs from the table).", "",
             "## Machines seen in the table", "",
             "| machine | current figures |", "|---|---|"]
    lines += [f"| {_cell(m)} | {n} |" for m, n in sorted(machines.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += ["", "## Rerunning a figure", "",
              "Each figure's `command` field is the command that measured it, and `setting` says the prompts, "
              "tokens, precision and machine; `commit` (where recorded) is the code it ran. Rerun the command on "
              "the same kind of machine and append the new figures: `workbench leaderboard --results_table "
              "benchmarks/results.jsonl` and `python benchmarks/run_all.py --results_table "
              "benchmarks/results.jsonl` do so themselves. A changed figure then becomes the current one, and "
              "`python scripts/render_results.py` re-renders the pages.", "",
              "## Run-to-run spread", "",
              "Wall-clock figures on the shared 2-core CPU machines move between runs more than token counts do "
              "(tokens per forward, acceptance and agreement are not timed).", "", f"- {MEASURED_SPREAD}"]
    for r in current.values():
        if "spread" in r["metric"]:
            lines.append(f"- `{r['key']}`: {format_value(r['value'])} {r.get('unit') or ''} ({_cut(r.get('setting') or '', 150)}; "
                         f"`{_cut(r.get('command') or '', 150)}`)")
    return "\n".join(lines) + "\n" + "\n".join(_footer())


def results_pages(rows: list[dict]) -> dict[str, str]:
    """The results pages, ``{name: markdown}``, from the table's lines ``rows`` (their current figures): one page
    per model in the table's order of first appearance, then :data:`FIXED_PAGES`."""
    current = latest(rows)
    by_page: dict[str, list[dict]] = {}
    for key, row in current.items():
        by_page.setdefault(page_of(key), []).append(row)
    pages = {name: model_page(name, members) for name, members in by_page.items() if name not in FIXED_PAGES}
    pages["bench"] = model_page("bench", by_page.get("bench", []))
    pages["methodology"] = methodology_page(current)
    return pages


__all__ = ["MAX_CELL", "FIXED_PAGES", "MEASURED_SPREAD", "page_of", "format_value", "figure_row", "model_page",
           "methodology_page", "results_pages"]
