"""The leaderboard on a task (``--task humaneval``): the accuracy columns of its rows (its prompts are
:func:`~workbench.evaluation.task.task_as_prompts`).

Every decoded row's answers (cut at the task's stop tokens, as the row's tpf counts them) become completions; a
sampling decoder draws ``--n_samples`` per problem (the first is the row's own decode). All of them run in one
parallel pass of the sandbox; each row gains ``pass@1`` (and ``pass@k`` for k ≤ its samples), and each decoder an
``aup`` over its rows (d3LLM's accuracy under parallelism, y_max the best pass@1 of the table).
"""
from __future__ import annotations

import math

import pandas as pd

from ..tasks.report import aup_by_decoder
from ..tasks.run import (TaskOptions, TaskPrompts, completions, decode_task, pass_at, sample_records, score,
                         setting_label)


def _key(decoder: str, length, threshold) -> tuple:
    t = threshold if threshold is not None and not (isinstance(threshold, float) and math.isnan(threshold)) else None
    return decoder, int(length or 0), t


def score_rows(df: pd.DataFrame, results: dict, opts: TaskOptions, tp: TaskPrompts, tokenizer, redecode,
               progress: bool = True) -> tuple[pd.DataFrame, list[dict]]:
    """``df`` with the accuracy columns of its task rows, and the ``samples.jsonl`` lines.

    Args:
        results: ``{Setting: (result cut at the stop tokens, full result)}`` of the decoded rows.
        redecode: ``redecode(setting, sample) -> DecodeResult`` for a sampling decoder's further samples.
    """
    from ..decoding.registry import get_decoder

    comps, records, where = {}, [], {}
    for st, (res, _) in results.items():
        spec = get_decoder(st.decoder)
        n = opts.n_samples if spec.temperature else 1
        label = setting_label(st.length, st.threshold)
        samples = [completions(tokenizer, tp, res.tokens)]
        samples += [completions(tokenizer, tp, redecode(st, s).tokens) for s in range(1, n)]
        comps[st] = samples
        where[_key(st.label, st.length, st.threshold)] = st
        for s, c in enumerate(samples):
            records += sample_records(tp, c, st.label, label, s, block_length=st.length, threshold=st.threshold)
    scored = {st: pass_at(r) for st, r in score(tp, comps, opts, progress=progress).items()}
    names = sorted({k for v in scored.values() for k in v}, key=lambda s: int(s.split("@")[1]))
    cols = {name: [] for name in names}
    for _, r in df.iterrows():
        st = where.get(_key(r["decoder"], r.get("block_length"), r.get("threshold"))) if r.get("status") == "ok" \
            else None
        for name in names:
            cols[name].append(scored[st].get(name, math.nan) if st is not None else math.nan)
    df = df.assign(**cols)
    if "pass@1" in df:
        aups = aup_by_decoder(df[df["status"] == "ok"])
        df = df.assign(aup=[aups.get(d, math.nan) if s == "ok" else math.nan for d, s in zip(df["decoder"],
                                                                                               df["status"])])
    return df, records


def redecoder(model, adapter_model, tp: TaskPrompts, cfg, pad: int, options):
    """``redecode(setting, sample)`` for :func:`score_rows`: the setting's decoder, options and model again, at
    sample index ``sample`` (its own seeds)."""
    def redecode(st, sample: int):
        kw, _ = options(st)
        return decode_task(adapter_model if st.adapter else model, st.decoder, tp, cfg.gen_len, cfg.batch_size, pad,
                           sample=sample, **kw)
    return redecode


__all__ = ["score_rows", "redecoder"]
