"""Results as data: one table of measured figures, ``benchmarks/results.jsonl`` (JSON lines, one figure per line).

Every figure carries what it needs to be rerun and compared: ``date``, ``commit``, ``machine`` (CPU model, cores,
GPU), ``model`` and ``adapter``, the ``command`` that measured it, a ``setting`` line (prompts, tokens, precision),
``metric``, ``value``, ``unit``, ``target`` (or None) and a ``key`` naming the figure. The latest line of a key is
its current value; earlier lines are its history. ``workbench leaderboard --results_table PATH`` (and the demo,
which runs it) and the benchmark scripts append their figures; :func:`headline_markdown` renders the README's
headline table from the table (``scripts/render_results.py``; a test checks that the two agree).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

#: The repository's results table.
RESULTS_TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "results.jsonl"
#: Fields of a figure, in the order they are written.
FIELDS = ("key", "metric", "value", "unit", "target", "model", "adapter", "command", "setting", "date", "commit",
          "machine")


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


def append_results(figures: list[dict], path: str | Path = RESULTS_TABLE) -> int:
    """Append ``figures`` (dicts with at least ``key``, ``metric``, ``value``) to the table at ``path``, stamping
    ``date``, ``commit`` and ``machine`` where they are missing. Each line is written whole (one ``write`` of the
    line, flushed), so a killed run never leaves half a figure. Returns the number of figures appended. Raises
    ``ValueError`` for a figure without ``key``, ``metric`` or ``value``."""
    stamp = {"date": datetime.date.today().isoformat(), "commit": commit(), "machine": machine()}
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


def leaderboard_figures(df, cfg, ceilings=None) -> list[dict]:
    """The figures of a leaderboard run (``df``: its table; ``cfg``: its
    :class:`~workbench.leaderboard.config.LeaderboardConfig`): per decoded row, ``tpf``, ``speedup`` (tokens/s ÷ AR
    greedy's), ``lossless``, ``agree_serial`` and the ``ceiling_tpf`` its decoder is measured against (and on a task,
    ``pass@1`` and ``aup``); per ceiling, its SOL value. Keys: ``leaderboard/<model>/<mode>/<decoder>/B<B>/t<τ>/<metric>``,
    with the task's name (``humaneval``) in place of the mode for a task run."""
    import math

    setting = (f"{cfg.n_prompts} {cfg.split} prompts of {cfg.corpus}, {cfg.prompt_len}-token prompts × {cfg.gen_len} "
               f"tokens, {cfg.precision}, batch {cfg.batch_size}")
    # every option that changes a figure: the batch (the speed-ups' timing), the decoders and real-context rows run,
    # the artefacts given (a sampler, drafter, proxy or adapter not shipped with the model)
    options = f"--batch_size {cfg.batch_size}"
    for name in ("decoders", "real_context_decoders"):
        if getattr(cfg, name, None):
            options += f" --{name} \"[{', '.join(getattr(cfg, name))}]\""
    for name in ("sampler", "drafter", "proxy", "adapter"):
        if getattr(cfg, name, None):
            options += f" --{name} {getattr(cfg, name)}"
    command = (f"workbench leaderboard --model {cfg.model} --n_prompts {cfg.n_prompts} --prompt_len {cfg.prompt_len} "
               f"--gen_len {cfg.gen_len} --block_lengths \"{list(cfg.block_lengths)}\" --thresholds "
               f"\"{list(cfg.thresholds)}\" --precision {cfg.precision} {options}")
    task = getattr(cfg, "task", None)
    if task:                                    # a task run: its problems, not corpus prompts
        setting = (f"{task} problems {cfg.problems or 'all'} ({cfg.prompt_format} format), up to {cfg.gen_len} tokens, "
                   f"{cfg.precision}, batch {cfg.batch_size}")
        command = (f"workbench leaderboard --model {cfg.model} --task {task} --problems {cfg.problems or '0:164'} "
                   f"--prompt_format {cfg.prompt_format} --gen_len {cfg.gen_len} --block_lengths "
                   f"\"{list(cfg.block_lengths)}\" --thresholds \"{list(cfg.thresholds)}\" --precision {cfg.precision} "
                   f"{options} --confirm_run_unsafe_code")
    base = {"model": cfg.model, "adapter": cfg.adapter, "command": command, "setting": setting}
    units = {"tpf": "tokens per target forward", "speedup": "× AR greedy tokens/s", "lossless": "bool",
             "agree_serial": "token agreement", "pass@1": "share of problems passed", "aup": "AUP (d3LLM)"}
    figures = []
    for _, r in df.iterrows():
        if r.get("status") != "ok":
            continue
        ceiling = r.get("ceiling")
        row_units = {**units, "ceiling_tpf": "tokens per forward"
                     + (f", SOL({ceiling})" if isinstance(ceiling, str) else "")}
        t = r.get("threshold")
        # a task's figures never overwrite the corpus prompts' under one key: the task names them, not the mode
        tag = f"leaderboard/{cfg.model}/{task or r['mode']}/{r['decoder']}/B{int(r['block_length'])}/" \
              f"t{'' if t is None or (isinstance(t, float) and math.isnan(t)) else t}"
        for metric, unit in row_units.items():
            value = r.get(metric)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            figures.append({**base, "key": f"{tag}/{metric}", "metric": metric, "unit": unit,
                            "value": bool(value) if metric == "lossless" else float(value), "target": None})
    if ceilings is not None and len(ceilings):
        for _, c in ceilings.iterrows():
            figures.append({**base, "key": f"leaderboard/{cfg.model}/{task or 'free'}/SOL({c['ceiling']})/"
                                          f"B{int(c['block_length'])}"
                                          f"/sol", "metric": "sol", "value": float(c["sol"]),
                            "unit": "tokens per forward", "target": None})
    return figures


#: The decoders of the README's headline table, in order (at most 8; a decoder missing from the source is left out).
HEADLINE_DECODERS = ("ar_greedy", "ss_linear", "ss_quadratic", "isd", "confidence", "sampler", "deer", "simsd")


def headline_markdown(rows: list[dict], model: str, block_length: int = 8, threshold: float = 0.9) -> str:
    """The README's headline table from the results table's current figures (:func:`latest`): the free-running
    leaderboard rows of ``model`` at ``block_length`` (diffusion decoders at ``threshold``), one line per decoder of
    :data:`HEADLINE_DECODERS` with tokens per forward, speed against AR greedy, lossless or not, and its ceiling;
    then the setting line (prompts, precision, machine, commit, command). Raises ``ValueError`` when the table has
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
    if used is None:
        raise ValueError(f"the results table has no free-running leaderboard figure of {model}")
    m = used.get("machine") or {}
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    lines.append("")
    lines.append(f"Setting: `{model}`, {used['setting']}, free-running, B = k = {block_length}, τ = {threshold}; "
                 f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores{gpu}); commit {used.get('commit')}, "
                 f"{used.get('date')}. Command: `{used['command']}`.")
    return "\n".join(lines)


__all__ = ["RESULTS_TABLE", "FIELDS", "machine", "commit", "append_results", "load_results", "latest",
           "leaderboard_figures", "headline_markdown", "HEADLINE_DECODERS"]
