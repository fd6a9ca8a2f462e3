"""Per-prompt metrics of a decoded continuation (DESIGN.md evaluation task)."""
from __future__ import annotations

import math
import re

import numpy as np
import torch

from ..decoding.base import autocast_for, left_pad
from ..decoding.sampling import warp_logits
from ..model.masks import to_additive
from ..model.unlikelihood import repeated_ngram_starts  # noqa: F401  (re-exported)


def agreement(a, b) -> float:
    """Fraction of positions where ``a`` and ``b`` hold the same token, over the longer of the two (a
    position only one of them reached, e.g. after the other stopped at EOS, disagrees)."""
    n = max(len(a), len(b))
    if not n:
        return float("nan")
    return sum(x == y for x, y in zip(a, b)) / n


def repetition_rate(tokens, n: int = 8) -> float:
    """Share of the ``n``-grams of ``tokens`` that already occurred earlier in the same sequence
    (0 = no repeated n-gram; runs of one token or looping lines push it towards 1)."""
    starts = repeated_ngram_starts(tokens, n)
    return sum(starts) / len(starts) if starts else float("nan")


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A Python identifier (or keyword): the words :func:`oov_word_rate` counts."""


def identifier_words(text: str, min_len: int = 4, drop_last_partial: bool = False) -> list[str]:
    """Identifiers of ``text`` with at least ``min_len`` characters, in order. With
    ``drop_last_partial``, a word that touches the end of ``text`` is left out (a continuation cut at a
    token budget may end inside a word)."""
    words = [(m.group(), m.end()) for m in IDENTIFIER.finditer(text)]
    return [w for w, end in words if len(w) >= min_len and not (drop_last_partial and end == len(text))]


def known_words(texts, min_len: int = 4) -> set[str]:
    """The set of identifiers (≥ ``min_len`` characters) of ``texts``, e.g. the train split's files."""
    out: set[str] = set()
    for t in texts:
        out.update(identifier_words(t, min_len))
    return out


def oov_word_rate(text: str, known: set[str], min_len: int = 4) -> float:
    """Share of the identifiers (≥ ``min_len`` characters) of a continuation ``text`` that never occur in
    ``known`` (out-of-vocabulary words, e.g. ``assertEquat``). A word cut by the end of ``text`` is not
    counted. A model that escapes a loop by misspelling lowers :func:`repetition_rate` but raises this.
    NaN when ``text`` has no such word."""
    words = identifier_words(text, min_len, drop_last_partial=True)
    return sum(w not in known for w in words) / len(words) if words else float("nan")


def first_line(text: str) -> str:
    """``text`` up to its first newline."""
    return text.split("\n", 1)[0]


def whitespace_ids(tokenizer, vocab_size: int) -> set[int]:
    """Token ids whose text is only whitespace (space, tab, newline...)."""
    out = set()
    for i in range(min(vocab_size, len(tokenizer))):
        s = tokenizer.decode([i])
        if s and not s.strip() and s not in (tokenizer.mask_token, tokenizer.eos_token):
            out.add(i)
    return out


def whitespace_share(tokens, ws: set[int]) -> float:
    """Share of whitespace ids ``ws`` among ``tokens`` (NaN for an empty sequence)."""
    return sum(t in ws for t in tokens) / len(tokens) if len(tokens) else float("nan")


def whitespace_share_multi(step_tokens: list[list[int]], ws: set[int]) -> tuple[float, int]:
    """Share of whitespace among tokens committed in forwards that committed ≥ 2 tokens, and their count.
    NaN when no forward committed more than one token."""
    multi = [t for step in step_tokens if len(step) >= 2 for t in step]
    if not multi:
        return float("nan"), 0
    return sum(t in ws for t in multi) / len(multi), len(multi)


