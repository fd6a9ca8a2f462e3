"""Validation acceptance against training tokens, over every leg of a shipped adapter.

Reads ``<asset>/workbench.json`` (its ``legs``: steps, train_tokens, log file per leg) and each leg's training log
(Lightning CSV, steps counted from 0 in every leg), and plots ``val/tau`` (linear self-speculation τ decoded on the
held-out prompts, NLD §3.3) and ``val/tau_tf`` (teacher-forced τ) against the cumulative training tokens, one marker
per leg. A ``--branch`` adds a run that continued the same leg but was not shipped (the text arm of the
comparison of training data), drawn from the tokens where it branched off. Usage::

    python scripts/plot_legs.py workbench/assets/smollm2-135m-trimode docs/smollm2_val_tau.png \
        --branch "leg 4, data arm (stdlib text)" docs/smollm2_trimode_leg4_text_log.csv 3 \
        --branch "leg 6, fresh answers" docs/smollm2_trimode_leg6_distill_log.csv 5 16384
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def leg_points(asset: Path) -> pd.DataFrame:
    """One row per validation of every leg: ``leg, step, tokens`` (cumulative over legs), ``val/tau``,
    ``val/tau_tf``, ``device``. Raises ``FileNotFoundError`` / ``ValueError`` for a missing file or a leg
    without ``steps`` and ``train_tokens``."""
    meta = json.loads((asset / "workbench.json").read_text())
    rows, offset = [], 0
    for leg in meta["legs"]:
        if not leg.get("steps") or not leg.get("train_tokens"):
            raise ValueError(f"leg {leg.get('leg')} of {asset} records no steps / train_tokens")
        rows += _val_rows(pd.read_csv(asset / leg["log"]), leg["leg"], offset, leg["train_tokens"] / leg["steps"],
                          leg.get("device", ""))
        offset += leg["train_tokens"]
    return pd.DataFrame(rows)


def _val_rows(log: pd.DataFrame, leg, offset: float, per_step: float, device: str) -> list[dict]:
    """The validation rows of one Lightning CSV ``log`` as :func:`leg_points` rows, ``offset`` tokens in."""
    val = log[log["val/tau"].notna()] if "val/tau" in log else log.iloc[:0]
    rows = []
    for _, r in val.iterrows():
        step = int(r["step"]) + 1         # Lightning logs validation after `step` optimizer steps counted from 0
        rows.append({"leg": leg, "step": step, "tokens": offset + step * per_step, "val/tau": r["val/tau"],
                     "val/tau_tf": r.get("val/tau_tf"), "device": device})
    return rows


#: What ``val/tau`` decodes, and the issue's target for it, by training objective.
OBJECTIVES = {"nld": ("linear self-speculation τ, k = {k}", 2.5), "idlm": ("ISD tokens per forward, N = {k}", 2.0)}


def branch_points(asset: Path, log: Path, after_leg: int, label: str,
                  tokens_per_step: float | None = None) -> pd.DataFrame:
    """The validation rows of a run that continued ``asset`` after leg ``after_leg`` without being shipped, in the
    columns of :func:`leg_points` (``leg`` = ``label``); its tokens per step are ``tokens_per_step`` (batch ×
    sequence length) or, when not given, those of leg ``after_leg + 1``.
    Raises ``ValueError`` when ``asset`` has no leg ``after_leg`` (or, without ``tokens_per_step``, no leg
    ``after_leg + 1``) or the log no validation row, ``FileNotFoundError`` for a missing log."""
    legs = json.loads((asset / "workbench.json").read_text())["legs"]
    if tokens_per_step is not None and not tokens_per_step > 0:
        raise ValueError(f"--branch tokens per step must be positive, got {tokens_per_step}")
    last = len(legs) if tokens_per_step is not None else len(legs) - 1
    if not 1 <= after_leg <= last:
        raise ValueError(f"--branch after leg {after_leg}: {asset} has legs 1..{len(legs)}, and a branch needs the "
                         "shipped leg after it for its tokens per step" +
                         ("" if tokens_per_step is not None else " (or give them)"))
    nxt = legs[after_leg] if after_leg < len(legs) else {}
    per_step = tokens_per_step if tokens_per_step is not None else nxt["train_tokens"] / nxt["steps"]
    rows = _val_rows(pd.read_csv(log), label, sum(leg["train_tokens"] for leg in legs[:after_leg]),
                     per_step, nxt.get("device", ""))
    if not rows:
        raise ValueError(f"{log} has no validation rows (val/tau): nothing to plot for the branch {label!r}")
    return pd.DataFrame(rows)


def plot(points: pd.DataFrame, out: Path, title: str, objective: str = "nld", k: int = 8,
         branches: list[pd.DataFrame] = ()) -> None:
    """Write the plot of :func:`leg_points` (and of each :func:`branch_points` frame in ``branches``, grey) to
    ``out`` (PNG); ``objective`` / ``k`` label the decoded acceptance (:data:`OBJECTIVES`) and draw its target."""
    what, target = OBJECTIVES[objective]
    fig, ax = plt.subplots(figsize=(9.6, 4.6))
    for leg, g in points.groupby("leg"):
        dev = "GPU" if "GPU" in str(g["device"].iloc[0]) or "H100" in str(g["device"].iloc[0]) else "CPU"
        ax.plot(g["tokens"] / 1e6, g["val/tau"], "o-", label=f"leg {leg} ({dev}): {what.format(k=k)}")
        if g["val/tau_tf"].notna().any():
            ax.plot(g["tokens"] / 1e6, g["val/tau_tf"], "x--", alpha=0.6, label=f"leg {leg}: teacher-forced τ")
    for b in branches:
        ax.plot(b["tokens"] / 1e6, b["val/tau"], "s-", color="grey", label=f"{b['leg'].iloc[0]} (not shipped)")
    ax.axhline(target, color="grey", lw=0.8, ls=":", label=f"target ≥ {target}")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("validation acceptance (tokens per cycle)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("asset", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--branch", nargs="+", action="append", default=[],
                    metavar="LABEL LOG_CSV AFTER_LEG [TOKENS_PER_STEP]",
                    help="a run that continued leg AFTER_LEG and was not shipped, with its Lightning CSV log; "
                         "TOKENS_PER_STEP (batch x sequence length) is needed after the last shipped leg")
    a = ap.parse_args()
    for b in a.branch:
        if len(b) not in (3, 4):
            ap.error(f"--branch takes LABEL LOG_CSV AFTER_LEG [TOKENS_PER_STEP], got {len(b)} values")
    pts = leg_points(a.asset)
    branches = [branch_points(a.asset, Path(b[1]), int(b[2]), b[0], float(b[3]) if len(b) == 4 else None)
                for b in a.branch]
    print(pd.concat([pts, *branches]).drop(columns="device").to_string(index=False))
    meta = json.loads((a.asset / "workbench.json").read_text())
    k = (meta.get("train_config") or {}).get("val_draft_length", 8)
    plot(pts, a.out, f"{a.asset.name}: validation acceptance over the legs", meta.get("objective", "nld"), k, branches)


if __name__ == "__main__":
    main()
