"""Accuracy–TPF frontiers (NLD §6.1, Fig. 8): the confidence policy and the sampler policy swept over
thresholds on the same prompts and block length, compared at matched accuracy and matched TPF.

A frontier is the Pareto front (maximise TPF, maximise accuracy) of a policy's threshold sweep,
linearly interpolated between its points. Comparisons only use the accuracy / TPF range both
frontiers cover (no extrapolation).
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def pareto_front(points: pd.DataFrame, x: str = "tpf", y: str = "accuracy") -> pd.DataFrame:
    """Points not dominated in (max ``x``, max ``y``), sorted by increasing ``x`` (so ``y`` decreases)."""
    pts = points.sort_values([x, y], ascending=[False, False]).reset_index(drop=True)
    keep, best_y = [], -np.inf
    for i, r in pts.iterrows():
        if r[y] > best_y:
            keep.append(i)
            best_y = r[y]
    return pts.loc[keep].sort_values(x).reset_index(drop=True)


def tpf_at_accuracy(front: pd.DataFrame, accuracy: float, y: str = "accuracy") -> float:
    """Largest TPF on the (interpolated) front with accuracy ≥ ``accuracy``; NaN outside its range."""
    xs, ys = front["tpf"].to_numpy(float), front[y].to_numpy(float)
    if len(xs) == 0 or accuracy > ys.max() or accuracy < ys.min():
        return float("nan")
    # ys decreases with xs along a Pareto front: interpolate x as a function of y
    order = np.argsort(ys)
    return float(np.interp(accuracy, ys[order], xs[order]))


def accuracy_at_tpf(front: pd.DataFrame, tpf: float, y: str = "accuracy") -> float:
    """Accuracy of the interpolated front at ``tpf``; NaN outside its TPF range."""
    xs, ys = front["tpf"].to_numpy(float), front[y].to_numpy(float)
    if len(xs) == 0 or tpf < xs.min() or tpf > xs.max():
        return float("nan")
    return float(np.interp(tpf, xs, ys))


def area_under_front(front: pd.DataFrame, lo: float, hi: float, y: str = "accuracy") -> float:
    """Mean accuracy of the front over TPF ∈ [lo, hi], independent of any numerical grid.

    The front is interpolated linearly between its points (mixing the two settings of a segment across prompts
    reaches any point on it, in expectation), kept at its first accuracy below its smallest TPF and 0 beyond
    its largest TPF (no setting reaches that speed); the piecewise-linear function is integrated exactly over
    its breakpoints. A denser threshold grid can only add points to the front; it does not change how the
    area between two given points is computed. NaN for an empty front or ``hi ≤ lo``."""
    if hi <= lo or len(front) == 0:
        return float("nan")
    f = front.sort_values("tpf")
    xs, ys = f["tpf"].to_numpy(float), f[y].to_numpy(float)
    xmax = xs.max()
    cuts = sorted({lo, hi, *[x for x in xs if lo < x < hi], *([xmax] if lo < xmax < hi else [])})
    area = 0.0
    for a, b in zip(cuts[:-1], cuts[1:]):
        if b <= xmax:                                        # inside the front: trapezoid is exact on a line
            area += 0.5 * (np.interp(a, xs, ys) + np.interp(b, xs, ys)) * (b - a)
    return float(area / (hi - lo))


def common_tpf_range(a: pd.DataFrame, b: pd.DataFrame) -> tuple[float, float]:
    """``(1.0, hi)``: the TPF range both fronts reach, ``hi`` the smaller of their largest TPFs. Areas compared
    over it reward a higher curve, not a longer one: over the union range a front would score 0 accuracy past
    its last point, so a single fast, inaccurate setting could raise its area (NaN area when ``hi ≤ 1``)."""
    if len(a) == 0 or len(b) == 0:
        return 1.0, float("nan")
    return 1.0, float(min(a["tpf"].max(), b["tpf"].max()))


def compare_frontiers(conf: pd.DataFrame, samp: pd.DataFrame, y: str = "accuracy") -> dict:
    """Sampler vs confidence: TPF ratio at matched accuracy (at every confidence point inside the
    sampler's accuracy range), accuracy difference at matched TPF, areas under both fronts over the TPF range
    both reach, [1, the smaller of their largest TPFs] (:func:`common_tpf_range`)."""
    fc, fs = pareto_front(conf, y=y), pareto_front(samp, y=y)
    matched = []
    for _, r in fc.iterrows():
        t_s = tpf_at_accuracy(fs, r[y], y)
        matched.append({"accuracy": float(r[y]), "tpf_confidence": float(r["tpf"]), "tpf_sampler": t_s,
                        "tpf_ratio": t_s / r["tpf"] if not np.isnan(t_s) else float("nan"),
                        "threshold_confidence": float(r.get("threshold", np.nan))})
    at_tpf = []
    for _, r in fc.iterrows():
        a_s = accuracy_at_tpf(fs, r["tpf"], y)
        at_tpf.append({"tpf": float(r["tpf"]), "accuracy_confidence": float(r[y]), "accuracy_sampler": a_s})
    lo, hi = common_tpf_range(fc, fs)
    ratios = [m["tpf_ratio"] for m in matched if not np.isnan(m["tpf_ratio"])]
    return {"matched_accuracy": matched, "matched_tpf": at_tpf,
            "median_tpf_ratio": float(np.median(ratios)) if ratios else float("nan"),
            "area_confidence": area_under_front(fc, lo, hi, y), "area_sampler": area_under_front(fs, lo, hi, y),
            "area_range": [lo, hi]}


def plot_frontiers(conf: pd.DataFrame, samp: pd.DataFrame, path, y: str = "accuracy", title: str = "") -> None:
    """Both threshold sweeps and their Pareto fronts on one figure (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for df, name, c in [(conf, "confidence", "tab:blue"), (samp, "sampler", "tab:red")]:
        ax.scatter(df["tpf"], df[y], color=c, alpha=0.4, s=18)
        f = pareto_front(df, y=y)
        ax.plot(f["tpf"], f[y], "-o", color=c, label=f"{name} (Pareto front)", ms=4)
        for _, r in df.iterrows():
            ax.annotate(f"{r['threshold']:g}", (r["tpf"], r[y]), fontsize=6, color=c, xytext=(2, 2),
                        textcoords="offset points")
    ax.set_xlabel("tokens per forward (tpf)")
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title or "accuracy–TPF frontier (labels: threshold)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
