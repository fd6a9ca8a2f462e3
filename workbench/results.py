"""Results as data: one table of measured figures, ``benchmarks/results.jsonl`` (JSON lines, one figure per line).

Every figure carries what it needs to be rerun and compared: ``date``, ``commit``, ``machine`` (CPU model, cores,
GPU), ``versions`` (python, torch, transformers and the workbench), the ``seed`` where one applies (a training run, a
sampling decoder; None for greedy decoding and timings), ``model`` and ``adapter``, the ``command`` that measured it,
a ``setting`` line (prompts, tokens, precision), ``metric``, ``value``, ``unit``, ``target`` (or None) and a ``key``
naming the figure. ``carried_over`` is None for a figure stamped when it was measured, else the reason its commit,
date or versions were filled in afterwards (figures measured before the table existed). The latest line of a key is
its current value; earlier lines are its history. ``workbench leaderboard --results_table PATH`` (and the demo,
which runs it) and the benchmark scripts append their figures; :func:`headline_markdown` renders the README's
headline table from the table (``scripts/render_results.py``; a test checks that the two agree).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

#: The repository's results table.
RESULTS_TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "results.jsonl"
#: Fields of a figure, in the order they are written.
FIELDS = ("key", "metric", "value", "unit", "target", "model", "adapter", "command", "setting", "date", "commit",
          "machine", "versions", "seed", "carried_over")
#: The fields every figure must carry (``versions`` with :data:`VERSIONED` inside); see :func:`missing_provenance`.
PROVENANCE = ("date", "commit", "versions")
#: The packages whose versions a figure records, besides python.
VERSIONED = ("torch", "transformers", "workbench")
#: The base seed of a sampling decoder in a decode run: batch ``c`` draws with ``SAMPLING_SEED + c``
#: (:func:`workbench.evaluation.harness.decode_prompts`).
SAMPLING_SEED = 0


def machine() -> dict:
    """The machine a figure was measured on: CPU model, logical cores, GPU name (None without CUDA)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu}


