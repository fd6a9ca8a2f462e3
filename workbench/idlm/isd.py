"""Introspective strided decoding (I-DLM §3.2, Algorithm 1, App. F), batched, with the introspection fused into the
next stride's forward so that every step is one forward.

State per row (as in :mod:`workbench.speculative.context`): the verified prefix in the KV cache, the last verified
token ``x`` not yet cached, and possibly ``N − 1`` pending proposals ``d_1..d_{N−1}`` for the positions after ``x``.
Every step runs one strictly causal forward over ``2N − 1`` tokens:

* a row **with** proposals (a P step): ``[x, d_1..d_{N−1}, M_1..M_{N−1}]``. The logits at ``x, d_1..d_{N−1}``
  (clean positions: with a gated LoRA, the base model) are the causal anchors ``p_1..p_N``: ``p_j`` verifies
  ``d_j``, ``p_N`` gives the bonus token. The masks, which see the proposals, propose the next
  ``d'_1..d'_{N−1}``, valid only if every proposal is accepted;
* a row **without** (an NP step, at the start and after a rejection): ``[x, M_1..M_{2N−2}]``: the logits at ``x``
  give the exact next token (an AR prediction, always accepted), and ``M_1..M_{N−1}`` propose the tokens after it
  (the remaining masks pad the row to the batch's shape and are ignored).

Mask slot ``j`` sits one position after the token it follows and, by the logit shift, predicts the token one
position *after* its own (a mask at position ``i`` predicts ``x_{i+1}``), exactly as the I-DLM training mask makes
it (noisy position ``i`` sees clean tokens before its stride-sized block and earlier masks of the block).

**Acceptance** (Algorithm 1, lines 15–28): at temperature 0, a proposal is accepted iff it is the anchor's argmax,
the first rejection emits the anchor's argmax, and a fully accepted step emits the bonus token: the output equals
AR greedy of the anchors' model token for token. At temperature T > 0:

* ``proposal="argmax"`` (the I-DLM engine, :func:`idlm_engine_accept`): proposals are the argmax of the masks'
  logits, and they are verified against the **full** draft distribution ``q = softmax(mask logits / T)``, as the
  engine verifies them (``idlm_blockN.py``: it stores the draft's scaled logits): ``d_j`` is accepted when
  ``u < p_j(d_j) / q_j(d_j)`` with ``p_j = softmax(anchor_j / T)`` (neither filtered by top-k / top-p), the
  first rejection emits a draw from normalize(max(0, p_j − q_j)), and a fully accepted step a draw from the
  filtered ``p_N``. As ``d`` is the argmax of ``q`` and not a draw from it, the emitted tokens are not exactly
  distributed as ``p``: this is the engine's rule, not a lossless one;
* ``proposal="sample"``: ``d ~ q = softmax(mask logits / T)`` (filtered as ``p``), verified by the speculative
  sampling rule (Leviathan et al. 2023), so every emitted token is distributed as a draw from the filtered
  ``p = softmax(anchor / T)``.

**KV cache**: only the accepted tokens' keys are kept (clean positions, so with a gated LoRA they are the base's
keys); rejected proposals and every mask are punched out or cropped.

**Lossless R-ISD** (App. G): with a per-token gated LoRA, clean positions run the base model only and, by strict
causality, never attend to a mask, so the anchors are exactly the base model's AR distributions.
"""
from __future__ import annotations

import torch

from ..decoding.base import DecodeError, DecodeResult
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs
from ..model.gated_lora import lora_positions
from ..speculative.accept import AcceptResult, accepted_prefix_length, greedy_accept, speculative_accept
from ..speculative.context import SpecContext
from ..speculative.driver import (Tally, drafted_probs, emitted_probs, masked_draft_logits, pick_draft,
                                  run_speculation, token_probs)


def isd_tpf(accept: list[float]) -> float:
    """I-DLM Eq. 3: expected tokens per forward of ISD at stride ``N = len(accept) + 1``.

    ``accept[k − 1]`` = p_k, the acceptance probability of the k-th strided proposal (k = 1..N−1), so
    ``P_k = Π_{j ≤ k} p_j`` and ``TPF_N = (2 + P_1 + … + P_{N−2}) / (2 − P_{N−1})``. Raises ``ValueError`` for
    fewer than one probability or one outside [0, 1].
    """
    if not accept or any(not 0.0 <= p <= 1.0 for p in accept):
        raise ValueError(f"need N − 1 ≥ 1 acceptance probabilities in [0, 1], got {accept}")
    cum, c = [], 1.0
    for p in accept:
        c *= p
        cum.append(c)
    return (2.0 + sum(cum[:-1])) / (2.0 - cum[-1])


