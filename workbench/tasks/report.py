"""Accuracy against parallelism: AUP per decoder over a table of settings, and the accuracy-vs-TPF plot that goes in
a task run's folder (and the demo report)."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .metrics import aup


def aup_by_decoder(points: pd.DataFrame, decoder: str = "decoder", tpf: str = "tpf", accuracy: str = "pass@1"
                   ) -> dict[str, float]:
    """AUP (:func:`~workbench.tasks.metrics.aup`) of each decoder over its rows of ``points``: ``tpf`` against
    ``accuracy`` (a fraction, taken in percent), with ``y_max`` the best accuracy of the whole table. Rows with a
    missing value are left out; a decoder with none left gets NaN."""
    ok = points.dropna(subset=[tpf, accuracy])
    ok = ok[ok[tpf] > 0]
    if not len(ok):
        return {name: math.nan for name in points[decoder].unique()}
    y_max = 100.0 * float(ok[accuracy].max())
    out = {}
    for name in points[decoder].unique():
        part = ok[ok[decoder] == name]
        out[name] = aup(list(zip(part[tpf], 100.0 * part[accuracy])), y_max) if len(part) else math.nan
    return out


def plot_accuracy_vs_tpf(points: pd.DataFrame, path: str | Path, title: str = "", decoder: str = "decoder",
                         tpf: str = "tpf", accuracy: str = "pass@1") -> None:
    """Write a PNG of ``accuracy`` (percent) against ``tpf``: one line per decoder through its settings (sorted by
    tpf), its AUP in the legend, AR greedy's accuracy as a horizontal line where the table has it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aups = aup_by_decoder(points, decoder, tpf, accuracy)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, g in points.dropna(subset=[tpf, accuracy]).groupby(decoder, sort=True):
        g = g.sort_values(tpf)
        label = f"{name} (AUP {aups[name]:.1f})" if not math.isnan(aups.get(name, math.nan)) else str(name)
        ax.plot(g[tpf], 100.0 * g[accuracy], "o-" if len(g) > 1 else "o", ms=4, label=label)
    ar = points[points[decoder] == "ar_greedy"].dropna(subset=[accuracy])
    if len(ar):
        ax.axhline(100.0 * float(ar[accuracy].iloc[0]), color="grey", ls=":", lw=1)
    ax.set_xlabel("tokens per target forward (tpf)")
    ax.set_ylabel(f"{accuracy} (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["aup_by_decoder", "plot_accuracy_vs_tpf"]
