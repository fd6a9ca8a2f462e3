"""One linear self-speculation draft–verify cycle on a batch of prefixes, as used to train and validate
a LoRA drafter (NLD §3.3, Fig. 11).

Layout (the same as linear self-speculation decoding, :mod:`workbench.speculative.linear`): the KV cache
holds the verified prefix minus its last token ``x_n``; the draft forward runs the diffusion pathway
over the block ``[x_n, m_1..m_k]`` (adapter on) and its logits at the ``k`` masks are the draft
distributions; the verification forward runs the AR pathway over ``[x_n, d_1..d_k]`` (adapter off),
whose ``k + 1`` logits predict ``d_1..d_k`` and the bonus token. Prefix and verification run inside
:func:`~workbench.speculative.adapter.verifier_mode` and without gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..speculative.adapter import verifier_mode


@dataclass
class DraftCycle:
    """Result of :func:`draft_and_verify`.

    Attributes:
        draft_logits: ``(batch, k, vocab)`` drafter logits at the masks (with grad when requested).
        draft: ``(batch, k)`` draft token ids.
        verifier_logits: ``(batch, k + 1, vocab)`` AR verifier logits over ``[x_n, d_1..d_k]`` (no grad).
    """

    draft_logits: torch.Tensor
    draft: torch.Tensor
    verifier_logits: torch.Tensor


def left_pad_prefixes(windows: torch.Tensor, lengths: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row ``i`` keeps ``windows[i, :lengths[i]]``, left-padded to ``max(lengths)``.

    Args:
        windows: ``(batch, L)`` token ids.
        lengths: ``(batch,)`` prefix lengths in ``[2, L]``.
        pad_id: id placed at padding (never attended: ``valid`` is False there).

    Returns ``(ids, valid)``, both ``(batch, max(lengths))``.
    """
    width = int(lengths.max())
    cols = torch.arange(width, device=windows.device)[None, :]
    shift = (width - lengths)[:, None]                            # left padding per row
    src = (cols - shift).clamp_min(0)
    valid = cols >= shift
    ids = torch.where(valid, windows.gather(1, src), torch.full_like(src, pad_id))
    return ids, valid


def pick_draft(draft_logits: torch.Tensor, sample_rows: torch.Tensor, temperature: float,
               generator: torch.Generator | None = None, forbid: int | None = None) -> torch.Tensor:
    """Draft tokens ``(batch, k)``: rows with ``sample_rows`` True sample from ``softmax(logits / T)``,
    the others take the argmax (NLD §3.3: 90 % of the inner-batch slots sample at ``T = 1``).
    ``forbid``: a token id never drafted (the mask token, as in linear self-speculation decoding)."""
    logits = draft_logits.detach().float().clone()
    if forbid is not None:
        logits[..., forbid] = float("-inf")
    greedy = logits.argmax(-1)
    if not bool(sample_rows.any()) or temperature <= 0:
        return greedy
    probs = torch.softmax(logits / temperature, dim=-1).cpu()
    sampled = torch.multinomial(probs.flatten(0, 1), 1, generator=generator).view(greedy.shape).to(greedy.device)
    return torch.where(sample_rows[:, None], sampled, greedy)


def draft_and_verify(model, prefix: torch.Tensor, valid: torch.Tensor, k: int,
                     sample_rows: torch.Tensor | None = None, temperature: float = 1.0,
                     generator: torch.Generator | None = None, grad: bool = True) -> DraftCycle:
    """Run one draft (diffusion, adapter on) and one verification (AR, adapter off) after ``prefix``.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM`, its backbone optionally a peft LoRA model.
        prefix: ``(batch, P)`` left-padded verified prefixes, ``P ≥ 2``.
        valid: ``(batch, P)`` bool, False at padding; every row needs ≥ 2 valid tokens.
        k: draft length.
        sample_rows: ``(batch,)`` bool, rows that sample their draft (default: all greedy).
        temperature: drafter sampling temperature ``T_draft``.
        generator: RNG of the sampling.
        grad: keep the graph of the draft forward (training); False for validation.

    Returns a :class:`DraftCycle` (the raw draft logits, mask token included, feed the loss; the draft
    tokens never are the mask token). Raises ``ValueError`` for ``k < 1`` or a prefix shorter than 2.
    """
    if k < 1:
        raise ValueError(f"draft length k must be at least 1, got {k}")
    if prefix.shape[1] < 2:
        raise ValueError("prefixes need at least 2 tokens (a cached context and the last verified token)")
    n, dev = prefix.shape[0], prefix.device
    ctx_valid = valid[:, :-1]
    last = prefix[:, -1:]
    ones = torch.ones((n, k + 1), dtype=torch.bool, device=dev)
    with torch.no_grad(), verifier_mode(model):
        cache = model.new_cache()
        model.extend(prefix[:, :-1], cache, ctx_valid, logits_to_keep=1)
    block = torch.cat([last, torch.full((n, k), model.mask_token_id, dtype=prefix.dtype, device=dev)], 1)
    with torch.set_grad_enabled(grad):
        draft_logits = model.diffusion_logits(block, cache, torch.cat([ctx_valid, ones], 1))[:, 1:]
    rows = sample_rows if sample_rows is not None else torch.zeros(n, dtype=torch.bool, device=dev)
    draft = pick_draft(draft_logits, rows.to(dev), temperature, generator, forbid=model.mask_token_id)
    with torch.no_grad(), verifier_mode(model):
        verifier_logits = model.extend(torch.cat([last, draft], 1), cache, torch.cat([ctx_valid, ones], 1))
    return DraftCycle(draft_logits, draft, verifier_logits)
