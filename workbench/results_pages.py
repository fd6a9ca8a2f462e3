"""Results pages: the results table (``benchmarks/results.jsonl``) rendered as Markdown pages for the docs site.

:func:`results_pages` gives, from the table's current figures (:func:`~workbench.results.latest`), one page per model
(the second part of a ``leaderboard/<model>/…`` or ``results/<model>/…`` key), a ``bench`` page for the benchmark
scripts' figures (``bench/…`` keys, possibly empty) and a ``methodology`` page (the provenance every figure carries,
what a target and a ceiling are, the machines seen in the table, how to rerun a figure, the measured run-to-run
spread). A page has one table per task (:func:`task_of`), with the task's setting, command and provenance above it;
a leaderboard task is one row per decoder (:func:`leaderboard_table`), with a note under the table for each row
above its ceiling (:data:`workbench.results.ABOVE_CEILING`). No cell is longer than :data:`MAX_CELL` characters.
``scripts/render_results.py`` writes the pages to ``docs/results/<name>.md`` and ``--check`` compares them; a test
keeps the pages on disk equal to what this module renders.
"""
from __future__ import annotations

from workbench.results import ABOVE_CEILING, FIELDS, above_ceiling, latest

#: The longest a table cell may be (characters); longer text is cut with ``…``.
MAX_CELL = 300
#: Pages rendered whether or not the table has figures for them, in this order after the model pages.
FIXED_PAGES = ("bench", "methodology")
#: Titles of the tasks of ``results/<model>/<group>/…`` keys, by group, in page order; groups of one task share a
#: title (and so a table).
TASKS = {
    "conversion": "Conversion (training)", "data_comparison": "Training data: stdlib text vs self-distillation",
    "lk_align": "LK-hybrid + CE alignment (NLD §3.3)", "ar_mode": "AR mode", "ss_linear": "Self-speculation",
    "ss_quadratic": "Self-speculation", "confidence": "Diffusion mode", "diffusion": "Diffusion mode",
    "held_out": "Held-out loss", "degeneration": "Free-running degeneration", "sol": "SOL",
    "introspective": "Introspective acceptance", "isd": "ISD (I-DLM)", "deer": "DEER", "diffuspec": "DiffuSpec",
    "simsd": "SimSD", "sampler": "Sampler", "leaderboard": "Leaderboard (demo)",
    "leaderboard_defaults": "Leaderboard (every default)", "wallclock": "Wall clock grid",
    "merged": "Wall clock, merged adapter", "merged_best_of_5": "Wall clock, merged adapter",
    "lm_head_index": "LM head on the last positions", "make_demo": "Demo wall time",
    "demo_wall_time": "Demo wall time", "bench_store": "Trajectory store", "kv_cache": "KV cache",
    "decode": "KV cache", "introspection": "Introspection forward", "noise_draw": "Noise draw (NLD Eq. 2)",
    "train_step": "Training step", "ddp": "Several devices (DDP)", "attention": "Attention paths",
    "families": "Model families", "faults": "Faults and bad input",
}
#: Titles of the leaderboard's context modes.
MODES = {"free": "Leaderboard, free-running", "real": "Leaderboard, real context"}
#: The ceiling each decoder is measured against (docs/concepts.md), for figure tables that list SOL figures beside
#: decoders' tokens per forward (``SOL(<ceiling>)/B<B>/sol`` next to ``<decoder>[_t<τ>]/B<B>/tpf``).
CEILING_OF = {"ss_linear": "ar_greedy", "ss_quadratic": "ar_greedy", "isd": "ar_greedy", "deer": "ar_greedy",
              "diffuspec": "ar_greedy", "confidence": "serial", "sampler": "serial", "simsd": "serial"}
#: Leaderboard metrics as table columns, in order, with their headers.
BOARD_COLUMNS = {"tpf": "tokens per forward", "speedup": "speed vs AR greedy", "lossless": "lossless",
                 "agree_serial": "agreement with serial", "ceiling_tpf": "ceiling", "pass@1": "pass@1",
                 "aup": "AUP", "tokens_per_s": "tokens/s"}