@torch.no_grad()
def ar_token_logprobs(model, prompts: list[list[int]], generated: list[list[int]], real: list[list[int]] | None = None,
                      block_length: int | None = None, pad_id: int = 0, precision: str = "fp32",
                      temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> list[list[float]]:
    """Per-token AR log-probabilities ``log p(g_i | context)`` of ``generated`` under the model's AR mode (with a
    gated LoRA: the base model), at ``temperature`` (``softmax(logits / T)``, filtered by ``top_k`` / ``top_p`` as
    :func:`~workbench.decoding.sampling.sampling_probs` does: ``-inf`` for a token outside the filters). Rows may have different lengths
    (a decode stopped at EOS); each row's list has its own length.

    Free-running (``real=None``): the context is the prompt and ``g_<i``. Real-context: each generated block is
    scored given the prompt + the *real* text before the block and the generated tokens before it inside the
    block. One forward per batch does all blocks: the sequence is ``[prompt | real | generated]`` with the
    generated copy sharing the real tokens' position ids and seeing the prompt, the real tokens before its block
    and its own block causally.
    """
    from ..model.gated_lora import lora_positions

    dev = model.device
    ids, valid = left_pad(prompts, pad_id, dev)
    n, p = ids.shape
    lengths = [len(g) for g in generated]
    m = max(lengths) if lengths else 0
    if m == 0:
        return [[] for _ in generated]
    gen = torch.tensor([list(g) + [pad_id] * (m - len(g)) for g in generated], dtype=torch.long, device=dev)
    ones = torch.ones((n, m), dtype=torch.bool, device=dev)
    with autocast_for(dev, precision), lora_positions(model, False):
        if real is None:
            seq = torch.cat([ids, gen], 1)
            kv = torch.cat([valid, ones], 1)
            # the LM head on the m positions that predict g only (the last m + 1 but the very last)
            pred = model.extend(seq, model.new_cache(), kv, logits_to_keep=m + 1)[:, :m]
        else:
            b = block_length or m
            rl = torch.tensor([list(r)[:m] for r in real], dtype=torch.long, device=dev)
            seq = torch.cat([ids, rl, gen], 1)
            s = seq.shape[1]
            kv = torch.cat([valid, ones, ones], 1)
            pos_valid = (torch.cat([valid, ones], 1).long().cumsum(1) - 1).clamp_min(0)
            pos = torch.cat([pos_valid, pos_valid[:, p:]], 1)
            allowed = torch.zeros((s, s), dtype=torch.bool, device=dev)
            causal = torch.tril(torch.ones((p + m, p + m), dtype=torch.bool, device=dev))
            allowed[:p + m, :p + m] = causal
            gi = torch.arange(m, device=dev)
            blk = gi // b
            # generated token i sees prompt + real[: blk*b] ...
            allowed[p + m + gi[:, None], torch.arange(p + m, device=dev)[None, :]] = (
                torch.arange(p + m, device=dev)[None, :] < (p + blk * b)[:, None])
            # ... and the generated tokens of its own block up to itself
            same = (blk[:, None] == blk[None, :]) & (gi[None, :] <= gi[:, None])
            allowed[p + m:, p + m:] = same
            full = allowed[None] & kv[:, None, :]
            full |= torch.eye(s, dtype=torch.bool, device=dev)[None]
            first = p - 1 + blk * b  # logit index predicting the first token of each block
            idx = torch.where(gi % b == 0, first, p + m + gi - 1)
            # the LM head on those m positions only (not the prompt's and the real copy's)
            pred = model.call_backbone(seq, pos, to_additive(full, model.mask_dtype), logits_to_keep=idx)
    z = pred.float()
    if model.gated and model.has_mask_token:
        z[..., model.mask_token_id] = float("-inf")       # the base model has no mask token
    z = warp_logits(z, temperature, top_k, top_p)
    logp = torch.log_softmax(z, -1).gather(-1, gen[..., None]).squeeze(-1)
    return [row[:k] for row, k in zip(logp.tolist(), lengths)]


def ar_nll(model, prompts: list[list[int]], generated: list[list[int]], real: list[list[int]] | None = None,
           block_length: int | None = None, pad_id: int = 0, precision: str = "fp32") -> list[float]:
    """AR negative log-likelihood (nats per token) of ``generated`` under the model's AR mode: the mean of
    :func:`ar_token_logprobs` per row (see there for the context modes). Returns one float per row."""
    return [-sum(r) / len(r) if r else float("nan")
            for r in ar_token_logprobs(model, prompts, generated, real, block_length, pad_id, precision)]


def introspective_acceptance(q: list[list[float]], logp: list[list[float]]) -> float:
    """I-DLM §2: α = (1/L) Σ_k min(1, p_k(x_k) / q_k(x_k)) over every token of every row.

    ``q[r][k]``: the probability the decoder gave its token ``x_k`` where it drew or picked it; ``logp[r][k]``:
    log of the causal AR probability of ``x_k`` with every earlier token revealed (:func:`ar_token_logprobs`).
    NaN when no token carries a ``q``."""
    ratios = [min(1.0, math.exp(lp) / qq) if qq > 0 else 1.0
              for qs, lps in zip(q, logp) for qq, lp in zip(qs, lps)]
    return sum(ratios) / len(ratios) if ratios else float("nan")


def nan_mean(xs) -> float:
    """Mean of ``xs`` ignoring ``None`` and NaN; NaN when nothing is left."""
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else float("nan")