def idlm_engine_accept(draft: torch.Tensor, draft_probs: torch.Tensor, verify_probs: torch.Tensor,
                       bonus_probs: torch.Tensor, generator: torch.Generator | None = None,
                       relax: float = 0.0) -> AcceptResult:
    """The I-DLM engine's verification at temperature > 0 (thuEcstasy/I-DLM
    ``inference/sglang/sglang/srt/dllm/algorithm/idlm_blockN.py: IDLMBlockN.run``, "Standard verify", and
    ``_batched_sample`` for the bonus token), batched over rows, in the engine's order of random draws.

    Args:
        draft: ``(N, k)`` proposals (the argmax of the draft logits).
        draft_probs: ``(N, k, V)`` ``q_j``: the full softmax of the draft logits at the temperature.
        verify_probs: ``(N, k, V)`` ``p_j``: the full softmax of the anchors verifying them at the temperature.
        bonus_probs: ``(N, V)``: the sampling distribution of the bonus token (the anchor after the last proposal,
            temperature, top-k and top-p applied: the engine's ``_batched_sample``).
        generator: RNG of the draws: ``rand (N·k)`` uniforms, then one correction per proposal from
            normalize(max(0, p_j − q_j)) (``p_j`` where that is empty), then the bonus token.
        relax: τ ≥ 0 of I-DLM §4.3: the ratio is ``(1 + τ) p/q`` (the engine's ``verify_alpha`` = 1 / (1 + τ)).

    ``d_j`` passes when ``ratio ≥ 1`` or ``u_j < ratio`` (``ratio = 0`` where ``q_j(d_j) = 0``); ``accepted`` is
    the leading run of passes; the emitted token is the correction at the first failure, else the bonus token.
    Returns an :class:`~workbench.speculative.accept.AcceptResult` whose ``next_prob`` is the probability of the
    emitted token under the distribution it was drawn from.
    """
    n, k = draft.shape
    p = verify_probs.float()
    q = draft_probs.float()
    p_d = p.gather(-1, draft[..., None])[..., 0]
    q_d = q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(n * k, generator=generator, device=draft.device).view(n, k)
    scaled_q = q_d / (1.0 + relax)
    ratio = torch.where(scaled_q > 0, p_d / scaled_q, torch.zeros_like(p_d))
    accepted = accepted_prefix_length((ratio >= 1.0) | (u < ratio))
    corrected = (p - q).clamp_min(0)
    sums = corrected.sum(-1, keepdim=True)
    corrected = torch.where(sums > 0, corrected / sums, p)
    corr = torch.multinomial(corrected.reshape(n * k, -1), 1, generator=generator).view(n, k)
    bonus = torch.multinomial(bonus_probs.float(), 1, generator=generator)[:, 0]
    rows = torch.arange(n, device=draft.device)
    at = accepted.clamp_max(k - 1)
    full = accepted == k
    next_token = torch.where(full, bonus, corr[rows, at])
    next_prob = torch.where(full, bonus_probs.float().gather(-1, bonus[:, None])[:, 0],
                            corrected[rows, at].gather(-1, corr[rows, at][:, None])[:, 0])
    return AcceptResult(accepted, next_token, next_prob)