#: Run-to-run spread measured outside the table (the lab notebook), quoted on the methodology page.
MEASURED_SPREAD = (
    "`make demo` wall time, six clean-clone runs with the shipped tiny model (lab notebook): `workbench demo` "
    "474–561 s in-process (about ±8 % around the middle), `make demo` 8 min 56 s to 10 min 33 s with the "
    "environment's set-up. On the real model the demo's stages have run 1.3–2× slower on one machine from one period to another: compare "
    "wall-clock figures measured on the same machine and day.")
#: What the methodology page says a target and a ceiling are.
TARGETS_TEXT = (
    "A **target** is a goal the workbench set for its shipped models before measuring (the `target` field, e.g. "
    "`>= 2.5` tokens per cycle); it is not a paper's figure, and the pages say where a figure misses it. A "
    "**ceiling** is the SOL a decoder is measured against (SOL(serial) for the diffusion decoders, SOL(AR greedy) "
    "for the lossless ones; docs/concepts.md); a row above its ceiling carries a note saying why.")


def page_of(key: str) -> str:
    """The page a figure's ``key`` belongs on: ``bench`` for ``bench/…``, else the key's second part (the model)."""
    parts = key.split("/")
    if parts[0] == "bench" or len(parts) < 2:
        return "bench"
    return parts[1]


def task_of(key: str) -> str:
    """The task (one table of a page) a figure's ``key`` belongs to: the leaderboard's context mode (or task) for
    ``leaderboard/…``, the benchmark script for ``bench/…``, else the title of the key's group (:data:`TASKS`)."""
    parts = key.split("/")
    if parts[0] == "leaderboard":
        return MODES.get(parts[2], f"Leaderboard, {parts[2]}")
    if parts[0] == "bench":
        return parts[1]
    group = parts[2] if len(parts) > 2 else parts[-1]
    return TASKS.get(group, group.replace("_", " ").capitalize())


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


def _versions_text(v) -> str:
    if not isinstance(v, dict):
        return "versions not recorded"
    return ", ".join(f"{k} {v[k]}" for k in ("torch", "transformers", "workbench", "python") if v.get(k)) \
        or "versions not recorded"


def _machine_text(m) -> str:
    if not isinstance(m, dict):
        return "not recorded"
    bits = [m.get("cpu") or "no CPU recorded"]
    if m.get("cores"):
        bits.append(f"{m['cores']} cores")
    if m.get("gpu"):
        bits.append(f"GPU {m['gpu']}")
    return ", ".join(bits)


def _seed_text(seed) -> str:
    if seed is None:
        return ""
    return f"; seed {', '.join(map(str, seed))}" if isinstance(seed, list) else f"; seed {seed}"


def provenance_text(row: dict) -> str:
    """One line of a figure's provenance: date, commit, versions, seed, and whether it is carried over."""
    carried = " (carried over: [methodology](methodology.md#carried-over-figures))" if row.get("carried_over") else ""
    return (f"measured {row.get('date') or '?'} at commit {row.get('commit') or '?'}; "
            f"{_versions_text(row.get('versions'))}{_seed_text(row.get('seed'))}{carried}")


def _context(row: dict, page: str) -> tuple:
    model, adapter = row.get("model"), row.get("adapter")
    who = adapter or ""
    if model and model != page:
        who = f"{model}: {adapter}" if adapter and adapter != model else model
    return (row.get("setting") or "", who, _machine_text(row.get("machine")), row.get("command") or "",
            provenance_text(row))


_LABELS = ("", "", "Machine: ", "Command: ", "Provenance: ")


def _context_lines(ctx: tuple, keep: tuple[bool, ...] = (True,) * 5) -> str:
    """The setting paragraph of a context (setting, adapter, machine, command, provenance), the fields ``keep``
    selects."""
    setting, who, machine, command, prov = ctx
    head = "; ".join(b for b, k in ((setting, keep[0]), (who, keep[1])) if b and k)
    tail = [f"{label}{f'`{v}`' if i == 3 else v}" for i, (label, v) in enumerate(zip(_LABELS, ctx)) if i >= 2
            and keep[i] and v]
    return ". ".join([head] * bool(head) + tail) + "."


