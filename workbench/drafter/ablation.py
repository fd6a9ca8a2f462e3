"""Loss-variant ablation of LoRA drafters (NLD §3.3; LK paper): one adapter per loss variant, trained
with the same config, steps, seed and data, then evaluated with linear self-speculation.

Each variant trains into ``<out_dir>/<loss>/`` with :func:`~workbench.drafter.train.train_lora`
(resumable; a finished run is reused as is). The table holds one row per drafter (the adapter-free
``base`` and every variant) and context mode with the validation metrics of training (best
``val/tau_greedy``, ``val/tau_expected``) and the linear-SS τ, TPF, real TPF and agreement with AR.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..evaluation.report import markdown_table
from .evaluate import BASE

ABLATION_COLUMNS = ["drafter", "mode", "method", "tau", "tau_gain", "tpf", "tpf_real", "tpf_gain", "max_accepted",
                    "share_accept_ge8", "agree_ar", "val_tau_greedy", "val_tau_expected", "train_steps"]


def train_variants(base_cfg, losses: list[str], out_dir: Path) -> dict[str, Path]:
    """Train (or reuse) one adapter per loss in ``losses`` from ``base_cfg`` (a LoraTrainConfig); returns
    loss → run directory. A run is reused when its ``metrics.json`` reports ``base_cfg.max_steps`` steps."""
    from dataclasses import replace

    from .train import train_lora

    runs = {}
    for loss in losses:
        run = out_dir / loss
        cfg = replace(base_cfg, loss=loss, out_dir=str(run), drafter_adapter="new")   # evaluated as a stacked LoRA
        cfg.validate()
        done = run / "metrics.json"
        if not (done.is_file() and json.loads(done.read_text()).get("global_step") == cfg.max_steps
                and (run / "adapter" / "adapter_config.json").is_file()):
            train_lora(cfg)
        runs[loss] = run
    return runs


def _validation_metrics(run: Path) -> dict:
    """Validation metrics of a run's best checkpoint (``metrics.json``: ``best_validation``)."""
    metrics = json.loads((run / "metrics.json").read_text())
    best = metrics.get("best_validation") or {}
    return {"val_tau_greedy": best.get("val/tau_greedy", float("nan")),
            "val_tau_expected": best.get("val/tau_expected", float("nan")), "train_steps": int(metrics["global_step"])}


def ablation_table(gains: pd.DataFrame, runs: dict[str, Path]) -> pd.DataFrame:
    """Overall rows (``category = 'all'``) of :func:`~workbench.drafter.evaluate.gain_table` joined with
    the validation metrics of each variant's run (NaN for ``base``)."""
    t = gains[gains["category"] == "all"].copy()
    extra = {name: _validation_metrics(run) for name, run in runs.items()}
    for col in ("val_tau_greedy", "val_tau_expected", "train_steps"):
        t[col] = [extra.get(d, {}).get(col, float("nan")) for d in t["drafter"]]
    order = {BASE: -1, **{k: i for i, k in enumerate(runs)}}
    t["_order"] = [order.get(d, len(order)) for d in t["drafter"]]
    t = t.sort_values(["mode", "method", "_order"], kind="stable")
    return t[[c for c in ABLATION_COLUMNS if c in t.columns]].reset_index(drop=True)


def ablation_markdown(table: pd.DataFrame, title: str = "LoRA drafter loss ablation") -> str:
    """The ablation table as markdown (τ gains relative to the adapter-free drafter)."""
    cols = [c for c in ABLATION_COLUMNS if c in table.columns]
    table = table.copy()
    for c in ("max_accepted", "train_steps"):        # counts: integers, '–' where missing
        if c in table.columns:
            table[c] = ["–" if pd.isna(x) else str(int(x)) for x in table[c]]
    return f"# {title}\n\n" + markdown_table(table, cols) + "\n"
