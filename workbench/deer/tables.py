"""Per-prompt rows → DEER's result tables (pure pandas functions).

Row columns (one row per prompt and method, see :func:`workbench.deer.evaluate.decode_rows`): ``method``,
``category``, ``prompt_id``, ``tokens``, ``cycles``, ``cycles_accept_ge8``, ``max_accepted``, ``forwards``,
``extra_forwards``, ``cost_forwards`` (verify + draft · P_d/P_t; NaN where not applicable), ``wall_s``,
``ar_wall_s`` (AR decoding of the same prompt), ``agree_ar``, ``repetition``.

Pooled metrics per group (ratios of sums, the definitions of :mod:`workbench.speculative.metrics`):
τ = Σ tokens / Σ cycles (mean tokens per cycle = accepted + 1), share of cycles accepting ≥ 8 draft
tokens (DEER Fig. 4), max accepted length (DEER Table 4), real TPF = Σ tokens / Σ (draft + verify
forwards), cost TPF = Σ tokens / Σ cost_forwards, wall-clock speedup = Σ ar_wall_s / Σ wall_s.
"""
from __future__ import annotations

import pandas as pd

ALL = "all"


def _pool(g: pd.DataFrame) -> pd.Series:
    tokens = g["tokens"].sum()
    return pd.Series({
        "n_prompts": len(g), "tokens": tokens, "cycles": g["cycles"].sum(),
        "tau": tokens / max(1, g["cycles"].sum()),
        "max_accepted": g["max_accepted"].max(),
        "share_accept_ge8": g["cycles_accept_ge8"].sum() / max(1, g["cycles"].sum()),
        "tpf": tokens / max(1, g["forwards"].sum()),
        "tpf_real": tokens / max(1, (g["forwards"] + g["extra_forwards"]).sum()),
        "tpf_cost": tokens / g["cost_forwards"].sum() if g["cost_forwards"].notna().all() else float("nan"),
        "speedup": g["ar_wall_s"].sum() / max(1e-12, g["wall_s"].sum()),
        "tokens_per_s": tokens / max(1e-12, g["wall_s"].sum()),
        "agree_ar": g["agree_ar"].mean(), "repetition": g["repetition"].mean()})


def by_category(rows: pd.DataFrame) -> pd.DataFrame:
    """Pooled metrics per (method, category), plus category ``'all'`` per method."""
    per = rows.groupby(["method", "category"], sort=True).apply(_pool, include_groups=False).reset_index()
    tot = rows.groupby("method", sort=True).apply(_pool, include_groups=False).reset_index().assign(category=ALL)
    return pd.concat([per, tot[per.columns]], ignore_index=True)


def compare_tau(table: pd.DataFrame, methods: dict[str, str], metrics=("tau",)) -> pd.DataFrame:
    """Side-by-side table: one row per category, one column per (label, metric) for ``methods``
    (``{label: method name}``), e.g. DEER Table 3 ``{"stage1": ..., "stage2": ...}``. Adds
    ``delta_<metric>`` = last label − first label when exactly two methods are compared."""
    out = None
    for label, method in methods.items():
        part = table[table["method"] == method].set_index("category")[list(metrics)]
        part.columns = [f"{m}_{label}" for m in metrics]
        out = part if out is None else out.join(part, how="outer")
    labels = list(methods)
    if out is not None and len(labels) == 2:
        for m in metrics:
            out[f"delta_{m}"] = out[f"{m}_{labels[1]}"] - out[f"{m}_{labels[0]}"]
    return out.reset_index() if out is not None else pd.DataFrame()


def acceptance_histogram(emitted: pd.DataFrame) -> pd.DataFrame:
    """Distribution of accepted draft lengths per method: columns ``method``, ``accepted``, ``cycles``,
    ``share``; ``emitted`` has one row per cycle with ``method`` and ``accepted``."""
    h = emitted.groupby(["method", "accepted"]).size().rename("cycles").reset_index()
    h["share"] = h["cycles"] / h.groupby("method")["cycles"].transform("sum")
    return h
