"""Linear self-speculation (NLD §3.3, Fig. 5c): diffusion drafts, AR verifies, two forwards per cycle.

One cycle, for a verified prefix ``x_1..x_n`` in the KV cache and the last verified token ``x_{n+1}``
not yet cached (see :mod:`workbench.speculative.context`):

1. **draft** (diffusion mode, LoRA adapter on if present): block ``[x_{n+1}, m_1..m_k]`` over the
   cached prefix; the logits at the ``k`` masks are the draft distributions ``q_1..q_k`` of positions
   ``n+2..n+k+1``; draft ``d = argmax q`` (temperature 0) or ``d_j ~ q_j = softmax(z_j / T)``;
2. **verify** (AR mode, adapter off): one causal forward over ``[x_{n+1}, d_1..d_k]`` appended to the
   cache gives ``k + 1`` next-token distributions; :func:`~workbench.speculative.greedy_accept` /
   :func:`~workbench.speculative.speculative_accept` accept ``a`` drafts plus one verifier token.

The cache keeps ``x_{n+1}, d_1..d_a``; rejected drafts are punched out of the key validity. The
verifier's token becomes the next ``x_{n+1}``. Greedy output equals AR greedy decoding (lossless);
sampled output is distributed as AR sampling at the same temperature.

**Draft layout.** NLD §3.3 appends "k mask tokens to the verified prefix, forming the input [x_1, …, x_n, m_1,
…, m_k]": the masks follow a fully clean prefix, as every training block does. The default layout above
(``layout="in_block"``) instead puts ``x_{n+1}`` inside the bidirectional block, with the adapter on, so
the block is ``k + 1`` tokens long. ``layout="clean_prefix"`` is the paper's: one forward appends
``x_{n+1}`` causally with the base weights (:meth:`~workbench.model.trimode.TriModeLM.extend_and_diffuse`) and
reads the ``k`` masks after it; its AR logit at ``x_{n+1}`` verifies ``d_1``, so the verify forward holds
``d_1..d_k`` only. Both are lossless. It needs a gated LoRA or no adapter at all: a plain peft adapter would
compute ``x_{n+1}``'s keys with the adapter on, and the verifier must not read them. On SmolLM2-135M-trimode
(leg 5, 8 test prompts × 64 tokens, fp32) the paper's layout changed τ by +1 to +4 % in real context and −0.5 to
−2.5 % free-running at k ∈ {2, 4, 8, 16} (the lab notebook, ``benchmarks/RESULTS.md``); the default stays ``in_block``,
the layout every recorded τ (the training legs' ``val/tau`` included) was measured with.
"""
from __future__ import annotations

import torch

from ..decoding.base import DecodeError, DecodeResult
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling
from .adapter import has_adapter, verifier_mode
from .context import SpecContext
from .driver import (Tally, drafted_probs, emitted_probs, masked_draft_logits, next_token_q, pick_draft,
                     run_speculation, verify)


def draft_forward(model, ctx: SpecContext, k: int) -> torch.Tensor:
    """Diffusion draft logits ``(N, k, V)`` (float, [MASK] forbidden) for the ``k`` positions after
    ``ctx.last``: one :meth:`~workbench.model.trimode.TriModeLM.diffusion_logits` call over the block
    ``[last, m_1..m_k]``; the cache is left unchanged. Runs with whatever adapter state is active."""
    n = ctx.last.shape[0]
    masks = torch.full((n, k), model.mask_token_id, dtype=torch.long, device=ctx.last.device)
    block = torch.cat([ctx.last[:, None], masks], dim=1)
    logits = model.diffusion_logits(block, ctx.cache, ctx.with_new(k + 1))
    return masked_draft_logits(logits[:, 1:], model.mask_token_id)