def _figure_name(key: str, metric: str, strip_group: bool = True) -> str:
    parts = key.split("/")
    rest = parts[3:] if parts[0] == "results" and strip_group else parts[2:]
    if rest and rest[-1] == metric:
        rest = rest[:-1]
    return "/".join(rest + [metric])


def _contexts_above(contexts: list[tuple]) -> list[str]:
    """The setting(s) above a table: one paragraph for one context; else what all share, then a numbered list of
    what differs."""
    if len(contexts) == 1:
        return [f"Setting: {_context_lines(contexts[0])}", ""]
    shared = tuple(all(c[i] == contexts[0][i] for c in contexts) for i in range(5))
    lines = []
    if any(shared):
        lines += [f"Common to every row: {_context_lines(contexts[0], shared)}", ""]
    differ = tuple(not s for s in shared)
    return lines + ["Settings:", "", *(f"{i}. {_context_lines(c, differ)}" for i, c in enumerate(contexts, 1)), ""]


def figure_table(rows: list[dict], page: str) -> list[str]:
    """One task's figures as Markdown: the setting(s) above, then ``| figure | value | unit | target |`` (and the
    setting's number when the task's figures have several)."""
    contexts: list[tuple] = []
    for r in rows:
        c = _context(r, page)
        if c not in contexts:
            contexts.append(c)
    several = len(contexts) > 1
    one_group = len({r["key"].split("/")[2] for r in rows if r["key"].count("/") >= 2}) <= 1
    head = "| figure | value | unit | target |" + (" setting |" if several else "")
    lines = _contexts_above(contexts) + [head, "|---|---|---|---|" + ("---|" if several else "")]
    for r in rows:
        cells = [_code(_figure_name(r["key"], r["metric"], one_group)), format_value(r["value"]), _cell(r.get("unit")),
                 _cell(r.get("target"))]
        if several:
            cells.append(str(contexts.index(_context(r, page)) + 1))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + _ceiling_notes(rows)


def _ceiling_notes(rows: list[dict]) -> list[str]:
    """Notes for the decoders whose ``tpf`` figure is above the ``SOL(…)`` figure of their ceiling in the same
    table (:data:`CEILING_OF`, :data:`workbench.results.ABOVE_CEILING`)."""
    sol, tpf = {}, {}
    for r in rows:
        parts = _figure_name(r["key"], r["metric"]).split("/")
        if len(parts) >= 3 and parts[0].startswith("SOL(") and _num(r["value"]) is not None:
            sol[(parts[0][4:-1], parts[1])] = float(r["value"])
        elif r["metric"] == "tpf" and len(parts) >= 3 and _num(r["value"]) is not None:
            tpf[(parts[0].split("_t")[0], parts[1])] = float(r["value"])
    notes = []
    for (decoder, b), value in tpf.items():
        ceiling = sol.get((CEILING_OF.get(decoder, ""), b))
        if ceiling is not None and above_ceiling(value, ceiling):
            notes.append(f"- `{decoder}` is above its ceiling, SOL({CEILING_OF[decoder]}) ({value:.2f} > "
                         f"{ceiling:.2f}): {ABOVE_CEILING.get(decoder, 'not explained yet')}")
    return ["", *notes] if notes else []


