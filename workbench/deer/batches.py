"""Training inputs of the DEER drafter: ``[prompt, a_{1:c}] + [SEP, x_t(a_{c+1:e})]`` (arXiv:2512.15176 §3.1).

The clean context is left-padded, the block (``SEP`` then the noisy span) right-padded; one
:func:`~workbench.deer.attention.draft_block_logits` forward then gives the span's diffusion logits with the
same attention the drafter has when it drafts at inference (context causal, block bidirectional).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SpanBatch:
    """One padded batch of (context, span) pairs.

    Attributes:
        context: ``(N, P)`` clean ids (prompt + answer prefix), left-padded.
        context_valid: ``(N, P)`` bool, False at left padding.
        span: ``(N, S)`` clean span ids (targets), right-padded.
        span_valid: ``(N, S)`` bool, False at right padding.
    """

    context: torch.Tensor
    context_valid: torch.Tensor
    span: torch.Tensor
    span_valid: torch.Tensor

    def block_inputs(self, masked: torch.Tensor, sep_id: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's block ``[SEP, x_t]`` ``(N, 1 + S)`` (mask id where ``masked`` ``(N, S)``) and the
        forward's ``key_valid`` ``(N, P + 1 + S)``."""
        n = self.span.shape[0]
        noisy = torch.where(masked, torch.full_like(self.span, mask_id), self.span)
        sep = torch.full((n, 1), sep_id, dtype=torch.long, device=self.span.device)
        ones = torch.ones((n, 1), dtype=torch.bool, device=self.span.device)
        return torch.cat([sep, noisy], 1), torch.cat([self.context_valid, ones, self.span_valid], 1)

    def to(self, device) -> "SpanBatch":
        """This batch on ``device``."""
        return SpanBatch(*(x.to(device) for x in (self.context, self.context_valid, self.span, self.span_valid)))


def build_span_batch(prompts: list[list[int]], answers: list[list[int]], cut: torch.Tensor, end: torch.Tensor,
                     pad_id: int, max_context: int | None = None) -> SpanBatch:
    """Cut every answer: context = ``(prompt + answer[:cut])[-max_context:]``, span = ``answer[cut:end]``.

    Args:
        prompts, answers: N token-id lists.
        cut, end: ``(N,)`` long, ``0 ≤ cut < end ≤ len(answer)`` (from :mod:`workbench.deer.masking`).
        pad_id: padding id (never attended).
        max_context: keep at most this many context tokens (the most recent); ``None`` keeps all.

    Returns a :class:`SpanBatch`. Raises ``ValueError`` for an empty span or an empty context.
    """
    ctxs, spans = [], []
    for p, a, c, e in zip(prompts, answers, cut.tolist(), end.tolist()):
        if not 0 <= c < e <= len(a):
            raise ValueError(f"bad span [{c}, {e}) for an answer of {len(a)} tokens")
        ctx = list(p) + list(a[:c])
        if max_context:
            ctx = ctx[-max_context:]
        if not ctx:
            raise ValueError("every example needs a non-empty prompt")
        ctxs.append(ctx)
        spans.append(list(a[c:e]))
    n, p_len, s_len = len(ctxs), max(map(len, ctxs)), max(map(len, spans))
    context = torch.full((n, p_len), pad_id, dtype=torch.long)
    context_valid = torch.zeros((n, p_len), dtype=torch.bool)
    span = torch.full((n, s_len), pad_id, dtype=torch.long)
    span_valid = torch.zeros((n, s_len), dtype=torch.bool)
    for i, (c, s) in enumerate(zip(ctxs, spans)):
        context[i, p_len - len(c):] = torch.tensor(c, dtype=torch.long)
        context_valid[i, p_len - len(c):] = True
        span[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        span_valid[i, :len(s)] = True
    return SpanBatch(context, context_valid, span, span_valid)
