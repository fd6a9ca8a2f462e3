"""Evaluation of self-speculation against AR greedy on held-out prompts: a thin layer over the
evaluation harness (same prompts, batching, context modes and accuracy metrics) that adds the
speculation metrics of :mod:`workbench.speculative.metrics` (τ, max accepted, TPF, real TPF)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from tqdm.auto import tqdm

from ..evaluation.harness import decode_prompts
from ..evaluation.metrics import agreement, ar_nll, first_line, nan_mean, repetition_rate
from ..evaluation.prompts import Prompt
from .adapter import verifier_mode
from .metrics import real_tpf, row_metrics, tpf

AT_LEAST = 8
ACCURACY_COLUMNS = ("agree_ar", "token_acc", "first_line_exact", "ar_nll", "repetition", "real_repetition")


@dataclass(frozen=True)
class Method:
    """One decoding method: a ``name`` for the results, a registry ``policy`` (see
    :data:`workbench.decoding.POLICIES`) and its keyword ``options`` (e.g. ``draft_length``)."""

    name: str
    policy: str
    options: dict = field(default_factory=dict)


def default_methods(draft_lengths=(4, 8, 16), quadratic_draft_lengths=(4,), ensemble_lambdas=(1.0,),
                    temperature: float = 0.0, seed: int = 0, top_k: int = 0, top_p: float = 1.0) -> list[Method]:
    """Linear SS at every draft length and quadratic SS at every (draft length, λ), all at the same sampling
    settings (``top_k`` / ``top_p`` only when sampling)."""
    common = {"temperature": temperature, "seed": seed}
    if temperature > 0:
        common.update(top_k=top_k, top_p=top_p)
    out = [Method(f"linear_k{k}", "ss_linear", {"draft_length": k, **common}) for k in draft_lengths]
    out += [Method(f"quadratic_k{k}" + ("" if lam == 1.0 else f"_lam{lam:g}"), "ss_quadratic",
                   {"draft_length": k, "ensemble_lambda": lam, **common})
            for k in quadratic_draft_lengths for lam in ensemble_lambdas]
    return out


def _nll(model, prompts: list[Prompt], tokens, mode: str, block_length: int, bs: int, pad: int, precision: str):
    out = []
    with verifier_mode(model):
        for i in range(0, len(prompts), bs):
            chunk = prompts[i:i + bs]
            real = [list(p.real) for p in chunk] if mode == "real" else None
            out += ar_nll(model, [list(p.prompt) for p in chunk], tokens[i:i + bs], real, block_length, pad, precision)
    return out


def evaluate_speculation(model, tokenizer, prompts: list[Prompt], methods: list[Method], modes=("real", "free"),
                         block_length: int = 32, batch_size: int = 16, precision: str = "fp32",
                         progress_bar: bool = False) -> pd.DataFrame:
    """Decode ``prompts`` with AR greedy (the verifier: adapter disabled) and every method, per context
    mode; one row per (mode, method, prompt).

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM` (its backbone may carry a LoRA drafter).
        tokenizer: the checkpoint's tokenizer (pad id, decoding of the text column).
        prompts: held-out prompts (:func:`~workbench.evaluation.prompts.make_prompts`); all continuations
            the same length ``gen_len``.
        methods: methods to compare (AR greedy is always run first as the reference).
        modes: 'real' (context reset to the real continuation every ``block_length`` tokens) and/or 'free'.
        block_length: real-context segment length (must divide ``gen_len``).
        batch_size: prompts decoded in lockstep. precision: 'fp32' or 'bf16'.

    Columns: identifiers (``prompt_id, path, category, mode, method, policy, draft_length,
    ensemble_lambda``), counters (``tokens, forwards, extra_forwards, cycles``), speculation metrics
    (``tau, max_accepted, cycles_accept_ge8, share_accept_ge8, tpf, tpf_real``), accuracy metrics
    (``agree_ar`` with AR greedy in the same mode, ``token_acc`` vs the real continuation,
    ``first_line_exact``, ``ar_nll``, ``repetition``, ``real_repetition``), ``tokens_per_s`` and ``wall_s``
    of the whole method run, and the generated ``text``.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = []
    runs = [(mode, m) for mode in modes for m in [Method("ar_greedy", "ar_greedy")] + list(methods)]
    ar_ref = {}
    for mode, m in tqdm(runs, desc="speculate", disable=not progress_bar):
        kw = {"precision": precision, "block_length": block_length, **m.options}
        if m.policy == "ar_greedy":
            with verifier_mode(model):
                res = decode_prompts(model, m.policy, prompts, mode, batch_size, pad, **kw)
            ar_ref.setdefault(mode, res)
        else:
            res = decode_prompts(model, m.policy, prompts, mode, batch_size, pad, **kw)
        nll = _nll(model, prompts, res.tokens, mode, block_length, batch_size, pad, precision)
        n_tok = sum(len(t) for t in res.tokens)
        for i, p in enumerate(prompts):
            gen = res.tokens[i]
            text, real_text = tokenizer.decode(gen), tokenizer.decode(list(p.real))
            rows.append(dict(
                prompt_id=p.prompt_id, path=p.path, category=p.category, mode=mode, method=m.name, policy=m.policy,
                draft_length=int(m.options.get("draft_length", 0)),
                ensemble_lambda=float(m.options.get("ensemble_lambda", float("nan"))),
                forwards=res.forwards[i], extra_forwards=res.extra_forwards[i], **row_metrics(res, i, AT_LEAST),
                agree_ar=agreement(gen, ar_ref[mode].tokens[i]), token_acc=agreement(gen, p.real),
                first_line_exact=float(first_line(text) == first_line(real_text)), ar_nll=nll[i],
                repetition=repetition_rate(gen), real_repetition=repetition_rate(list(p.real)),
                tokens_per_s=n_tok / max(res.wall_time, 1e-9), wall_s=res.wall_time, text=text))
    return pd.DataFrame(rows)


def _pooled(g: pd.DataFrame) -> pd.Series:
    tokens, cycles = int(g["tokens"].sum()), int(g["cycles"].sum())
    fw, extra = int(g["forwards"].sum()), int(g["extra_forwards"].sum())
    out = {"n_prompts": len(g), "tokens": tokens, "cycles": cycles,
           "tau": tokens / cycles if cycles else float("nan"),
           "max_accepted": int(g["max_accepted"].max()),
           f"share_accept_ge{AT_LEAST}": g[f"cycles_accept_ge{AT_LEAST}"].sum() / cycles if cycles else float("nan"),
           "tpf": tpf(tokens, fw), "tpf_real": real_tpf(tokens, fw, extra)}
    out.update({c: nan_mean(g[c].tolist()) for c in ACCURACY_COLUMNS})
    out["tokens_per_s"] = float(g["tokens_per_s"].mean())
    return pd.Series(out)


def summarize_speculation(df: pd.DataFrame) -> pd.DataFrame:
    """Per (mode, method, category) and overall (``category = 'all'``): pooled τ (Σ tokens ÷ Σ cycles),
    max accepted, share of cycles accepting ≥ 8 drafts, TPF, real TPF (ratios of sums), mean accuracy
    metrics, tokens/s of the method run, and ``speedup_vs_ar`` (tokens/s ÷ AR greedy's in that mode)."""
    keys = ["mode", "method", "policy", "draft_length", "ensemble_lambda"]
    per_cat = df.groupby(keys + ["category"], dropna=False).apply(_pooled, include_groups=False).reset_index()
    overall = df.groupby(keys, dropna=False).apply(_pooled, include_groups=False).reset_index().assign(category="all")
    out = pd.concat([overall, per_cat], ignore_index=True)
    ar = out[out["method"] == "ar_greedy"].set_index(["mode", "category"])["tokens_per_s"]
    out["speedup_vs_ar"] = [r.tokens_per_s / ar.get((r.mode, r.category), float("nan")) for r in out.itertuples()]
    return out


__all__ = ["Method", "default_methods", "evaluate_speculation", "summarize_speculation"]
