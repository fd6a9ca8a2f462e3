"""SimSD decoding (arXiv:2606.02544 §3.2): a small diffusion drafter drafts a block in its own order, the diffusion
target verifies all γ = B drafted tokens in one forward with the temporal layout of §3.1, and finishes the
block itself after a rejection.

Per block of B positions (batch size 1, as the paper; the target's KV cache holds the prefix):

1. **Draft.** The drafter (:class:`~workbench.deer.block_drafter.BlockDrafter`) decodes the block from all masks
   in B steps, fixing its most confident position each step: the draft-induced order o_1..o_B and its
   distribution p_φ^(r) at each step.
2. **Verify** (one target forward). Input ``[D | D̃]`` after the cached prefix with the temporal mask of Eq. 1
   (τ = draft step) and RoPE-copied positions (:mod:`workbench.simsd.layout`); the logits at slot D̃_{o_r} give
   p_θ^(r).
3. **Accept** along the draft order, Eq. 2: at temperature 0, D̂_{o_r} is accepted iff it is p_θ^(r)'s argmax;
   at T > 0 with probability min(1, p_θ^(r) / p_φ^(r)), a rejection drawing from the residual
   (p_θ − p_φ)₊ (the correction that keeps the target's distribution, §3.2 "Training-free deployment").
   At the first rejection the target's token is placed at o_r and the rest of the draft is dropped.
4. **Finish.** Fewer than γ positions remain, so the target completes the block by its own decoding: one
   position per forward, its most confident one (the serial target, SimSD's "vanilla" with steps = length).
5. **Commit.** One causal forward appends the block to the target's KV cache (``extra_forwards``, as in every
   block-diffusion decoder here); the drafter reads it at its next draft.

Block-causal targets at absolute positions (SDAR, the paper's own targets; §4.1): γ = B = the family's block size,
and the blocks are the family's own, aligned as its ``generate`` aligns them. The first block after a prompt of
``P`` tokens holds the prompt's last ``P mod B`` tokens (clean, held back by the target) and ``R = B - P mod B < γ``
positions to decode, so, as the paper does when ``R < γ`` ("fall back to vanilla target decoding"), the target
decodes it alone (:func:`_target_block`); every later block is drafted and verified, the verification forward
being :func:`_verify_block_causal` (the adapter's ``masked_block_forward``). Decoding runs to the block boundary
at or after ``gen_len`` tokens, as SDAR's ``generate``, and returns the first ``gen_len``.

Counts per row: ``forwards`` = target denoising forwards (verify + finishing steps), ``extra_forwards`` = the
per-block KV-commit forwards, :attr:`SimSDResult.drafter_forwards` = drafter forwards.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..decoding.base import DecodeError, DecodeResult, autocast_for, check_lengths
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs
from ..deer.block_drafter import BlockDrafter
from ..model.gated_lora import lora_positions
from ..model.masks import to_additive
from ..speculative.accept import speculative_accept
from .layout import paired_positions, physical_positions, temporal_allowed


@dataclass
class SimSDResult(DecodeResult):
    """:class:`~workbench.decoding.base.DecodeResult` plus SimSD's bookkeeping (per row).

    Attributes:
        accepted: drafted tokens accepted per drafted block (0..γ); a block the target decodes alone (R < γ) has
            no entry. (``drafter_forwards``, the drafter's forwards, is
            :class:`~workbench.decoding.base.DecodeResult`'s.)
        drafter_params, target_params: parameter counts (for the cost model of Eq. 3).
    """

    accepted: list[list[int]] = field(default_factory=list)
    drafter_params: int = 0
    target_params: int = 0


def verify_logits(target, cache, prefix_len: int, draft: torch.Tensor, steps: torch.Tensor,
                  rope_copy: bool = True) -> torch.Tensor:
    """The target's logits at the mask slots D̃ of the SimSD layout, in one forward (the cache is unchanged).

    Args:
        target: a TriModeLM with a mask token (diffusion target). cache: its KV cache of ``prefix_len`` tokens.
        draft: ``(B,)`` drafted ids at the block positions. steps: ``(B,)`` their temporal labels (draft steps).
        rope_copy: D̃_k reuses D_k's position id (Eq. of §3.1); False: physical positions (Table 4 ablation).

    Returns ``(B, V)`` float32: row k scores block position k under the context of its draft step.

    A target whose forward is block-causal at absolute positions (SDAR: its adapter has
    ``masked_block_forward``) runs :func:`_verify_block_causal` instead: its cached whole blocks, the held-back
    tail of the current absolute block (τ = 0) and ``[D | D̃]`` in that block.
    """
    if callable(getattr(target, "masked_block_forward", None)):
        return _verify_block_causal(target, cache, prefix_len, draft, steps, rope_copy)
    b, dev = draft.shape[0], draft.device
    ids = torch.cat([draft, torch.full((b,), target.mask_token_id, dtype=torch.long, device=dev)])[None]
    pos = (paired_positions if rope_copy else physical_positions)(prefix_len, b, dev)[None]
    mask = to_additive(temporal_allowed(steps, prefix_len)[None], target.mask_dtype)
    with lora_positions(target, True):                   # gated LoRA: the block is the noisy stream
        logits = target.forward_backbone(ids, pos, mask, cache)
    cache.crop(-2 * b)
    return logits[0, b:].float()


def _verify_block_causal(target, cache, prefix_len: int, draft: torch.Tensor, steps: torch.Tensor,
                         rope_copy: bool) -> torch.Tensor:
    """SimSD's verification forward on a block-causal target at absolute positions (SDAR, the paper's own
    target, SimSD, arXiv:2606.02544 §4.1): one forward of ``[held-back tail | D | D̃]`` after the cached whole blocks.

    * The cached whole blocks (earlier absolute blocks) are visible to every query (block-causal; "prompt tokens
      are visible to all response positions", §3.1).
    * The held-back tail (clean tokens of the current absolute block before the drafted positions: the prompt's
      last ``prefix_len mod S`` tokens) is data with τ = 0 under Eq. 1: every D and D̃ sees it; it sees itself and
      every mask slot D̃, never a drafted token (the block state before the first draft step, as in SDAR's
      sequential denoising, where the tail attends to the whole block).
    * Among D and D̃: Eq. 1 (:func:`~workbench.simsd.layout.temporal_allowed`), replacing SDAR's bidirectional
      block. Positions: the drafted positions' absolute ids, D̃_k copying D_k's (RoPE copy) or continuing after D.

    The drafted positions must lie in one absolute block (``prefix_len mod S + B ≤ S``); raises ``ValueError``
    otherwise, and for a family with shifted logits (Fast-dLLM v2: block token k is predicted at position k - 1,
    which this layout does not provide). Returns ``(B, V)`` float32, the logits at D̃.
    """
    if target.family.shift:
        raise ValueError(f"the {target.family.name} family's logits are shifted; SimSD's paired layout reads each "
                         "slot's own logit")
    b, dev = draft.shape[0], draft.device
    s = int(target.block_size)
    if prefix_len % s + b > s:
        raise ValueError(f"the {b} drafted positions after {prefix_len} tokens cross a block boundary of the "
                         f"target's absolute blocks of {s}; SimSD verifies inside one block")
    ids = torch.cat([draft, torch.full((b,), target.mask_token_id, dtype=torch.long, device=dev)])[None]
    offsets = (paired_positions if rope_copy else physical_positions)(0, b, dev)
    within = temporal_allowed(steps, 0)                        # Eq. 1 among [D | D̃]
    tail_sees = torch.cat([torch.zeros(b, dtype=torch.bool, device=dev), torch.ones(b, dtype=torch.bool, device=dev)])
    valid = torch.ones((1, 2 * b), dtype=torch.bool, device=dev)
    with lora_positions(target, True):
        logits = target.masked_block_forward(ids, offsets, within, cache, valid, held_visible=tail_sees)
    return logits[0, b:].float()


def _block_spans(target, prompt_len: int, gen_len: int, b: int) -> list[tuple[int, int]]:
    """``(start, length)`` of the blocks SimSD decodes after a prompt of ``prompt_len`` tokens. Blocks of ``b``
    from the prompt's end, or, for a target whose blocks sit at absolute positions (``family.aligned``: SDAR),
    its own blocks as its ``generate`` aligns them: the first holds the prompt's tail and ``b - prompt_len mod b``
    positions to decode, and blocks continue to the block boundary at or after ``gen_len`` tokens."""
    family = getattr(target, "family", None)
    if family is None or not family.aligned:
        return [(start, b) for start in range(0, gen_len, b)]
    spans, start = [], 0
    first = b - prompt_len % b
    while start < gen_len:
        n = first if start == 0 else b
        spans.append((start, n))
        start += n
    return spans


def _finish_serial(target, cache, prefix_len: int, block: torch.Tensor, undecided: torch.Tensor,
                   temperature: float, g: torch.Generator, qs: torch.Tensor, warp: dict) -> list[int]:
    """The target completes ``block`` in place, one position per forward (its most confident), writing each
    token's probability into ``qs``; returns the token committed by each forward. ``warp``: the sampling
    filters (``top_k``, ``top_p``) of :func:`~workbench.decoding.sampling.sampling_probs`."""
    done = []
    key_valid = torch.ones((1, prefix_len + block.shape[0]), dtype=torch.bool, device=block.device)
    while undecided.any():
        logits = target.diffusion_logits(block[None], cache, key_valid)[0].float()
        logits[:, target.mask_token_id] = float("-inf")
        probs = torch.softmax(logits, -1)
        conf = torch.where(undecided, probs.max(-1).values, torch.full_like(probs[:, 0], -1.0))
        k = int(conf.argmax())
        if temperature > 0:
            p = sampling_probs(logits[k], temperature, **warp)
            block[k] = torch.multinomial(p, 1, generator=g)[0]
        else:
            p = probs[k]
            block[k] = probs[k].argmax()
        qs[k] = p[block[k]]
        undecided[k] = False
        done.append(int(block[k]))
    return done


@torch.no_grad()
def simsd_decode(target, drafter, prompts: list[list[int]], gen_len: int, block_length: int = 8,
                 temperature: float = 0.0, drafter_kind: str = "trimode", sep_id: int | None = None,
                 real_continuation: list[list[int]] | None = None, precision: str = "fp32", seed: int = 0,
                 rope_copy: bool = True, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> SimSDResult:
    """Generate ``gen_len`` tokens per prompt with SimSD, γ = B = ``block_length``.

    Args:
        target: the diffusion target (TriModeLM with a mask token, or a released family whose block sees a
            cached prefix and itself (NLD) or that is block-causal at absolute positions with unshifted logits
            (SDAR)). drafter: a smaller diffusion drafter of the same tokenizer (``drafter_kind`` 'trimode' — a
            tri-mode model or a released family's adapter, e.g. a smaller SDAR — or 'deer'; ``sep_id`` for a DEER
            drafter).
        prompts: token-id lists. gen_len: a multiple of ``block_length`` (for SDAR: its block size).
        temperature: 0 → greedy acceptance; > 0 → Eq. 2 with residual resampling.
        real_continuation: real-context mode: the KV commit appends the real block (both models).
        precision: 'fp32' or 'bf16'. seed: RNG seed. rope_copy: False for the RoPE-alignment ablation.
        top_k, top_p: sampling filters of the drafter's ``q`` and the target's ``p`` alike (0 / 1 = off; ignored
            at temperature 0), see :func:`~workbench.decoding.sampling.sampling_probs`.

    Returns :class:`SimSDResult`. Raises :class:`~workbench.decoding.base.DecodeError` for bad lengths, a
    vocabulary-size mismatch, a negative temperature, an out-of-range ``top_k`` / ``top_p``, a family whose forward
    the layout does not reproduce (LLaDA, Dream, I-DLM, Fast-dLLM v2), or a block length other than an aligned
    family's block size.
    """
    check_sampling(temperature, top_k, top_p)
    check_lengths(target, prompts, gen_len, block_length)
    family = getattr(target, "family", None)
    block_causal = family is not None and family.diffusion_attention == "block_causal" \
        and callable(getattr(target, "masked_block_forward", None))
    if family is not None and family.diffusion_attention != "window" and not (block_causal and not family.shift):
        what = (f"{family.diffusion_attention}-attention with shifted logits" if family.shift
                else f"{family.diffusion_attention}-attention")
        raise DecodeError(f"SimSD's verification forward needs a block that sees a cached prefix and itself (NLD) or "
                          f"block-causal attention at absolute positions with unshifted logits (SDAR); the "
                          f"{family.name} family's forward is {what}, which that layout does not reproduce yet")
    if family is not None and family.aligned and block_length != getattr(target, "block_size", None):
        raise DecodeError(f"SimSD on the {family.name} family drafts and verifies its own absolute blocks "
                          f"(γ = B = {target.block_size}); got block length {block_length}: pass {target.block_size}")
    vt, vd = target.vocab_size, drafter.vocab_size
    if vt != vd:
        raise DecodeError(f"drafter and target vocabularies differ ({vd} vs {vt} logits); SimSD needs one tokenizer")
    dev, b = target.device, block_length
    g = torch.Generator(device=dev).manual_seed(seed)
    n0 = len(prompts)
    res = SimSDResult(tokens=[[] for _ in range(n0)], forwards=[0] * n0, extra_forwards=[0] * n0,
                      committed_per_step=[[] for _ in range(n0)], step_tokens=[[] for _ in range(n0)],
                      accepted=[[] for _ in range(n0)], drafter_forwards=[0] * n0, token_probs=[[] for _ in range(n0)],
                      drafter_params=sum(p.numel() for p in drafter.backbone.parameters()),
                      target_params=sum(p.numel() for p in target.backbone.parameters()))
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        for row, prompt in enumerate(prompts):
            real = real_continuation[row] if real_continuation is not None else None
            _decode_one(target, BlockDrafter(drafter, drafter_kind, sep_id), list(prompt), gen_len, b,
                        temperature, real, g, res, row, rope_copy, {"top_k": top_k, "top_p": top_p})
    res.wall_time = time.perf_counter() - t0
    return res


def _decode_one(target, drafter: BlockDrafter, prompt: list[int], gen_len: int, b: int, temperature: float,
                real: list[int] | None, g: torch.Generator, res: SimSDResult, row: int, rope_copy: bool,
                warp: dict) -> None:
    dev = target.device
    cache = target.new_cache()
    target.extend(torch.tensor([prompt], device=dev), cache, torch.ones((1, len(prompt)), dtype=torch.bool,
                                                                         device=dev), logits_to_keep=1)
    context = list(prompt)
    for start, n in _block_spans(target, len(prompt), gen_len, b):
        if n < b:                        # R < γ (an aligned target's first block): the target completes it (§4.1)
            _target_block(target, cache, context, start, n, real, temperature, g, res, row, warp)
            continue
        calls = drafter.calls
        logp = drafter.propose(context, b, steps=b, temperature=temperature, generator=g, **warp)   # one per step
        res.drafter_forwards[row] += drafter.calls - calls
        steps, draft = drafter.last_order.to(dev), drafter.last_tokens.to(dev)
        if temperature > 0:
            q = sampling_probs(logp, temperature, **warp)           # p_φ^(r): the step's distribution
        p_len = len(context)
        v = verify_logits(target, cache, p_len, draft, steps, rope_copy)
        v[:, target.mask_token_id] = float("-inf")
        res.forwards[row] += 1
        block = torch.full((b,), target.mask_token_id, dtype=torch.long, device=dev)
        undecided = torch.ones(b, dtype=torch.bool, device=dev)
        qs = torch.zeros(b, device=dev)              # q_k(x_k) per block position (I-DLM §2), block order
        accepted = 0
        for k in steps.argsort().tolist():                           # along the draft order o_1..o_B
            tok = int(draft[k])
            if temperature > 0:                     # Eq. 2 at o_r: the speculative-sampling rule of one slot
                p = sampling_probs(v[k], temperature, **warp)
                acc = speculative_accept(draft[k].view(1, 1), q[k][None, None], torch.stack([p, p])[None], g)
                ok = bool(acc.accepted[0])
                if ok:
                    q_tok = q[k, tok]
                else:                                   # a correction: q_k is that of the residual it came from
                    tok, q_tok = int(acc.next_token[0]), acc.next_prob[0]
            else:
                ok = tok == int(v[k].argmax())
                if not ok:
                    tok = int(v[k].argmax())
                q_tok = (logp[k].to(dev).exp() if ok else torch.softmax(v[k], -1))[tok]
            block[k] = tok
            undecided[k] = False
            qs[k] = q_tok
            if not ok:
                break
            accepted += 1
        res.accepted[row].append(accepted)
        res.committed_per_step[row].append(accepted + (accepted < b))
        res.step_tokens[row].append([int(t) for t, u in zip(block.tolist(), undecided.tolist()) if not u])
        finished = _finish_serial(target, cache, p_len, block, undecided, temperature, g, qs, warp)
        res.forwards[row] += len(finished)
        res.committed_per_step[row] += [1] * len(finished)
        res.step_tokens[row] += [[t] for t in finished]
        committed = _real_block(real, start, block) if real is not None else block
        target.extend(committed[None], cache, torch.ones((1, p_len + b), dtype=torch.bool, device=dev),
                      logits_to_keep=1)
        res.extra_forwards[row] += 1
        res.tokens[row] += block.tolist()
        res.token_probs[row] += qs.tolist()
        context += committed.tolist()
    del res.tokens[row][gen_len:], res.token_probs[row][gen_len:]     # an aligned target's last block runs over


def _real_block(real: list[int], start: int, block: torch.Tensor) -> torch.Tensor:
    """The real continuation at the block's positions (real-context mode); past its end (an aligned target's last
    block running over ``gen_len``) the decoded tokens."""
    seg = real[start:start + block.shape[0]]
    return torch.tensor(seg + block.tolist()[len(seg):], device=block.device)


def _target_block(target, cache, context: list[int], start: int, n: int, real: list[int] | None,
                  temperature: float, g: torch.Generator, res: SimSDResult, row: int, warp: dict) -> None:
    """A block with fewer than γ positions to decode (R < γ: an aligned target's first block, whose first
    ``B - n`` positions are the prompt's tail, held back by the target): SimSD drafts nothing and "falls back to
    vanilla target decoding" (SimSD, arXiv:2606.02544 §4.1), the target's serial decoding (:func:`_finish_serial`), then
    commits it. No verify forward, no drafter forward, no entry in ``accepted``."""
    dev = target.device
    p_len = len(context)
    block = torch.full((n,), target.mask_token_id, dtype=torch.long, device=dev)
    undecided = torch.ones(n, dtype=torch.bool, device=dev)
    qs = torch.zeros(n, device=dev)
    finished = _finish_serial(target, cache, p_len, block, undecided, temperature, g, qs, warp)
    res.forwards[row] += len(finished)
    res.committed_per_step[row] += [1] * len(finished)
    res.step_tokens[row] += [[t] for t in finished]
    committed = _real_block(real, start, block) if real is not None else block
    target.extend(committed[None], cache, torch.ones((1, p_len + n), dtype=torch.bool, device=dev), logits_to_keep=1)
    res.extra_forwards[row] += 1
    res.tokens[row] += block.tolist()
    res.token_probs[row] += qs.tolist()
    context += committed.tolist()


def warn_if_larger(drafter, target) -> bool:
    """Warn (``UserWarning``, naming both sizes) when the drafter has more parameters than its target, which
    defeats speculative decoding (SimSD, arXiv:2606.02544 §4.1 pairs a 1.7 B drafter with an 8 B target). Returns True then."""
    import warnings

    pd = sum(p.numel() for p in drafter.backbone.parameters())
    pt = sum(p.numel() for p in target.backbone.parameters())
    if pd > pt:
        warnings.warn(f"the SimSD drafter ({pd / 1e6:.1f} M parameters) is larger than its target ({pt / 1e6:.1f} M);"
                      " speculation pays only with a smaller drafter", stacklevel=2)
        return True
    return False
