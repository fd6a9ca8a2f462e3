"""Masking of DEER's two alignment stages as pure functions (arXiv:2512.15176 §3.1, Eq. 1–4).

Every teacher answer ``a_{1:L}`` is cut at a random point ``c`` (the drafter sees the prompt and
``a_{1:c}``, then ``SEP``); the *span* after the cut is what the drafter learns to denoise:

* **Stage I** (AR-style distillation, Eq. 1–2): the span is the whole suffix ``a_{c+1:L}``; each span token
  is replaced by ``[MASK]`` with probability ``t ~ U(0, 1]`` (the noisy ``x_t``); masked tokens weigh ``1/t``.
* **Stage II** (Scribe refinement, Eq. 3–4): the answer is the truncated ``a_{1:c+R}`` and only its
  last ``R ~ U{1..96}`` tokens form the span (clipped to the answer: ``R ≤ L − c``); span token ``i``
  (``i = 1`` right after ``SEP``, ``i = R`` last) weighs ``w_i = α^{R−i}`` (Eq. 3, default α = 1.01), times
  the ``1/t`` of Eq. 4. The paper states the weights without a normalisation: they are used as printed,
  so the first span token weighs ``α^{R−1}`` (2.6 at α = 1.01, R = 96) and the last one 1, and a larger α
  scales the loss and its gradient up (the instability of DEER, arXiv:2512.15176 §4.3.2, Fig. 6).

Interpretation of "mask only the last R tokens of the answer" (§3.1.2): the cut ``c`` is drawn as in Stage
I and the answer is considered to end at ``c + R``, so the R masked tokens are those right after ``SEP`` —
the region where verification first meets the draft, which is what the weights emphasise; tokens after
``c + R`` are not shown. The noise distribution is selectable: ``"uniform"`` (``t ~ U(t_min, 1]``, as Eq. 1
and 4 write it) or ``"full"`` (``t = 1``: every span token masked, as in a one-step draft at inference).
"""
from __future__ import annotations

from typing import Callable

import torch


def _uniform_int(low: torch.Tensor, high: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Uniform integers in ``[low, high]`` (inclusive, elementwise)."""
    u = torch.rand(low.shape, generator=generator)
    return (low + (u * (high - low + 1).double()).floor().long()).minimum(high)


def stage1_spans(answer_len: torch.Tensor, generator: torch.Generator | None = None, r_max: int = 96
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage I spans (Eq. 1): cut ``c ~ U{0..L−1}``, span = the whole suffix ``[c, L)``.

    Args:
        answer_len: ``(N,)`` long answer lengths ``L ≥ 1``.
        generator: RNG. r_max: unused (same signature as :func:`stage2_spans`).

    Returns ``(cut, end)``, each ``(N,)`` long, ``0 ≤ cut < end = L``.
    """
    cut = _uniform_int(torch.zeros_like(answer_len), answer_len - 1, generator)
    return cut, answer_len.clone()


def stage2_spans(answer_len: torch.Tensor, generator: torch.Generator | None = None, r_max: int = 96
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage II spans (§3.1.2): cut ``c ~ U{0..L−1}``, ``R ~ U{1..r_max}``, span ``[c, min(c + R, L))``.

    Returns ``(cut, end)``, each ``(N,)`` long, with ``1 ≤ end − cut ≤ min(r_max, L − cut)``.
    """
    cut = _uniform_int(torch.zeros_like(answer_len), answer_len - 1, generator)
    r = _uniform_int(torch.ones_like(answer_len), torch.full_like(answer_len, r_max), generator)
    return cut, torch.minimum(cut + r, answer_len)


def uniform_noise(n: int, t_min: float = 1e-3, generator: torch.Generator | None = None) -> torch.Tensor:
    """Noise levels ``t ~ U(t_min, 1]`` ``(n,)`` (Eq. 1; ``t_min`` keeps the 1/t weight finite)."""
    return 1.0 - (1.0 - t_min) * torch.rand(n, generator=generator)


def full_noise(n: int, t_min: float = 1e-3, generator: torch.Generator | None = None) -> torch.Tensor:
    """Noise level ``t = 1`` ``(n,)``: every span token masked (the one-step draft of Alg. 1)."""
    return torch.ones(n)


#: Noise-level distributions by name.
NOISE: dict[str, Callable[..., torch.Tensor]] = {"uniform": uniform_noise, "full": full_noise}
#: Span samplers by stage.
SPANS: dict[int, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {1: stage1_spans, 2: stage2_spans}


def get_noise(name: str) -> Callable[..., torch.Tensor]:
    """The noise distribution ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in NOISE:
        raise ValueError(f"unknown DEER noise {name!r}; valid: {', '.join(NOISE)}")
    return NOISE[name]


def get_spans(stage: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The span sampler of ``stage`` (1 or 2); ``ValueError`` listing the valid stages otherwise."""
    if stage not in SPANS:
        raise ValueError(f"unknown DEER stage {stage!r}; valid: {', '.join(map(str, SPANS))}")
    return SPANS[stage]


def mask_span(span_valid: torch.Tensor, t: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Masked positions of ``x_t``: each valid span position independently with probability ``t``.

    Args:
        span_valid: ``(N, S)`` bool, True at the span's real tokens (right padding False).
        t: ``(N,)`` noise levels in (0, 1].

    Returns ``(N, S)`` bool (always False at padding; all valid positions when ``t = 1``).
    """
    u = torch.rand(span_valid.shape, generator=generator)
    return span_valid & (u < t[:, None])


def stage1_weights(t: torch.Tensor, span_valid: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Eq. 1 token weights ``1/t`` on valid span positions, 0 at padding: ``(N, S)`` float.
    ``alpha`` is unused (same signature as :func:`stage2_weights`)."""
    return span_valid.float() / t[:, None]


def stage2_weights(t: torch.Tensor, span_valid: torch.Tensor, alpha: float = 1.01) -> torch.Tensor:
    """Eq. 3–4 token weights ``α^{R−i} / t`` for span position ``i = 1..R`` (``R`` = valid span length of the
    row, ``i = 1`` right after SEP), 0 at padding: ``(N, S)`` float."""
    r = span_valid.sum(dim=1, keepdim=True)                                   # (N, 1)
    i = torch.arange(1, span_valid.shape[1] + 1)[None, :]                     # (1, S)
    w = torch.pow(torch.tensor(float(alpha), dtype=torch.float64), (r - i).clamp_min(0)).float()
    return torch.where(span_valid, w / t[:, None], torch.zeros_like(w))


#: Token weights by stage.
WEIGHTS: dict[int, Callable[..., torch.Tensor]] = {1: stage1_weights, 2: stage2_weights}