def _short(value) -> str:
    """A leaderboard value: 3 significant digits (``yes`` / ``no`` for booleans)."""
    return format(value, ".3g") if isinstance(value, float) else format_value(value)


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def leaderboard_table(rows: list[dict], page: str) -> list[str]:
    """One leaderboard run (a context mode) as one row per decoder setting (decoder, B, τ) with a column per metric
    (:data:`BOARD_COLUMNS`), its SOL ceilings in a line under the table, and a note for each row above its
    ceiling (:func:`workbench.results.above_ceiling`)."""
    decoded: dict[tuple, dict] = {}
    ceilings, walls = [], []
    for r in rows:
        parts = r["key"].split("/")
        if r["metric"] == "wall_s":                              # a task run's wall time: one figure per run
            walls.append(f"{float(r['value']):.0f} {r.get('unit') or 's'}")
            continue
        if parts[3].startswith("SOL("):
            ceilings.append(f"{parts[3]} {_short(r['value'])} at B = {parts[4].removeprefix('B')}")
            continue
        decoded.setdefault((parts[3], parts[4], parts[5]), {})[r["metric"]] = r
    contexts = []
    for r in rows:
        c = _context(r, page)
        if c not in contexts:
            contexts.append(c)
    cols = [m for m in BOARD_COLUMNS if any(m in v for v in decoded.values())]
    lines = _contexts_above(contexts)
    lines += ["| decoder | B | τ | " + " | ".join(BOARD_COLUMNS[m] for m in cols) + " |",
              "|---|---|---|" + "---|" * len(cols)]
    notes = []
    for (decoder, b, t), metrics in decoded.items():
        cells = [f"`{decoder}`", b.removeprefix("B"), t.removeprefix("t") or "–"]
        for m in cols:
            r = metrics.get(m)
            if r is None:
                cells.append("")
            elif m == "ceiling_tpf":
                cells.append(f"{_short(r['value'])} ({(r.get('unit') or '').split(', ')[-1]})")
            else:
                cells.append(_short(r["value"]))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        tpf, ceiling = (_num((metrics.get(m) or {}).get("value")) for m in ("tpf", "ceiling_tpf"))
        if tpf is not None and ceiling is not None and above_ceiling(tpf, ceiling):
            notes.append(f"- `{decoder}` is above its ceiling ({tpf:.2f} > {ceiling:.2f}): "
                         f"{ABOVE_CEILING.get(decoder, 'not explained yet')}")
    if ceilings:
        lines += ["", "Ceilings (tokens per forward): " + "; ".join(ceilings) + "."]
    if walls:
        lines += ["", "Wall time: " + "; ".join(walls) + "."]
    if notes:
        lines += ["", *notes]
    return lines