def commit() -> str | None:
    """The repository's HEAD commit (short), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def versions() -> dict:
    """The versions a figure is measured with: ``python``, ``torch``, ``transformers`` and ``workbench`` (the
    installed distribution's version; None for one that is not installed)."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            module = sys.modules.get(name)
            out[name] = getattr(module, "__version__", None)
    return out


def missing_provenance(row: dict) -> list[str]:
    """The provenance a figure lacks, empty when it has it all: a ``date`` and a ``seed`` field (None where no seed
    applies) always; a ``commit`` and ``versions`` with every package of :data:`VERSIONED` unless ``carried_over``
    gives the reason they could not be recorded."""
    missing = [f for f in ("date",) if not row.get("date")] + [f for f in ("seed",) if f not in row]
    if not row.get("carried_over"):
        got = row.get("versions") or {}
        missing += [f for f in ("commit",) if not row.get(f)]
        missing += [f"versions.{name}" for name in VERSIONED if not got.get(name)]
    return missing


def append_results(figures: list[dict], path: str | Path = RESULTS_TABLE) -> int:
    """Append ``figures`` (dicts with at least ``key``, ``metric``, ``value``) to the table at ``path``, stamping
    ``date``, ``commit``, ``machine`` and ``versions`` where they are missing (``seed`` None and ``carried_over``
    None unless given). Each line is written whole (one ``write`` of the line, flushed), so a killed run never
    leaves half a figure. Returns the number of figures appended. Raises ``ValueError`` for a figure without
    ``key``, ``metric`` or ``value``."""
    stamp = {"date": datetime.date.today().isoformat(), "commit": commit(), "machine": machine(),
             "versions": versions(), "seed": None, "carried_over": None}
    lines = []
    for f in figures:
        missing = [k for k in ("key", "metric", "value") if k not in f]
        if missing:
            raise ValueError(f"a result figure needs {', '.join(missing)}: {f}")
        row = {k: f.get(k, stamp.get(k)) for k in FIELDS}
        lines.append(json.dumps(row, sort_keys=False, default=str) + "\n")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as out:
        for line in lines:
            out.write(line)
            out.flush()
    return len(lines)


def load_results(path: str | Path = RESULTS_TABLE) -> list[dict]:
    """Every figure of the table, in order (empty for a missing table). Raises ``ValueError`` naming the line for a
    line that is not a JSON object."""
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{i} is not a JSON line ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{p}:{i} is not a JSON object")
        rows.append(row)
    return rows


def latest(rows: list[dict]) -> dict[str, dict]:
    """The current figure of each key: its last line."""
    out: dict[str, dict] = {}
    for row in rows:
        out[row["key"]] = row
    return out


def leaderboard_figures(df, cfg, ceilings=None, command: str | None = None,
                        sampling: frozenset[str] | set[str] = frozenset(), wall_s: float | None = None) -> list[dict]:
    """The figures of a leaderboard run (``df``: its table; ``cfg``: its
    :class:`~workbench.leaderboard.config.LeaderboardConfig`): per decoded row, ``tpf``, ``speedup`` (tokens/s ÷ AR
    greedy's), ``lossless``, ``agree_serial`` and the ``ceiling_tpf`` its decoder is measured against (and on a task,
    ``pass@1``, ``aup`` and ``tokens_per_s``, and with ``wall_s`` the run's wall time); per ceiling, its SOL value.
    ``command`` is the command that reproduces the run (default: :func:`options_command` of a config dataclass
    ``cfg``, every option that differs from its default);
    the figures of the ``sampling`` decoders record :data:`SAMPLING_SEED`, the others no seed. Keys:
    ``leaderboard/<model>/<mode>/<decoder>/B<B>/t<τ>/<metric>``,
    with the task's name (``humaneval``) in place of the mode for a task run, and its problems beside it for a subset
    (``humaneval[0:20]``: ``/`` in task ids written ``-``), so that a subset never replaces the whole task's figure."""
    import math

    setting = (f"{cfg.n_prompts} {cfg.split} prompts of {cfg.corpus}, {cfg.prompt_len}-token prompts × {cfg.gen_len} "
               f"tokens, {cfg.precision}, batch {cfg.batch_size}")
    if command is None and dataclasses.is_dataclass(cfg):
        command = options_command("workbench leaderboard", cfg, dataclass_defaults(type(cfg)),
                                  bare_flags=getattr(cfg, "BARE_FLAGS", ()))
    command = command or (f"workbench leaderboard --model {cfg.model} --n_prompts {cfg.n_prompts} --prompt_len "
                          f"{cfg.prompt_len} --gen_len {cfg.gen_len} --block_lengths \"{list(cfg.block_lengths)}\" "
                          f"--thresholds \"{list(cfg.thresholds)}\" --precision {cfg.precision} --batch_size "
                          f"{cfg.batch_size}")
    task = getattr(cfg, "task", None)
    problems = getattr(cfg, "problems", None) if task else None
    # a subset of a task's problems is its own figure, never the whole task's: humaneval[0:20]
    scope = f"{task}[{problems.replace('/', '-')}]" if problems else task
    if task:                                    # a task run: its problems, not corpus prompts
        setting = (f"{task} problems {cfg.problems or 'all'} ({cfg.prompt_format} format), up to {cfg.gen_len} tokens, "
                   f"{cfg.precision}, batch {cfg.batch_size}")
    base = {"model": cfg.model, "adapter": cfg.adapter, "command": command, "setting": setting}
    units = {"tpf": "tokens per target forward", "speedup": "× AR greedy tokens/s", "lossless": "bool",
             "agree_serial": "token agreement", "pass@1": "share of problems passed", "aup": "AUP (d3LLM)"}
    if task:                                    # a task's speed in absolute terms too (its answers' lengths vary)
        units["tokens_per_s"] = "tokens/s"
    figures = []
    for _, r in df.iterrows():
        if r.get("status") != "ok":
            continue
        ceiling = r.get("ceiling")
        row_units = {**units, "ceiling_tpf": "tokens per forward"
                     + (f", SOL({ceiling})" if isinstance(ceiling, str) else "")}
        t = r.get("threshold")
        # a task's figures never overwrite the corpus prompts' under one key: the task names them, not the mode
        tag = f"leaderboard/{cfg.model}/{scope or r['mode']}/{r['decoder']}/B{int(r['block_length'])}/" \
              f"t{'' if t is None or (isinstance(t, float) and math.isnan(t)) else t}"
        for metric, unit in row_units.items():
            value = r.get(metric)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            figures.append({**base, "key": f"{tag}/{metric}", "metric": metric, "unit": unit,
                            "value": bool(value) if metric == "lossless" else float(value), "target": None,
                            "seed": SAMPLING_SEED if r["decoder"] in sampling else None})
    if ceilings is not None and len(ceilings):
        for _, c in ceilings.iterrows():
            figures.append({**base, "key": f"leaderboard/{cfg.model}/{scope or 'free'}/SOL({c['ceiling']})/"
                                          f"B{int(c['block_length'])}"
                                          f"/sol", "metric": "sol", "value": float(c["sol"]),
                            "unit": "tokens per forward", "target": None, "seed": None})
    if task and wall_s is not None:
        figures.append({**base, "key": f"leaderboard/{cfg.model}/{scope}/wall_s", "metric": "wall_s",
                        "value": float(wall_s), "unit": "s (decoding and scoring, model loaded)", "target": None,
                        "seed": None})
    return figures


#: Options of a run that do not change its figures, left out of the command a figure records.
NOT_MEASURED = ("out_dir", "progress_bar", "results_table", "device", "skip_missing", "config")


def dataclass_defaults(cls) -> dict:
    """``{field: default}`` of the config dataclass ``cls`` (a default factory is called; None without a default)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    return out


def options_command(prefix: str, cfg, defaults: dict, first: tuple[str, ...] = ("model",),
                    bare_flags: tuple[str, ...] = ()) -> str:
    """The command line ``prefix`` + the options of ``cfg`` that reproduce its run: the ``first`` options always,
    then every option of ``defaults`` whose value in ``cfg`` differs from its default, but those of
    :data:`NOT_MEASURED` (lists as ``"[a, b]"``, booleans as ``true``/``false``, a true bare flag alone)."""
    parts = [prefix] + [f"--{name} {getattr(cfg, name)}" for name in first if hasattr(cfg, name)]
    for name, default in defaults.items():
        if name in first or name in NOT_MEASURED or not hasattr(cfg, name):
            continue
        value = getattr(cfg, name)
        if value == default:
            continue
        if name in bare_flags and value is True:
            parts.append(f"--{name}")
        elif isinstance(value, (list, tuple)):
            parts.append(f'--{name} "[{", ".join(str(v) for v in value)}]"')
        elif isinstance(value, bool):
            parts.append(f"--{name} {str(value).lower()}")
        else:
            parts.append(f"--{name} {value}")
    return " ".join(parts)


#: Why a decoder's tokens per forward can exceed its ceiling (the SOL it is measured against), by decoder: said under
#: every table that shows such a row (the README's headline, the results pages).
ABOVE_CEILING = {
    "ss_quadratic": "each of its forwards also commits the verifier's AR token, which SOL's schedules of "
                    "diffusion-mode forwards alone do not (NLD App. C)",
    "deer": "its drafts come from a separate drafter whose forwards tokens per forward does not count (one target "
            "forward per cycle), so the target's own SOL does not bound it; cost_tpf counts them",
    "diffuspec": "with a separate drafter, its drafter's forwards are not counted in tokens per forward, so the "
                 "target's own SOL does not bound it; cost_tpf counts them",
    "diffuspec_argmax": "with a separate drafter, its drafter's forwards are not counted in tokens per forward, so the "
                        "target's own SOL does not bound it; cost_tpf counts them",
    "simsd": "its drafts come from a separate drafter whose forwards tokens per forward does not count, so the "
             "target's own SOL does not bound it; cost_tpf counts them",
}


def above_ceiling(tpf: float, ceiling: float) -> bool:
    """True when ``tpf`` exceeds ``ceiling`` by more than rounding (1e-6)."""
    return tpf > ceiling + 1e-6


#: The decoders of the README's headline table, in order (at most 8; a decoder missing from the source is left out).
HEADLINE_DECODERS = ("ar_greedy", "ss_linear", "ss_quadratic", "isd", "confidence", "sampler", "deer", "simsd")


def headline_markdown(rows: list[dict], model: str, block_length: int = 8, threshold: float = 0.9) -> str:
    """The README's headline table from the results table's current figures (:func:`latest`): the free-running
    leaderboard rows of ``model`` at ``block_length`` (diffusion decoders at ``threshold``), one line per decoder of
    :data:`HEADLINE_DECODERS` with tokens per forward, speed against AR greedy, lossless or not, and its ceiling;
    then why any row is above its ceiling (:data:`ABOVE_CEILING`) and the setting line (prompts, precision,
    machine, commit, date, versions, command). Raises ``ValueError`` when the table has
    no figure of ``model``."""
    cur = latest(rows)
    prefix = f"leaderboard/{model}/free/"

    def fig(decoder: str, metric: str):
        for b in (block_length, 0):
            for t in (threshold, ""):
                row = cur.get(f"{prefix}{decoder}/B{b}/t{t}/{metric}")
                if row is not None:
                    return row
        return None

    lines = ["| decoder | tokens per forward | speed vs AR greedy | lossless | ceiling (tokens per forward) |",
             "|---|---|---|---|---|"]
    notes = []
    used = None
    for d in HEADLINE_DECODERS:
        tpf = fig(d, "tpf")
        if tpf is None:
            continue
        used = used or tpf
        speed = fig(d, "speedup")
        lossless = fig(d, "lossless")
        ceiling = fig(d, "ceiling_tpf")
        speed_s = "" if speed is None else f"{speed['value']:.2f}×"
        ceiling_s = "" if ceiling is None else f"{ceiling['value']:.2f} ({ceiling['unit'].split(', ')[-1]})"
        lossless_s = "yes" if lossless and lossless["value"] else "no"
        lines.append(f"| `{d}` | {tpf['value']:.2f} | {speed_s} | {lossless_s} | {ceiling_s} |")
        if ceiling is not None and above_ceiling(tpf["value"], ceiling["value"]):
            notes.append(f"`{d}` ({tpf['value']:.2f} > {ceiling['value']:.2f}): "
                         f"{ABOVE_CEILING.get(d, 'not explained yet')}")
    if used is None:
        raise ValueError(f"the results table has no free-running leaderboard figure of {model}")
    m = used.get("machine") or {}
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    v = used.get("versions") or {}
    versions_s = ", ".join(f"{k} {v[k]}" for k in VERSIONED if v.get(k))
    lines.append("")
    if notes:
        lines.append("Above the ceiling: " + "; ".join(notes) + ".")
        lines.append("")
    lines.append(f"Setting: `{model}`, {used['setting']}, free-running, B = k = {block_length}, τ = {threshold}; "
                 f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores{gpu}); commit {used.get('commit')}, "
                 f"{used.get('date')}{'; ' + versions_s if versions_s else ''}. Command: `{used['command']}`.")
    return "\n".join(lines)


def task_markdown(rows: list[dict], task: str = "humaneval", subsets: bool = True) -> str:
    """The README's task-accuracy table from the results table's current figures (:func:`latest`): one line per run
    (model and problems: ``all`` or the subset of a ``<task>[<problems>]`` key) and decoder setting of every
    ``leaderboard/<model>/<task>…/`` figure, with pass@1, tokens per forward and tokens/s, then one setting line per
    run (format, budget, precision, machine, commit, date, wall time, command). ``subsets`` False leaves the runs on a
    subset of the problems out (the README's table: the results pages list them). Raises ``ValueError`` when the
    table has no figure of ``task``."""
    cur = latest(rows)
    by_model: dict[tuple[str, str], dict[tuple, dict]] = {}
    walls: dict[tuple[str, str], dict] = {}
    for key, row in cur.items():
        parts = key.split("/")
        if parts[0] != "leaderboard" or len(parts) < 4 or not (parts[2] == task or parts[2].startswith(task + "[")):
            continue
        run = (parts[1], parts[2][len(task) + 1:-1] or "all")          # (model, problems)
        if not subsets and run[1] != "all":
            continue
        if row["metric"] == "wall_s":
            walls[run] = row
        elif len(parts) == 7 and not parts[3].startswith("SOL("):
            by_model.setdefault(run, {}).setdefault((parts[3], parts[4], parts[5]), {})[row["metric"]] = row
    if not by_model:
        raise ValueError(f"the results table has no {task} figure")

    def cell(metrics: dict, metric: str, fmt: str) -> str:
        row = metrics.get(metric)
        return "" if row is None else format(row["value"], fmt)

    lines = ["| model | problems | decoder | B | τ | pass@1 | tokens per forward | tokens/s |",
             "|---|---|---|---|---|---|---|---|"]
    settings = []
    for (model, problems), decoded in by_model.items():
        for (decoder, b, t), metrics in decoded.items():
            lines.append(f"| `{model}` | {problems} | `{decoder}` | {'–' if b == 'B0' else b[1:]} | "
                         f"{t.removeprefix('t') or '–'} | "
                         f"{cell(metrics, 'pass@1', '.3f')} | {cell(metrics, 'tpf', '.2f')} | "
                         f"{cell(metrics, 'tokens_per_s', '.1f')} |")
        first = next(r for m in decoded.values() for r in m.values())
        m = first.get("machine") or {}
        gpu = f", {m['gpu']}" if m.get("gpu") else ""
        wall = walls.get((model, problems))
        wall_s = f"; wall time {wall['value'] / 60:.0f} min" if wall else ""
        settings.append(f"`{model}`{'' if problems == 'all' else f', problems {problems}'}: {first['setting']}; {m.get('cpu', '?')} ({m.get('cores', '?')} cores{gpu}); "
                        f"commit {first.get('commit')}, {first.get('date')}{wall_s}. Command: `{first['command']}`.")
    return "\n".join(lines + [""] + [f"- {s}" for s in settings])


__all__ = ["RESULTS_TABLE", "FIELDS", "PROVENANCE", "VERSIONED", "SAMPLING_SEED", "machine", "commit", "versions",
           "missing_provenance", "append_results", "load_results", "latest", "NOT_MEASURED", "dataclass_defaults",
           "options_command",
           "leaderboard_figures", "headline_markdown", "task_markdown", "HEADLINE_DECODERS", "ABOVE_CEILING", "above_ceiling"]
