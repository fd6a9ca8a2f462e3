"""Quadratic self-speculation (NLD §3.4, App. C, Eq. 11, Fig. 12): drafting and verification in one
forward over an interleaved layout, with the optional AR–diffusion ensemble verifier.

Iteration ``t + 1`` has the verified prefix ``x_1..x_n`` in the KV cache, the last verified token
``x_{n+1}`` and the previous draft ``d_1..d_k`` (positions ``n+2..n+k+1``). One forward runs over
(layout in :mod:`workbench.speculative.quadratic_mask`)::

    [x_{n+1}, d_1..d_k]  +  [m_1..m_G | after x_{n+1}]  +  [m_1..m_G | after d_1]  + ... +  [m_1..m_G | after d_k]

* The causal outputs at ``x_{n+1}, d_1..d_k`` are the AR distributions ``p^AR_1..p^AR_{k+1}`` that
  verify ``d_1..d_k`` (plus the bonus position).
* Mask ``m_1`` of the group after anchor ``j`` sits at the position of ``d_{j+1}`` and gives its
  diffusion prediction ``p^diff_{j+1}`` — the paper's "diffusion prediction at the first newly inserted
  mask ``m_1`` immediately following" the preceding token. The verifier is
  ``p^ens = λ p^AR + (1 − λ) p^diff`` (``ensemble_lambda = λ``; λ = 1: pure AR).
* After accepting ``a`` drafts the verifier emits one more token at position ``n+2+a``; the group after
  the last accepted token (anchor ``a``) was denoised exactly on the now-verified prefix, and its masks
  ``m_2..m_{k+1}`` (positions ``n+3+a..n+2+a+k``) are the next draft.

Deviation from Eq. 11, and why: the paper's layout has ``k`` masks after each *speculative* token only.
In this tri-mode model a mask predicts the token *at* its position, so a group after the last accepted
token needs ``G = k + 1`` masks to reach ``k`` positions past the verifier's own token (its ``m_1`` is the
ensemble verifier's ``p^diff``); and a group after ``x_{n+1}`` is needed when no draft is accepted. So
the forward holds ``(k + 1) + (k + 1)^2`` tokens instead of ``1 + k + k^2``.

KV cache: the speculative stream never attends to masks, so its keys are exactly the AR keys; the
forward appends everything, the mask groups are cropped at once and rejected drafts are punched out
(:meth:`~workbench.speculative.context.SpecContext.commit`). No separate commit forward is needed:
``extra_forwards`` stays 0 and each iteration costs one forward. The first iteration of every segment
needs an initial draft: one forward over ``[x_{n+1}] + [m_1..m_k]`` (same layout, ``A = 1``), counted in
``forwards``.

Lossless: with λ = 1 and temperature 0 the output equals AR greedy decoding; with λ = 1 and
temperature > 0 it is distributed as AR sampling. With λ < 1 the output follows the ensemble, not the
AR model. Adapters: a gated LoRA (a converted AR model, :mod:`workbench.model.gated_lora`) runs per token
in the one forward, base + LoRA on the mask groups and the base alone on the speculative stream, so the
drafts come from the converted diffusion mode and the verifier is still the base. A plain LoRA drafter
adapter cannot be limited to the masks inside one forward, so it is disabled for the whole decode (the
verifier must be the plain AR model).
"""
from __future__ import annotations

import torch

from ..decoding.base import DecodeError, DecodeResult
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs
from ..model.gated_lora import lora_positions
from .adapter import verifier_mode
from .context import SpecContext
from .driver import (Tally, drafted_probs, emitted_probs, masked_draft_logits, next_token_q, pick_draft,
                     run_speculation, verify)
from .quadratic_mask import quadratic_mask, quadratic_offsets