class ISDSpeculator:
    """The steps of ISD at stride ``N`` (see the module docstring); plugs into
    :func:`~workbench.speculative.driver.run_speculation`."""

    def __init__(self, model, stride: int, temperature: float, generator: torch.Generator, proposal: str = "argmax",
                 relax: float = 0.0, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P):
        self.model, self.n, self.temperature, self.generator, self.proposal = model, stride, temperature, generator, proposal
        self.relax = relax
        self.warp = {"top_k": top_k, "top_p": top_p}          # the sampling filters of q and p alike (Table 8)
        self.draft: torch.Tensor | None = None          # (rows, N − 1) pending proposals
        self.has: torch.Tensor | None = None            # (rows,) bool: the row has pending proposals
        self.q: torch.Tensor | None = None              # (rows, N − 1, V) their distributions (sampled proposals)
        self.draft_q: torch.Tensor | None = None        # (rows, N − 1) q of each proposal (I-DLM §2)
        #: per proposal slot j (0-based), proposals verified and accepted there (for Eq. 3)
        self.verified = [0] * (stride - 1)
        self.accepted = [0] * (stride - 1)

    def start(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> None:
        """A segment starts with a propose-only (NP) step: no pending proposals."""
        n = ctx.last.shape[0]
        self.draft = torch.zeros((n, self.n - 1), dtype=torch.long, device=ctx.last.device)
        self.has = torch.zeros(n, dtype=torch.bool, device=ctx.last.device)
        self.q = None

    def _propose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Proposals ``(rows, N − 1)`` from mask logits ``(rows, N − 1, V)``, the distribution they are verified
        against (``None`` at temperature 0; for argmax proposals at T > 0 the full draft softmax, as the engine)
        and each proposal's ``q_k`` ``(rows, N − 1)`` (I-DLM §2)."""
        z = masked_draft_logits(logits, self.model.mask_token_id)
        if self.temperature > 0 and self.proposal == "argmax":
            d = z.argmax(-1)
            q = sampling_probs(z, self.temperature)
        else:
            d, q = pick_draft(z, self.temperature, self.generator, **self.warp)
        return d, q, drafted_probs(z, d, q, self.temperature)

    def cycle(self, ctx: SpecContext, tally: Tally, active: torch.Tensor) -> list[list[int]]:
        m, n = self.model, self.n
        rows = ctx.last.shape[0]
        dev = ctx.last.device
        masks = torch.full((rows, 2 * n - 2), m.mask_token_id, dtype=torch.long, device=dev)
        body = torch.where(self.has[:, None], self.draft, masks[:, : n - 1])
        ids = torch.cat([ctx.last[:, None], body, masks[:, : n - 1]], dim=1)        # (rows, 2N − 1)
        kv = ctx.with_new(2 * n - 1)
        with lora_positions(m, ids == m.mask_token_id):      # gated LoRA: masks propose, clean positions are the base
            logits = m._cached_forward(ids, ctx.cache, kv, causal=True).float()
        tally.count(active)
        # (rows, N, V): p_1..p_N on P rows, the mask column hidden as in every AR forward (the base model, or one
        # given an added mask token, never had that token: AR greedy's argmax cannot be it)
        anchors = m.hide_mask_column(logits[:, :n])
        p_rows = self.has
        # P rows: verify the pending proposals against the anchors
        # before the first proposals (every row an NP row) a placeholder q: its verification is discarded
        q = self.q if self.q is not None else torch.nn.functional.one_hot(self.draft, anchors.shape[-1]).float()
        if self.temperature <= 0:
            res = greedy_accept(self.draft, anchors)
        elif self.proposal == "argmax":                 # the engine: full draft softmax, unfiltered p
            res = idlm_engine_accept(self.draft, q, sampling_probs(anchors[:, : n - 1], self.temperature),
                                     sampling_probs(anchors[:, n - 1], self.temperature, **self.warp),
                                     self.generator, self.relax)
        else:
            p = sampling_probs(anchors, self.temperature, **self.warp)
            res = speculative_accept(self.draft, q, p, self.generator, self.relax)
        # NP rows: the exact token from the anchor at x
        if self.temperature <= 0:
            exact = anchors[:, 0].argmax(-1)
        else:
            probs = sampling_probs(anchors[:, 0], self.temperature, **self.warp)
            exact = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        accepted = torch.where(p_rows, res.accepted, torch.zeros_like(res.accepted))
        next_token = torch.where(p_rows, res.next_token, exact)
        full = p_rows & (accepted == n - 1)
        # proposals for the next step: P rows that accepted everything take masks N..2N−2 (after the bonus
        # token's slot); NP rows take masks 1..N−1 (after the exact token); everyone else has none
        # q_k(x_k) of the emitted tokens (I-DLM §2): the proposals' own; a resampled correction's from the residual
        # norm(max(0, p − q)) it was drawn from; the anchors' for the bonus and the exact token
        anchor_at = torch.where(p_rows, accepted, torch.zeros_like(accepted))
        rows_i = torch.arange(rows, device=dev)
        next_q = token_probs(anchors[rows_i, anchor_at][:, None], next_token[:, None], self.temperature,
                             **self.warp)[:, 0]
        if res.next_prob is not None:                   # a resampled correction came from norm(max(0, p − q))
            next_q = torch.where(p_rows, res.next_prob, next_q)
        self.last_probs = emitted_probs(self.draft_q if self.draft_q is not None else
                                        torch.ones_like(self.draft, dtype=torch.float32), accepted, next_q)
        d_p, q_p, dq_p = self._propose(logits[:, n: 2 * n - 1])
        d_np, q_np, dq_np = self._propose(logits[:, 1: n])
        self.draft = torch.where(p_rows[:, None], d_p, d_np)
        self.draft_q = torch.where(p_rows[:, None], dq_p, dq_np)
        if q_p is not None:
            self.q = torch.where(p_rows[:, None, None], q_p, q_np)
        self.has = (full | ~p_rows) & active
        for r in (p_rows & active).nonzero().flatten().tolist():
            a = int(accepted[r])
            for j in range(min(a + 1, n - 1)):
                self.verified[j] += 1
                self.accepted[j] += int(j < a)
        slots = torch.arange(2 * n - 1, device=dev)[None, :]
        keep = (slots <= accepted[:, None]) & (slots < n) & (p_rows[:, None] | (slots == 0))
        emitted_draft = torch.where(p_rows[:, None], ids[:, 1:n], torch.zeros_like(ids[:, 1:n]))
        ctx.commit(keep, next_token, active)
        return [emitted_draft[r, : int(accepted[r])].tolist() + [int(next_token[r])] for r in range(rows)]

    def acceptance(self) -> list[float]:
        """Measured acceptance rate per proposal slot (verified proposals only), for Eq. 3."""
        return [a / v if v else float("nan") for a, v in zip(self.accepted, self.verified)]

    def pooled_acceptance(self) -> float:
        """Accepted over verified proposals, pooled over the slots (I-DLM §3.2's single p); NaN if none."""
        verified = sum(self.verified)
        return sum(self.accepted) / verified if verified else float("nan")


def isd_decode(model, prompts: list[list[int]], gen_len: int, stride: int = 4, temperature: float = 0.0,
               proposal: str = "argmax", precision: str = "fp32", seed: int = 0, pad_id: int = 0,
               real_continuation: list[list[int]] | None = None, block_length: int | None = None,
               relax: float = 0.0, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> DecodeResult:
    """ISD at stride ``N`` (I-DLM Algorithm 1; see the module docstring), batched over prompts of any lengths.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM` with a mask token, trained with
            ``objective: idlm`` (full, or a gated LoRA: then lossless R-ISD against the base).
        prompts: N prompts of token ids. gen_len: tokens emitted per prompt (the last step is truncated).
        stride: N ≥ 2: ``N − 1`` mask slots per step, up to ``N`` tokens per forward (the ``N − 1`` proposals and
            the anchor's token: the bonus when all pass).
        temperature: 0 → greedy (output = AR greedy of the anchors' model); > 0 → speculative sampling.
        proposal: ``"argmax"`` (the paper's engine) or ``"sample"`` (temperature > 0 only).
        relax: relaxed acceptance τ ≥ 0 (I-DLM §4.3, Table 4): the acceptance ratio is multiplied by ``1 + τ``;
            0 is the exact rule, τ > 0 trades the lossless guarantee for TPF. Temperature > 0 only (at 0 the
            anchors are one-hot and the ratio is 0 or 1).
        top_k, top_p: sampling filters of the proposals' ``q`` and the anchors' ``p`` alike (I-DLM Table 8 uses
            top-k 50, top-p 0.95; 0 / 1 = off; ignored at temperature 0), see
            :func:`~workbench.decoding.sampling.sampling_probs`.
        precision, seed, pad_id, real_continuation, block_length: as
            :func:`~workbench.speculative.linear.linear_self_speculation`.

    Returns a :class:`~workbench.decoding.base.DecodeResult`: ``forwards`` = ISD steps (one forward of
    ``2N − 1`` tokens each), no extra forwards, ``committed_per_step`` = tokens emitted per step; plus the
    attributes ``slot_acceptance`` (measured acceptance per proposal slot ``p_k``, for Eq. 3),
    ``slot_verified`` and ``slot_accepted`` (the counts behind it) and ``acceptance_rate`` (accepted over verified
    proposals pooled over the slots: the single per-token ``p`` of I-DLM §3.2, "p ≥ 0.85").

    Raises :class:`~workbench.decoding.base.DecodeError` for ``stride < 2``, a negative temperature, an
    out-of-range ``top_k`` / ``top_p``, an unknown proposal rule, a negative ``relax`` or one at temperature 0,
    or lengths beyond the model context;
    :class:`~workbench.tokenizer.TokenizerError` for a model without a mask token (``--add_mask_token``).
    """
    if stride < 2:
        raise DecodeError(f"the ISD stride N must be ≥ 2 (N − 1 mask slots per step), got {stride}")
    check_sampling(temperature, top_k, top_p)
    if proposal not in ("argmax", "sample"):
        raise DecodeError(f"unknown proposal rule {proposal!r}; valid: argmax, sample")
    if relax < 0 or (relax > 0 and temperature <= 0):
        raise DecodeError(f"the relaxed acceptance τ must be ≥ 0 and needs temperature > 0; got τ = {relax} at "
                          f"temperature {temperature}")
    model.mask_token_id                                       # noqa: B018 - raises TokenizerError without one
    gen = torch.Generator(device=model.device).manual_seed(seed)
    spec = ISDSpeculator(model, stride, temperature, gen, proposal, relax, top_k, top_p)
    res = run_speculation(model, spec, prompts, gen_len, 2 * stride - 1, real_continuation, block_length, pad_id,
                          precision)
    res.slot_acceptance = spec.acceptance()
    res.slot_verified, res.slot_accepted = list(spec.verified), list(spec.accepted)
    res.acceptance_rate = spec.pooled_acceptance()
    return res