def _bench_table(rows: list[dict]) -> list[str]:
    """One benchmark script's figures: the setting pairs every line shares above, one row per varying setting, a
    column per measured field."""
    pairs = {r["key"]: dict(p.split("=", 1) for p in (r.get("setting") or "").split(",") if "=" in p) for r in rows}
    common = {k: v for k, v in next(iter(pairs.values())).items()
              if all(p.get(k) == v for p in pairs.values())}
    by_setting: dict[str, dict] = {}
    for r in rows:
        label = ", ".join(f"{k}={v}" for k, v in pairs[r["key"]].items() if k not in common) or "–"
        by_setting.setdefault(label, {})[r["metric"]] = r
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    first = rows[0]
    shared = ", ".join(f"{k}={v}" for k, v in common.items())
    lines = [f"Setting: {shared or 'none shared'}. Machine: {_machine_text(first.get('machine'))}. Command: "
             f"`{first.get('command')}`. Provenance: {provenance_text(first)}.", "",
             "| setting | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for label, got in by_setting.items():
        lines.append("| " + " | ".join([_cell(label)] + [format_value(got[m]["value"]) if m in got else ""
                                                          for m in metrics]) + " |")
    return lines


def _footer() -> list[str]:
    return ["", "Generated from `benchmarks/results.jsonl` by `python scripts/render_results.py` (each figure's "
            "latest line); edit the table, not this page. History: the lab notebook, `benchmarks/RESULTS.md`.", ""]


def _task_order(task: str) -> tuple:
    titles = list(dict.fromkeys([*MODES.values(), *TASKS.values()]))
    return (titles.index(task), "") if task in titles else (len(titles), task)


def model_page(name: str, rows: list[dict]) -> str:
    """The page of one model (or ``bench``): its current figures, one table per task."""
    title = "Benchmark figures" if name == "bench" else f"Results: `{name}`"
    lines = [f"# {title}", ""]
    if name == "bench":
        lines += ["Figures the benchmark scripts append (`python benchmarks/run_all.py --results_table "
                  "benchmarks/results.jsonl`), one table per script.", ""]
    else:
        lines += [f"The current figures of `{name}` in the results table, {len(rows)} in all: one table per task, "
                  "its setting, command and provenance above it ([methodology](methodology.md)).", ""]
    if not rows:
        lines += ["The table holds no such figure yet."]
    tasks: dict[str, list[dict]] = {}
    for r in rows:
        tasks.setdefault(task_of(r["key"]), []).append(r)
    for task in sorted(tasks, key=_task_order):
        members = tasks[task]
        lines += [f"## {task}", ""]
        if name == "bench":
            lines += _bench_table(members)
        elif members[0]["key"].startswith("leaderboard/"):
            lines += leaderboard_table(members, name)
        else:
            lines += figure_table(members, name)
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n" + "\n".join(_footer())


def methodology_page(current: dict[str, dict]) -> str:
    """The methodology page: provenance, targets and ceilings, carried-over figures, machines, rerunning, spread."""
    machines: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in current.values():
        t = _machine_text(r.get("machine"))
        machines[t] = machines.get(t, 0) + 1
        if r.get("carried_over"):
            reasons[r["carried_over"]] = reasons.get(r["carried_over"], 0) + 1
    lines = ["# Results methodology", "",
             "## The table", "",
             "Every measured figure is one line of `benchmarks/results.jsonl` (JSON lines) with the fields "
             + ", ".join(f"`{f}`" for f in FIELDS) + ". Keys name a figure: "
             "`leaderboard/<model>/<mode>/<decoder>/B<B>/t<τ>/<metric>` for the leaderboard's, "
             "`bench/<script>/<setting>/<metric>` for the benchmark scripts', and "
             "`results/<model>/<task>/…/<metric>` for the others. The table is appended to "
             "(`workbench.results.append_results`, one whole line per write): the latest line of a key is its "
             "current value and the earlier lines are its history. The pages of this section and the README's "
             "headline table are rendered from the current values (`python scripts/render_results.py`; `--check` "
             "fails when a page differs from the table).", "",
             "## Provenance", "",
             "A figure records the `commit` it was measured on, the `date`, the `machine`, the `versions` of python, "
             "torch, transformers and the workbench, and the `seed` where one applies (a training run or a sampling "
             "decoder; none for greedy decoding and timings). `append_results` stamps them when a command appends "
             "a figure.", "",
             "## Targets and ceilings", "", TARGETS_TEXT, "",
             "## Carried-over figures", "",
             f"{sum(reasons.values())} current figures were measured before the table stamped their provenance; "
             "their `carried_over` field gives the reason, and their commit, date and versions were filled in "
             "afterwards as it says:", ""]
    lines += [f"- {n} figure{'s' if n > 1 else ''}: {_cut(reason, 600)}" for reason, n in
              sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))] or ["- none"]
    lines += ["", "## Machines seen in the table", "", "| machine | current figures |", "|---|---|"]
    lines += [f"| {_cell(m)} | {n} |" for m, n in sorted(machines.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += ["", "## Rerunning a figure", "",
              "Each figure's `command` is the command that measured it and `setting` says the prompts, tokens and "
              "precision; check out its `commit` and install its `versions` to rerun it as it ran. "
              "`workbench leaderboard --results_table benchmarks/results.jsonl` and `python benchmarks/run_all.py "
              "--results_table benchmarks/results.jsonl` append the new figures themselves; a changed figure then "
              "becomes the current one, and `python scripts/render_results.py` re-renders the pages.", "",
              "## Run-to-run spread", "",
              "Wall-clock figures on the shared 2-core CPU machines move between runs more than token counts do "
              "(tokens per forward, acceptance and agreement are not timed).", "", f"- {MEASURED_SPREAD}"]
    for r in current.values():
        if "spread" in r["metric"]:
            value = format_value(r["value"])
            lines.append(f"- `{r['key']}`: {value} {r.get('unit') or ''} ({_cut(r.get('setting') or '', 150)}; "
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


__all__ = ["MAX_CELL", "FIXED_PAGES", "TASKS", "MEASURED_SPREAD", "page_of", "task_of", "format_value",
           "provenance_text", "figure_table", "leaderboard_table", "model_page", "methodology_page", "results_pages"]

