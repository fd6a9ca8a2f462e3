"""Evaluation of LoRA drafters: linear self-speculation with and without an adapter (NLD §3.3, Tab. 6).

A thin layer over :func:`workbench.speculative.evaluate.evaluate_speculation` (same held-out prompts,
context modes, accuracy metrics and speculation metrics: τ = tokens emitted per cycle, TPF = tokens ÷
draft forwards, real TPF = tokens ÷ draft + verify forwards, max accepted, share of cycles accepting ≥ 8
drafts, tokens/s). Each drafter is a name → adapter directory (``None`` = the model's own diffusion
pathway without adapter, named ``base``); the verifier is always the adapter-free AR pathway.
"""
from __future__ import annotations

import pandas as pd

from ..evaluation.prompts import Prompt
from ..speculative.evaluate import Method, evaluate_speculation, summarize_speculation
from .lora import load_adapter

BASE = "base"
#: Columns of the with/without-adapter comparison (per mode, method, category).
GAIN_METRICS = ("tau", "tpf", "tpf_real", "max_accepted", "share_accept_ge8", "agree_ar", "token_acc",
                "tokens_per_s")


def linear_methods(draft_lengths=(8,), temperature: float = 0.0, seed: int = 0) -> list[Method]:
    """Linear self-speculation at each draft length (greedy by default)."""
    return [Method(f"linear_k{k}", "ss_linear", {"draft_length": k, "temperature": temperature, "seed": seed})
            for k in draft_lengths]


def evaluate_drafters(load_base, drafters: dict[str, str | None], tokenizer, prompts: list[Prompt],
                      methods: list[Method], modes=("real", "free"), block_length: int = 32, batch_size: int = 16,
                      precision: str = "fp32", progress_bar: bool = False) -> pd.DataFrame:
    """Per-prompt results of every drafter under ``methods``.

    Args:
        load_base: ``() -> TriModeLM``, a fresh adapter-free model per call.
        drafters: name → peft adapter directory, or ``None`` for the adapter-free drafter.
        tokenizer, prompts, methods, modes, block_length, batch_size, precision, progress_bar: see
            :func:`~workbench.speculative.evaluate.evaluate_speculation`.

    Returns the rows of :func:`evaluate_speculation` with a ``drafter`` column; the AR-greedy reference
    (the verifier, identical for every drafter) is kept once, with ``drafter = 'ar'``.

    Raises ``FileNotFoundError`` for an adapter directory without ``adapter_config.json``.
    """
    parts = []
    for i, (name, adapter) in enumerate(drafters.items()):
        model = load_base()
        if adapter is not None:
            load_adapter(model, adapter)
        model.eval()
        df = evaluate_speculation(model, tokenizer, prompts, methods, modes, block_length, batch_size, precision,
                                  progress_bar)
        is_ar = df["method"] == "ar_greedy"
        df["drafter"] = name
        df.loc[is_ar, "drafter"] = "ar"
        parts.append(df if i == 0 else df[~is_ar])
    return pd.concat(parts, ignore_index=True)


def summarize_drafters(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`~workbench.speculative.evaluate.summarize_speculation` per drafter (column ``drafter``):
    pooled τ, TPF, real TPF, accuracy metrics and tokens/s per (mode, method, category) and overall
    (``category = 'all'``)."""
    out = []
    ar = df[df["drafter"] == "ar"]
    for name in [d for d in df["drafter"].unique() if d != "ar"]:
        s = summarize_speculation(pd.concat([ar, df[df["drafter"] == name]], ignore_index=True))
        s.insert(0, "drafter", name)
        s.loc[s["method"] == "ar_greedy", "drafter"] = "ar"
        out.append(s if not out else s[s["method"] != "ar_greedy"])
    return pd.concat(out, ignore_index=True)


def gain_table(summary: pd.DataFrame, reference: str = BASE, metrics=GAIN_METRICS) -> pd.DataFrame:
    """One row per (drafter, mode, method, category) with ``metrics`` and the relative change of τ, TPF
    and real TPF against ``reference`` (``tau_gain`` = τ / τ_reference − 1, ...). AR rows are left out."""
    keys = ["mode", "method", "category"]
    spec = summary[summary["method"] != "ar_greedy"]
    ref = spec[spec["drafter"] == reference].set_index(keys)
    rows = spec[["drafter", *keys, *[m for m in metrics if m in spec.columns]]].copy()
    for m in ("tau", "tpf", "tpf_real"):
        base = [ref[m].get(tuple(r[k] for k in keys), float("nan")) for _, r in rows.iterrows()]
        rows[f"{m}_gain"] = rows[m].to_numpy() / pd.Series(base, dtype=float).to_numpy() - 1.0
    return rows.reset_index(drop=True)


__all__ = ["BASE", "GAIN_METRICS", "linear_methods", "evaluate_drafters", "summarize_drafters", "gain_table"]