def clean_prefix_draft_forward(model, ctx: SpecContext, k: int, active: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """NLD §3.3's draft input in one forward: ``x_{n+1}`` appended to the cache causally (base weights) and ``k``
    masks read after it (:meth:`~workbench.model.trimode.TriModeLM.extend_and_diffuse`). Marks the new key valid
    for the ``active`` rows ``(N,)``. Returns ``(AR logits at x_{n+1} (N, 1, V), draft logits (N, k, V))``, the
    draft's as :func:`draft_forward` returns them ([MASK] forbidden)."""
    masks = torch.full((ctx.last.shape[0], k), model.mask_token_id, dtype=torch.long, device=ctx.last.device)
    first, z = model.extend_and_diffuse(ctx.last[:, None], masks, ctx.cache, ctx.with_new(k + 1))
    ctx.valid = torch.cat([ctx.valid, active[:, None]], dim=1)
    return first, masked_draft_logits(z, model.mask_token_id)


DRAFT_LAYOUTS = ("in_block", "clean_prefix")
"""Where the last verified token sits in the draft forward (see the module docstring)."""


class LinearSpeculator:
    """Draft-then-verify cycles of linear self-speculation (see the module docstring)."""

    def __init__(self, model, k: int, temperature: float, generator: torch.Generator, layout: str = "in_block",
                 top_k: int = NO_TOP_K, top_p: float = NO_TOP_P):
        self.model, self.k, self.temperature, self.generator = model, k, temperature, generator
        self.layout = layout
        self.warp = {"top_k": top_k, "top_p": top_p}          # the sampling filters of q and p alike

    def start(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> None:
        """Nothing to prepare: every cycle drafts afresh."""

    def cycle(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> list[list[int]]:
        """Draft ``k`` tokens with the adapter, verify them with the base; per row, the accepted tokens plus the
        verifier's correction or bonus token (NLD §3.3, linear self-speculation)."""
        m, k = self.model, self.k
        if self.layout == "clean_prefix":
            first, z = clean_prefix_draft_forward(m, ctx, k, active)   # x_{n+1} now cached: verify d_1..d_k
        else:
            first, z = None, draft_forward(m, ctx, k)                   # verify x_{n+1}, d_1..d_k
        draft, q = pick_draft(z, self.temperature, self.generator, **self.warp)
        tally.count(active)
        seq = draft if first is not None else torch.cat([ctx.last[:, None], draft], dim=1)
        appended = seq.shape[1]                                            # keys this verify forward appends
        with verifier_mode(m):
            ver = m.extend(seq, ctx.cache, ctx.with_new(appended)).float()
        if first is not None:
            ver = torch.cat([first.float(), ver], dim=1)                   # (N, k + 1, V)
        tally.count(active, extra=True)
        res = verify(draft, q, ver, self.temperature, self.generator, **self.warp)
        rows = torch.arange(draft.shape[0], device=draft.device)
        self.last_probs = emitted_probs(drafted_probs(z, draft, q, self.temperature), res.accepted,
                                        next_token_q(res, ver[rows, res.accepted], self.temperature, **self.warp))
        # keep x_{n+1} (when the verify forward appended it) and d_1..d_a: slot j holds d_j, slot 0 x_{n+1}
        slots = torch.arange(k + 1 - appended, k + 1, device=draft.device)[None, :]
        ctx.commit(slots <= res.accepted[:, None], res.next_token, active)
        return res.emitted(draft)


def linear_self_speculation(model, prompts: list[list[int]], gen_len: int, draft_length: int = 8,
                            temperature: float = 0.0, precision: str = "fp32", seed: int = 0, pad_id: int = 0,
                            real_continuation: list[list[int]] | None = None,
                            block_length: int | None = None, layout: str = "in_block", top_k: int = NO_TOP_K,
                            top_p: float = NO_TOP_P) -> DecodeResult:
    """Linear self-speculation decoding (NLD §3.3), batched over prompts of any lengths.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM`; its backbone may be a peft ``PeftModel``
            (LoRA drafter): drafts run with the adapter, prefix cache and verification without it.
        prompts: N prompts of token ids (left-padded internally with ``pad_id``, never attended).
        gen_len: tokens emitted per prompt (the last cycle is truncated).
        draft_length: k, draft tokens per cycle (each cycle emits 1..k + 1 tokens).
        temperature: 0 → greedy acceptance (output = AR greedy); > 0 → speculative sampling with
            ``q = softmax(draft_logits / T)`` and ``p = softmax(verifier_logits / T)``, both filtered by
            ``top_k`` / ``top_p`` (:func:`~workbench.decoding.sampling.sampling_probs`): the output is
            distributed as :func:`~workbench.decoding.ar.ar_decode` with the same options.
        precision: 'fp32' or 'bf16' (autocast). seed: RNG seed of the draft sampling and acceptance.
        real_continuation: real-context mode: after every ``block_length`` emitted tokens the context is
            reset to the real continuation ``(N, gen_len)`` (as :func:`~workbench.decoding.ar.ar_decode`
            does), so τ is measured on real text. ``None`` → free-running.
        block_length: segment length of the real-context mode (must divide ``gen_len``); ignored otherwise.
        layout: the draft layout, ``"in_block"`` (default) or ``"clean_prefix"`` (NLD §3.3's input; needs a
            gated LoRA or no adapter), see the module docstring.
        top_k, top_p: sampling filters (0 / 1 = off; ignored at temperature 0).

    Returns a :class:`~workbench.decoding.base.DecodeResult`: ``forwards`` = draft forwards,
    ``extra_forwards`` = verify forwards (one each per cycle a row takes part in),
    ``committed_per_step`` = tokens emitted per cycle (accepted + 1, last cycle truncated; sums to
    ``gen_len``), ``step_tokens`` = those tokens, ``model_calls`` = batched forwards (prefill excluded,
    real-context resets included).

    Raises :class:`~workbench.decoding.base.DecodeError` for ``draft_length < 1``, a negative
    temperature, an out-of-range ``top_k`` / ``top_p``, an unknown layout, ``clean_prefix`` with a plain (ungated) peft adapter, or lengths that do not
    fit the model context.
    """
    if draft_length < 1:
        raise DecodeError(f"draft length must be ≥ 1, got {draft_length}")
    check_sampling(temperature, top_k, top_p)
    if layout not in DRAFT_LAYOUTS:
        raise DecodeError(f"unknown draft layout {layout!r}; valid: {', '.join(DRAFT_LAYOUTS)}")
    if layout == "clean_prefix" and has_adapter(model) and not model.gated:
        raise DecodeError("draft layout clean_prefix needs a gated LoRA or no adapter: a plain LoRA drafter would "
                          "write the last verified token's keys with the adapter on; use in_block")
    gen = torch.Generator(device=model.device).manual_seed(seed)
    spec = LinearSpeculator(model, draft_length, temperature, gen, layout, top_k, top_p)
    return run_speculation(model, spec, prompts, gen_len, draft_length + 1, real_continuation, block_length,
                           pad_id, precision)
