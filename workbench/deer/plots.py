"""Figures of ``workbench deer eval`` (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_acceptance(cycles: pd.DataFrame, table: pd.DataFrame, path: str | Path) -> None:
    """Two panels: (a) share of cycles accepting < 8 vs ≥ 8 draft tokens per speculative method (DEER
    Fig. 4); (b) τ per category and method. ``cycles``: one row per cycle (``method``, ``accepted``);
    ``table``: :func:`~workbench.deer.tables.by_category` output."""
    plt = _plt()
    spec = cycles[cycles["method"] != "ar"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    if len(spec):
        long = spec.assign(long=spec["accepted"] >= 8).groupby("method")["long"].mean()
        a.bar(long.index, 1 - long.values, label="< 8 accepted")
        a.bar(long.index, long.values, bottom=1 - long.values, label="≥ 8 accepted")
        a.set_ylabel("share of cycles")
        a.set_title("accepted draft length per cycle (DEER Fig. 4)")
        a.legend()
        a.tick_params(axis="x", rotation=20)
    t = table[(table["method"] != "ar") & (table["category"] != "all")]
    piv = t.pivot(index="category", columns="method", values="tau")
    if len(piv):
        piv.plot.bar(ax=b, width=0.85)
        b.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        b.set_ylabel("τ (tokens per cycle)")
        b.set_title("acceptance length by category")
        b.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_alpha(curves: pd.DataFrame, finals: pd.DataFrame, path: str | Path, ema: float = 0.9) -> None:
    """α sensitivity of Stage II (DEER Fig. 6): (a) EMA-smoothed training loss vs step per α; (b) the
    simulated greedy τ on validation rows vs step, the legend giving each α's decoded τ."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    final = dict(zip(finals["alpha"], finals["tau"])) if len(finals) else {}
    for alpha, g in curves.groupby("alpha"):
        tr = g.dropna(subset=["train/loss"]).sort_values("step") if "train/loss" in g else g.iloc[:0]
        if len(tr):
            a.plot(tr["step"], tr["train/loss"].ewm(alpha=1 - ema).mean(), label=f"α = {alpha:g}")
        va = g.dropna(subset=["val/tau"]).sort_values("step") if "val/tau" in g else g.iloc[:0]
        if len(va):
            tau = final.get(alpha, float("nan"))
            b.plot(va["step"], va["val/tau"], marker="o", label=f"α = {alpha:g} (decoded τ {tau:.2f})")
    a.set_xlabel("Stage II step")
    a.set_ylabel(f"training loss (EMA {ema})")
    a.set_title("Stage II loss (DEER Fig. 6)")
    b.set_xlabel("Stage II step")
    b.set_ylabel("simulated greedy τ (validation)")
    b.set_title("τ during Stage II")
    for ax in (a, b):
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
