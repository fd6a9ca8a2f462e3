"""Shared machinery of linear and quadratic self-speculation (NLD §3.3, App. C): draft sampling, the
acceptance call, per-row bookkeeping and the segment loop of free-running / real-context decoding."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..decoding.base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, sampling_probs
from .accept import AcceptResult, greedy_accept, speculative_accept
from .context import SpecContext


def masked_draft_logits(logits: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """Diffusion logits ``(..., V)`` as float with the mask token forbidden (a draft never proposes [MASK])."""
    out = logits.float().clone()
    out[..., mask_token_id] = float("-inf")
    return out


def pick_draft(logits: torch.Tensor, temperature: float, generator: torch.Generator, top_k: int = NO_TOP_K,
               top_p: float = NO_TOP_P) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft tokens from drafter logits ``(N, k, V)``.

    Temperature 0: argmax, returns ``(draft (N, k), None)``. Temperature > 0: each position sampled
    independently from ``q = sampling_probs(logits, T, top_k, top_p)``
    (:func:`~workbench.decoding.sampling.sampling_probs`); returns ``(draft, q (N, k, V))``.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1), None
    q = sampling_probs(logits, temperature, top_k, top_p)
    n, k, v = q.shape
    draft = torch.multinomial(q.reshape(n * k, v), 1, generator=generator).reshape(n, k)
    return draft, q


def verify(draft: torch.Tensor, q: torch.Tensor | None, verifier: torch.Tensor, temperature: float,
           generator: torch.Generator, probs: bool = False, top_k: int = NO_TOP_K,
           top_p: float = NO_TOP_P) -> AcceptResult:
    """Accept a draft ``(N, k)`` against ``verifier`` ``(N, k + 1, V)`` (logits, or the sampling distribution
    itself when ``probs``): :func:`greedy_accept` at temperature 0, else :func:`speculative_accept` with
    ``p = sampling_probs(verifier, T, top_k, top_p)`` and the drafter's ``q`` ``(N, k, V)``, warped alike
    (lossless with respect to the warped ``p``)."""
    if temperature <= 0:
        return greedy_accept(draft, verifier)
    p = verifier if probs else sampling_probs(verifier, temperature, top_k, top_p)
    return speculative_accept(draft, q, p, generator)


def token_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int = NO_TOP_K,
                top_p: float = NO_TOP_P) -> torch.Tensor:
    """``(N, k)``: the probability the sampling distribution (:func:`pick_draft`'s ``q``) gives each token, or
    ``softmax(logits)``'s at temperature 0 (the distribution a greedy pick comes from): ``q_k(x_k)`` of I-DLM §2.
    ``logits`` ``(N, k, V)``, ``tokens`` ``(N, k)``."""
    return sampling_probs(logits, temperature, top_k, top_p).gather(-1, tokens[..., None]).squeeze(-1)


def drafted_probs(logits: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    """``(N, k)``: the probability of each draft token under the distribution :func:`pick_draft` drew it from:
    gathered from its ``q`` ``(N, k, V)`` when sampled (no second filtering pass), else :func:`token_probs` of
    ``logits`` at temperature 0."""
    if q is not None:
        return q.gather(-1, draft[..., None]).squeeze(-1)
    return token_probs(logits, draft, temperature)


def next_token_q(res, verifier_logits: torch.Tensor, temperature: float, top_k: int = NO_TOP_K,
                 top_p: float = NO_TOP_P) -> torch.Tensor:
    """``(N,)``: the probability of ``res.next_token`` under the distribution it was drawn from: the residual's
    (``res.next_prob``, a sampled verification) or the verifier's sampling distribution's, with
    ``verifier_logits`` ``(N, V)`` the verifier's row at the emitted slot (greedy verification, as
    :func:`token_probs`)."""
    if res.next_prob is not None:
        return res.next_prob
    return token_probs(verifier_logits[:, None], res.next_token[:, None], temperature, top_k, top_p)[:, 0]


def emitted_probs(draft_q: torch.Tensor, accepted: torch.Tensor, next_q: torch.Tensor) -> list[list[float]]:
    """Per row ``q`` of the emitted tokens ``draft[:accepted] + [next]``: the draft's ``draft_q`` ``(N, k)`` for the
    accepted drafts, ``next_q`` ``(N,)`` for the verifier's own token: the probability under the distribution it
    was drawn from (the residual ``norm(max(0, p − q))`` for a sampled correction, ``AcceptResult.next_prob``; the
    verifier's ``p`` for a bonus token or at temperature 0). I-DLM §2's ``q_k(x_k)``: an accepted draft counts
    its drafter's probability, so a lossless decoder's α is below 1 by how far its drafts and corrections are
    from the verifier's distribution."""
    return [draft_q[i, :int(a)].tolist() + [float(next_q[i])] for i, a in enumerate(accepted)]


@dataclass
class Tally:
    """Per-row outputs and counters of a decode (see :class:`~workbench.decoding.base.DecodeResult`)."""

    n: int
    out: list[list[int]] = field(default_factory=list)
    forwards: list[int] = field(default_factory=list)
    extra: list[int] = field(default_factory=list)
    per_step: list[list[int]] = field(default_factory=list)
    step_tokens: list[list[list[int]]] = field(default_factory=list)
    probs: list[list[float]] = field(default_factory=list)
    model_calls: int = 0

    def __post_init__(self):
        self.out = [[] for _ in range(self.n)]
        self.forwards, self.extra = [0] * self.n, [0] * self.n
        self.per_step = [[] for _ in range(self.n)]
        self.step_tokens = [[] for _ in range(self.n)]
        self.probs = [[] for _ in range(self.n)]

    def active(self, limit: int, device) -> torch.Tensor:
        """``(N,)`` bool: rows with fewer than ``limit`` emitted tokens."""
        return torch.tensor([len(o) < limit for o in self.out], dtype=torch.bool, device=device)

    def count(self, active: torch.Tensor, extra: bool = False) -> None:
        """One batched model forward: +1 drafting (or, with ``extra``, verification) forward per active row."""
        self.model_calls += 1
        target = self.extra if extra else self.forwards
        for r in active.nonzero().flatten().tolist():
            target[r] += 1

    def emit(self, emitted: list[list[int]], active: torch.Tensor, limit: int,
             probs: list[list[float]] | None = None) -> None:
        """Record one cycle: each active row emits its tokens, truncated at ``limit`` total tokens; ``probs``:
        per row, ``q_k(x_k)`` of each emitted token (I-DLM §2)."""
        for r in active.nonzero().flatten().tolist():
            toks = emitted[r][: limit - len(self.out[r])]
            if probs is not None:
                self.probs[r] += probs[r][: len(toks)]
            self.out[r] += toks
            self.per_step[r].append(len(toks))
            self.step_tokens[r].append(toks)


class Speculator(Protocol):
    """One self-speculation scheme: ``start`` runs at the beginning of every segment (e.g. an initial
    draft), ``cycle`` runs one draft + verify cycle and returns the tokens each row emits."""

    def start(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> None:
        """Prepare a segment for the ``active`` rows ``(N,)`` bool (count any forward in ``tally``)."""

    def cycle(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> list[list[int]]:
        """One draft + verify cycle; per row, the tokens it emits (empty for inactive rows)."""


def run_speculation(model, spec: Speculator, prompts: list[list[int]], gen_len: int, lookahead: int,
                    real_continuation: list[list[int]] | None, block_length: int | None, pad_id: int,
                    precision: str) -> DecodeResult:
    """Decode ``gen_len`` tokens per row with ``spec``; rows advance in lockstep until each has
    ``gen_len`` tokens (the last cycle is truncated).

    Real-context mode (``real_continuation`` given): output is produced in segments of
    ``block_length`` tokens; after each segment the context is reset to the *real* continuation
    (:meth:`SpecContext.reset_to_real`, one forward counted in ``model_calls`` but, like the prefill,
    in neither ``forwards`` nor ``extra_forwards``) and ``spec.start`` runs again.

    ``lookahead``: positions a forward may reach past the generated text (draft width); checked with
    the prompt against the model context. Raises :class:`DecodeError` on bad lengths.
    """
    real = real_continuation is not None
    check_lengths(model, prompts, gen_len, block_length if real else None)
    ctx_len = int(getattr(model.backbone.config, "max_position_embeddings", 1 << 30))
    if max(len(p) for p in prompts) + gen_len + lookahead > ctx_len:
        raise DecodeError(f"prompt + generation + draft lookahead ({lookahead}) exceeds the model context "
                          f"({ctx_len}); shorten the prompt, the generation or the draft length")
    dev = model.device
    ids, valid = left_pad(prompts, pad_id, dev)
    tally = Tally(ids.shape[0])
    real_ids = torch.tensor(real_continuation, dtype=torch.long, device=dev) if real else None
    seg = (block_length or gen_len) if real else gen_len
    t0 = time.perf_counter()
    with torch.no_grad(), autocast_for(dev, precision):
        ctx = SpecContext.prefill(model, ids, valid)
        for start in range(0, gen_len, seg):
            saved = ctx.checkpoint() if real else None
            end = start + seg
            spec.start(ctx, tally, tally.active(end, dev))
            while True:
                active = tally.active(end, dev)
                if not active.any():
                    break
                emitted = spec.cycle(ctx, tally, active)
                tally.emit(emitted, active, end, getattr(spec, "last_probs", None))
            if real and end < gen_len:
                ctx.reset_to_real(model, saved, real_ids[:, start:end])
                tally.model_calls += 1
    wall = time.perf_counter() - t0
    return DecodeResult(tokens=tally.out, forwards=tally.forwards, extra_forwards=tally.extra,
                        committed_per_step=tally.per_step, step_tokens=tally.step_tokens, wall_time=wall,
                        model_calls=tally.model_calls,
                        token_probs=tally.probs if any(tally.probs) else [])
