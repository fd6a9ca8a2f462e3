"""DEER speculative decoding (arXiv:2512.15176 §3.2, Alg. 1): one-step block drafts by a diffusion drafter, exact AR
verification by the target (Eq. 5–6).

Each *cycle* (batched over rows in lockstep):

1. **Draft** (one drafter forward): the tokens verified since the last cycle are appended causally to the
   drafter's KV cache and the block ``[SEP, m_1..m_k]`` is read bidirectionally in the same forward
   (:func:`~workbench.deer.attention.draft_block_logits`); its logits at the ``k`` masks give
   ``q_θ(·|x_{1:j})``: the draft is their argmax (temperature 0) or a sample of
   ``softmax(logits / T)`` per position, each position independent of the others (§3.2).
2. **Verify** (one target forward): ``[pending, d_1..d_k]`` is appended to the target's KV cache, where
   ``pending`` is the last verified token (the whole prompt in the first cycle); the ``k + 1`` AR
   distributions are checked with :func:`~workbench.speculative.greedy_accept` (T = 0, output identical
   to AR greedy) or :func:`~workbench.speculative.speculative_accept` (T > 0, the min(1, p/q) rule with
   residual resampling of Eq. 5–6, so every token is distributed as AR sampling from the target).
3. Rows emit ``accepted + 1`` tokens. The cycle ends at the first rejection (the standard lossless rule). DEER's
   Alg. 1 (lines 4–15) instead appends the resampled token and goes on checking d_{i+1}..d_k against Eq. 5
   conditioned on it; those later drafts were drafted without that token, so this cycle stops there, and the τ
   here is not a literal Alg. 1's. Rejected draft tokens stay in the target's cache but are marked
   invalid in ``key_valid`` (position ids count valid keys only); the tail rejected by *every* row is
   cropped. The drafter receives the accepted tokens and the verifier's token as next cycle's chunk
   (ragged rows: right padding marked invalid). Rows that reached ``gen_len`` leave the batch.

Forward counts (per row): ``forwards`` = drafter forwards, ``extra_forwards`` = target verification
forwards (one each per cycle; no separate prefill: the first cycle's forwards read the prompt).
:class:`DeerResult` also records the accepted count of every cycle and both models' parameter counts,
for the cost-weighted real TPF (:meth:`DeerResult.tpf_cost`). Generation always emits exactly ``gen_len``
tokens per row (the last cycle is truncated; EOS does not stop it, like :func:`~workbench.decoding.ar.ar_decode`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..decoding.base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs
from ..speculative import greedy_accept, speculative_accept
from ..speculative.driver import pick_draft
from ..tokenizer import SEP_ID
from .attention import draft_block_logits
from .models import check_vocab_sizes, count_parameters


@dataclass
class DeerResult(DecodeResult):
    """:class:`~workbench.decoding.base.DecodeResult` plus DEER's bookkeeping.

    Attributes:
        accepted: per row, the number of draft tokens accepted in each cycle (before the final truncation).
        draft_length: k. drafter_params, target_params: parameter counts of the two models.
    """

    accepted: list[list[int]] = field(default_factory=list)
    draft_length: int = 0
    drafter_params: int = 0
    target_params: int = 0

    def tpf_cost(self, row: int) -> float:
        """Tokens per target-equivalent forward: ``tokens / (verify forwards + draft forwards · P_d / P_t)``,
        each drafter forward weighted by the parameter ratio (a FLOP proxy)."""
        ratio = self.drafter_params / max(1, self.target_params)
        return len(self.tokens[row]) / max(1e-9, self.extra_forwards[row] + self.forwards[row] * ratio)


@torch.no_grad()
def deer_decode(target, drafter, prompts: list[list[int]], gen_len: int, draft_length: int = 16,
                temperature: float = 0.0, pad_id: int = 0, sep_id: int = SEP_ID, precision: str = "fp32",
                seed: int = 0, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> DeerResult:
    """Generate ``gen_len`` tokens per prompt with DEER (Alg. 1).

    Args:
        target: AR target (a :class:`~workbench.model.trimode.TriModeLM`, used through ``extend`` only).
        drafter: diffusion drafter (a TriModeLM sharing the target's tokenizer).
        prompts: N prompts of token ids (any lengths; left-padded internally).
        gen_len: tokens to generate per prompt.
        draft_length: k, draft tokens per cycle.
        temperature: 0 → greedy drafts and greedy verification (output = AR greedy of the target);
            > 0 → sampled drafts and speculative-sampling verification at this temperature.
        pad_id: left-padding id (never attended). sep_id: the separator opening the draft block.
        precision: 'fp32' or 'bf16' (autocast). seed: RNG seed of drafts and acceptance draws.
        top_k, top_p: sampling filters of the drafts' ``q`` and the target's ``p`` alike (0 / 1 = off; ignored
            at temperature 0), see :func:`~workbench.decoding.sampling.sampling_probs`.

    Returns a :class:`DeerResult`.

    Raises:
        DecodeError: bad lengths, ``draft_length < 1``, a drafter/target context too short, a negative
            temperature or an out-of-range ``top_k`` / ``top_p``.
        TokenizerMismatchError: the two models' vocabularies differ in size.
    """
    if draft_length < 1:
        raise DecodeError(f"draft_length must be >= 1, got {draft_length}")
    check_sampling(temperature, top_k, top_p)
    check_lengths(target, prompts, gen_len + draft_length)
    check_lengths(drafter, prompts, gen_len + draft_length + 1)
    check_vocab_sizes(target, drafter)
    dev, k, n0 = target.device, draft_length, len(prompts)
    g = torch.Generator(device=dev).manual_seed(seed)
    ids, valid = left_pad(prompts, pad_id, dev)
    res = DeerResult(tokens=[[] for _ in range(n0)], forwards=[0] * n0, extra_forwards=[0] * n0,
                     committed_per_step=[[] for _ in range(n0)], step_tokens=[[] for _ in range(n0)],
                     accepted=[[] for _ in range(n0)], draft_length=k, drafter_params=count_parameters(drafter),
                     target_params=count_parameters(target))
    rows = list(range(n0))                       # original index of each live batch row
    t_cache, d_cache = target.new_cache(), drafter.new_cache()
    t_kv = torch.zeros((n0, 0), dtype=torch.bool, device=dev)
    d_kv = t_kv.clone()
    t_pend, t_pend_valid, d_pend, d_pend_valid = ids, valid, ids, valid
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        while rows:
            n = len(rows)
            block = torch.full((n, k + 1), drafter.mask_token_id, dtype=torch.long, device=dev)
            block[:, 0] = sep_id
            ones = torch.ones((n, k + 1), dtype=torch.bool, device=dev)
            logits = draft_block_logits(drafter, d_pend, block, torch.cat([d_kv, d_pend_valid, ones], 1), d_cache)
            d_kv = torch.cat([d_kv, d_pend_valid], 1)
            draft, q = pick_draft(logits[:, 1:], temperature, g, top_k, top_p)
            w = t_pend.shape[1]
            v_logits = target.extend(torch.cat([t_pend, draft], 1), t_cache,
                                     torch.cat([t_kv, t_pend_valid, ones[:, :k]], 1))[:, w - 1:]
            if temperature <= 0:
                acc = greedy_accept(draft, v_logits)
            else:
                acc = speculative_accept(draft, q, sampling_probs(v_logits, temperature, top_k, top_p), g)
            a, nxt = acc.accepted, acc.next_token
            slot = torch.arange(k, device=dev)[None, :]
            t_kv = torch.cat([t_kv, t_pend_valid, slot < a[:, None]], 1)
            drop = int((k - a).min())
            if drop:                                   # tail rejected by every row: remove it
                t_cache.crop(-drop)
                t_kv = t_kv[:, :-drop]
            t_pend, t_pend_valid = nxt[:, None], torch.ones((n, 1), dtype=torch.bool, device=dev)
            width = int(a.max()) + 1
            d_pend = torch.full((n, width), pad_id, dtype=torch.long, device=dev)
            d_pend[:, :width - 1] = draft[:, :width - 1]
            d_pend[torch.arange(n, device=dev), a] = nxt
            d_pend_valid = torch.arange(width, device=dev)[None, :] <= a[:, None]
            live = []
            for b, (i, ai) in enumerate(zip(rows, a.tolist())):
                take = (draft[b, :ai].tolist() + [int(nxt[b])])[:gen_len - len(res.tokens[i])]
                res.tokens[i] += take
                res.committed_per_step[i].append(len(take))
                res.step_tokens[i].append(take)
                res.accepted[i].append(ai)
                res.forwards[i] += 1
                res.extra_forwards[i] += 1
                if len(res.tokens[i]) < gen_len:
                    live.append(b)
            res.model_calls += 2
            if len(live) < n:
                sel = torch.tensor(live, dtype=torch.long, device=dev)
                rows = [rows[b] for b in live]
                if rows:
                    t_cache.batch_select_indices(sel)
                    d_cache.batch_select_indices(sel)
                    t_kv, d_kv, t_pend, t_pend_valid, d_pend, d_pend_valid = (
                        x[sel] for x in (t_kv, d_kv, t_pend, t_pend_valid, d_pend, d_pend_valid))
    res.wall_time = time.perf_counter() - t0
    return res


def deer_policy(model, prompts: list[list[int]], gen_len: int, drafter=None, draft_length: int = 16,
                temperature: float = 0.0, real_continuation=None, pad_id: int = 0, sep_id: int = SEP_ID,
                precision: str = "fp32", seed: int = 0, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P,
                **_ignored) -> DeerResult:
    """The ``deer`` decoding policy: :func:`deer_decode` with ``model`` as the target and ``drafter=`` the
    aligned diffusion drafter. DEER runs free-running only (``real_continuation`` must be ``None``);
    other harness options (block length, threshold) do not apply and are ignored.

    Raises :class:`~workbench.decoding.base.DecodeError` without a drafter or with a real continuation.
    """
    if drafter is None:
        raise DecodeError("the deer policy needs drafter=<a DEER drafter TriModeLM>")
    if real_continuation is not None:
        raise DecodeError("the deer policy decodes free-running only (no real-context mode)")
    return deer_decode(model, drafter, prompts, gen_len, draft_length=draft_length, temperature=temperature,
                       pad_id=pad_id, sep_id=sep_id, precision=precision, seed=seed, top_k=top_k, top_p=top_p)
