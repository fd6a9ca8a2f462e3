"""Run reports: markdown tables and matplotlib plots for a run directory (readable without the code)."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .harness import MODE_NAMES  # noqa: E402


def fmt(x, digits: int = 3) -> str:
    """Format a number for a markdown table (NaN → '–')."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown_table(df: pd.DataFrame, columns: list[str], headers: list[str] | None = None, digits: int = 3) -> str:
    """A GitHub-markdown table of ``columns`` of ``df``."""
    headers = headers or columns
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(fmt(r[c], digits) for c in columns) + " |")
    return "\n".join(lines)


def plot_accuracy_vs_tpf(summary: pd.DataFrame, path, accuracy: str = "agree_serial") -> None:
    """Accuracy-vs-TPF plot: one line per (mode, B) over thresholds for the confidence policy, the
    serial target (TPF = 1) and AR greedy marked. Saved as PNG at ``path``."""
    modes = sorted(summary["mode"].unique())
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        s = summary[summary["mode"] == mode]
        conf = s[s["policy"] == "confidence"]
        for b in sorted(conf["block_length"].unique()):
            c = conf[conf["block_length"] == b].sort_values("threshold", ascending=False)
            ax.plot(c["tpf"], c[accuracy], marker="o", label=f"confidence B={b}")
            for _, r in c.iterrows():
                ax.annotate(f"{r['threshold']:g}", (r["tpf"], r[accuracy]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ser = s[s["policy"] == "serial"]
        ax.scatter(ser["tpf"], ser[accuracy], marker="s", color="k", label="serial (k=1)", zorder=3)
        ax.set_xlabel("tokens per forward (tpf)")
        ax.set_ylabel(accuracy.replace("_", " "))
        ax.set_title(f"{MODE_NAMES.get(mode, mode)} mode (labels: threshold τ)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_training_curves(log_csv, path) -> bool:
    """Plot train/validation AR and diffusion losses from a Lightning CSV log. Returns False if absent."""
    try:
        log = pd.read_csv(log_csv)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for col, style in [("train/ar_loss", "-"), ("val/ar_loss", "o-"), ("val/diff_ce", "s-")]:
        if col in log:
            d = log[["step", col]].dropna()
            if col.startswith("train"):
                d = d.assign(**{col: d[col].rolling(20, min_periods=1).mean()})
            ax.plot(d["step"], d[col], style, label=col, ms=3)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("nats / token")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