def quadratic_forward(model, ctx: SpecContext, spec: torch.Tensor, group_size: int, keep_spec: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over the interleaved layout after the cached prefix.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM`.
        ctx: the verified context (cache + validity).
        spec: ``(N, A)`` speculative stream ``[x_{n+1}, d_1..d_{A-1}]``.
        group_size: ``G`` masks per group.
        keep_spec: leave the ``A`` speculative keys appended to the cache (for
            :meth:`SpecContext.commit`); otherwise crop them too.

    Returns ``(ar, diff)``: AR logits ``(N, A, V)`` (row ``j`` predicts the token after anchor ``j``) and
    diffusion logits ``(N, A, G, V)`` of the groups (float, [MASK] forbidden).
    """
    n, a = spec.shape
    masks = torch.full((n, a * group_size), model.mask_token_id, dtype=torch.long, device=spec.device)
    ids = torch.cat([spec, masks], dim=1)
    pos = ctx.positions()[:, None] + quadratic_offsets(a, group_size, spec.device)[None, :]
    attn = quadratic_mask(ctx.valid, a, group_size, model.mask_dtype)
    gate = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    gate[:, a:] = True                       # gated LoRA: the mask groups are the noisy stream, spec is clean
    # a gated LoRA serves both streams in this forward; a plain LoRA drafter is switched off (it has no gate)
    with lora_positions(model, gate) if model.gated else verifier_mode(model):
        logits = model.forward_backbone(ids, pos, attn, ctx.cache)
    ctx.cache.crop(-(a * group_size if keep_spec else a + a * group_size))
    diff = masked_draft_logits(logits[:, a:].reshape(n, a, group_size, -1), model.mask_token_id)
    return model.hide_mask_column(logits[:, :a]).float(), diff


def ensemble_verifier(ar_logits: torch.Tensor, diff_logits: torch.Tensor, ensemble_lambda: float,
                      temperature: float, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> torch.Tensor:
    """AR–diffusion ensemble verifier (NLD App. C): ``λ softmax(z^AR / T) + (1 − λ) softmax(z^diff / T)``, each
    term the sampling distribution :func:`~workbench.decoding.sampling.sampling_probs` (with ``top_k`` /
    ``top_p``, at T > 0) so that λ = 1 gives exactly the verifier a sampled AR decode draws from. For λ < 1 the
    mixture of two filtered distributions may put mass on more than ``top_k`` tokens (λ < 1 is lossy anyway).

    Args:
        ar_logits, diff_logits: ``(N, k + 1, V)``, aligned so that row ``j`` of both predicts the same
            position (the AR logits at anchor ``j`` and the diffusion logits at ``m_1`` after it).
        ensemble_lambda: λ in [0, 1].
        temperature: T (> 0 for sampling; 0 uses T = 1, only the argmax matters then).

    Returns probabilities ``(N, k + 1, V)``.
    """
    p_ar = sampling_probs(ar_logits, temperature, top_k, top_p)
    p_diff = sampling_probs(diff_logits, temperature, top_k, top_p)
    return ensemble_lambda * p_ar + (1.0 - ensemble_lambda) * p_diff


class QuadraticSpeculator:
    """Iterations of quadratic self-speculation (see the module docstring)."""

    def __init__(self, model, k: int, ensemble_lambda: float, temperature: float, generator: torch.Generator,
                 top_k: int = NO_TOP_K, top_p: float = NO_TOP_P):
        self.model, self.k, self.lam = model, k, ensemble_lambda
        self.temperature, self.generator = temperature, generator
        self.warp = {"top_k": top_k, "top_p": top_p}          # the sampling filters of q and p alike
        self.draft: torch.Tensor | None = None          # (N, k)
        self.q: torch.Tensor | None = None              # (N, k, V) drafter distributions (sampling only)
        self.draft_q: torch.Tensor | None = None        # (N, k) q of each draft token (I-DLM §2)

    def start(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> None:
        """Initial draft of the segment: groups of ``k`` masks after ``x_{n+1}`` alone (one forward)."""
        _, diff = quadratic_forward(self.model, ctx, ctx.last[:, None], self.k, keep_spec=False)
        tally.count(active)
        self.draft, self.q = pick_draft(diff[:, 0], self.temperature, self.generator, **self.warp)
        self.draft_q = drafted_probs(diff[:, 0], self.draft, self.q, self.temperature)

    def cycle(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> list[list[int]]:
        k, draft = self.k, self.draft
        spec = torch.cat([ctx.last[:, None], draft], dim=1)
        ar, diff = quadratic_forward(self.model, ctx, spec, k + 1, keep_spec=True)
        tally.count(active)
        if self.lam == 1.0:
            res = verify(draft, self.q, ar, self.temperature, self.generator, **self.warp)
        else:
            p = ensemble_verifier(ar, diff[:, :, 0], self.lam, self.temperature, **self.warp)
            res = verify(draft, self.q, p, self.temperature, self.generator, probs=True)
        rows = torch.arange(draft.shape[0], device=draft.device)
        if self.lam == 1.0:
            next_q = next_token_q(res, ar[rows, res.accepted], self.temperature, **self.warp)
        else:                                   # p is the sampling distribution itself
            next_q = res.next_prob if res.next_prob is not None else \
                p[rows, res.accepted].gather(-1, res.next_token[:, None])[:, 0]
        self.last_probs = emitted_probs(self.draft_q, res.accepted, next_q)
        nxt = diff[rows, res.accepted, 1:]
        self.draft, self.q = pick_draft(nxt, self.temperature, self.generator, **self.warp)
        self.draft_q = drafted_probs(nxt, self.draft, self.q, self.temperature)
        slots = torch.arange(k + 1, device=draft.device)[None, :]
        ctx.commit(slots <= res.accepted[:, None], res.next_token, active)
        return res.emitted(draft)


def quadratic_self_speculation(model, prompts: list[list[int]], gen_len: int, draft_length: int = 4,
                               ensemble_lambda: float = 1.0, temperature: float = 0.0, precision: str = "fp32",
                               seed: int = 0, pad_id: int = 0, real_continuation: list[list[int]] | None = None,
                               block_length: int | None = None, top_k: int = NO_TOP_K,
                               top_p: float = NO_TOP_P) -> DecodeResult:
    """Quadratic self-speculation decoding (NLD App. C, Eq. 11), batched over prompts of any lengths.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM` (a gated LoRA runs on the mask groups only; a
            plain LoRA drafter adapter is disabled throughout).
        prompts: N prompts of token ids (left-padded internally with ``pad_id``).
        gen_len: tokens emitted per prompt (the last iteration is truncated).
        draft_length: k, speculative tokens verified per iteration; one forward holds
            ``(k + 1)(k + 2)`` new tokens.
        ensemble_lambda: λ of the AR–diffusion ensemble verifier in [0, 1]; 1 = pure AR (lossless).
        temperature: 0 → greedy acceptance; > 0 → speculative sampling, drafts sampled from
            ``q = softmax(z^diff / T)`` and verified against ``p^ens`` at temperature T.
        top_k, top_p: sampling filters of ``q`` and of both ensemble terms (0 / 1 = off; ignored at
            temperature 0).
        precision, seed, real_continuation, block_length: as in
            :func:`~workbench.speculative.linear.linear_self_speculation`.

    Returns a :class:`~workbench.decoding.base.DecodeResult`: ``forwards`` = quadratic forwards +
    initial-draft forwards, ``extra_forwards`` = 0 (verification and cache commit ride in the same
    forward), ``committed_per_step`` = tokens emitted per iteration (accepted + 1; sums to ``gen_len``).

    Raises :class:`~workbench.decoding.base.DecodeError` for ``draft_length < 1``, λ outside [0, 1], a
    negative temperature, an out-of-range ``top_k`` / ``top_p`` or lengths that do not fit the model context.
    """
    if draft_length < 1:
        raise DecodeError(f"draft length must be ≥ 1, got {draft_length}")
    if not 0.0 <= ensemble_lambda <= 1.0:
        raise DecodeError(f"ensemble_lambda must be in [0, 1], got {ensemble_lambda}")
    check_sampling(temperature, top_k, top_p)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    spec = QuadraticSpeculator(model, draft_length, float(ensemble_lambda), temperature, gen, top_k, top_p)
    return run_speculation(model, spec, prompts, gen_len, 2 * draft_length + 2, real_continuation, block_length,
                           pad_id, precision)
