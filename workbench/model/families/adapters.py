"""Adapters: a released diffusion LM behind the interface every decoder calls.

Decoders, the collector, the SOL search and the sampler call the methods of
:class:`~workbench.model.trimode.TriModeLM`:

* ``new_cache()``;
* ``extend(ids, cache, key_valid, logits_to_keep=0)``: commit tokens (prompt prefill, a finished block);
* ``diffusion_logits(block, cache, key_valid, future_masks=0)`` → ``(N, B, V)``, logit ``j`` predicting block
  token ``j``, the cache left as it was;
* ``mask_token_id``, ``vocab_size``, ``modes``.

Each adapter here reproduces its family's reference forward exactly behind those calls:

* ``WindowFamilyLM`` (NLD): the block sees the causal prefix and itself; causal commits (exact KV cache).
* ``CausalFamilyLM`` (I-DLM): causal and shifted everywhere; causal commits (exact KV cache).
* ``BlockCausalFamilyLM`` (SDAR, Fast-dLLM v2): block-causal at absolute positions; only whole blocks are
  committed, a partial block's tokens are held back and recomputed.
* ``RecomputeFamilyLM`` (LLaDA, Dream): the whole sequence, future masks included, recomputed every forward; the
  cache keeps token ids.

Shifted families (``spec.shift``: Dream, Fast-dLLM v2, I-DLM) are realigned here: block position 0 is predicted by
the logit of the token before it (the last committed one's, kept at its commit), position ``j`` by position
``j - 1``'s, so every decoder reads ``logits[:, j]`` as the prediction of block token ``j`` whatever the family.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..masks import position_allowed, to_additive
from ..trimode import TriModeLM
from .spec import FamilyError, FamilySpec


class FamilyLM(TriModeLM):
    """A :class:`~workbench.model.trimode.TriModeLM` whose semantics come from a registered family.

    Args:
        backbone: the built-in transformers model holding the weights.
        spec: the :class:`~workbench.model.families.spec.FamilySpec`.
        mask_token_id: the mask id read from the checkpoint (``None``: the family has none).
        block_size: the block size the family was trained with (``None``: any).
    """

    def __init__(self, backbone, spec: FamilySpec, mask_token_id: int | None, block_size: int | None):
        super().__init__(backbone, mask_token_id)
        self.family = spec
        self.block_size = block_size
        #: A commit appends causal KV columns that later forwards may read as they are (NLD, I-DLM); False where
        #: the family holds partial blocks back or recomputes (consumers that keep KV columns themselves, such as
        #: SOL's prefix bank, then recompute the prefix through :meth:`extend`).
        self.causal_prefix = spec.commit_attention == "causal" and not spec.shift   # shifted: keeps a last logit

    @property
    def modes(self) -> frozenset:
        """The decoding modes of the family (``'diffusion'``, ``'ar'``)."""
        return self.family.modes

    def require_mode(self, mode: str, what: str) -> None:
        """Raise :class:`~workbench.model.families.spec.FamilyError` (one line) when the family lacks ``mode``."""
        if mode not in self.modes:
            raise FamilyError(f"{what} needs the {mode} mode, which the {self.family.name} family does not have "
                              f"(its modes: {', '.join(sorted(self.modes))})")

    def causal_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward ``(N, L) -> (N, L, V)``; families without an AR mode raise :class:`FamilyError`."""
        self.require_mode("ar", "a causal (AR) forward")
        return super().causal_logits(ids)

    def _unsupported(self, what: str):
        raise FamilyError(f"{what} is not available for the {self.family.name} family (its forward is "
                          f"{self.family.diffusion_attention}-attention; modes: {', '.join(sorted(self.modes))})")

    def dual_stream_logits(self, *a, **kw):
        """The tri-mode training forward: NLD only (its own objective); other families raise :class:`FamilyError`."""
        self._unsupported("the tri-mode training forward (workbench train lm)")

    def noisy_stream_logits(self, *a, **kw):
        """See :meth:`dual_stream_logits`."""
        self._unsupported("the tri-mode training forward (workbench train lm)")

    def extend_and_diffuse(self, *a, **kw):
        """One forward that commits a chunk and denoises a block (self-drafting): NLD only."""
        self._unsupported("a joint commit-and-denoise forward (self-speculation)")


class WindowFamilyLM(FamilyLM):
    """NLD: causal prefix and commit, the block bidirectional over the cached prefix and itself, unshifted logits
    and an AR mode from the same head: exactly :class:`~workbench.model.trimode.TriModeLM`'s semantics
    (NLD §3.2; vLLM ``nemotron_dllm``), so nothing is overridden but the training forwards, which NLD shares."""

    dual_stream_logits = TriModeLM.dual_stream_logits
    extend_and_diffuse = TriModeLM.extend_and_diffuse


def _last_logits(cache) -> torch.Tensor:
    last = getattr(cache, "family_last_logits", None)
    if last is None:
        raise FamilyError("a shifted family predicts block position 0 from the last committed token's logit; "
                          "commit the prompt (extend) before the first denoising forward")
    return last


class CausalFamilyLM(FamilyLM):
    """I-DLM: strictly causal attention everywhere (masks are look-ahead slots) and shifted logits. The KV cache is
    an ordinary causal one; every commit keeps its last logit on the cache (``family_last_logits``) for block
    position 0 of the next denoising forward."""

    def extend(self, ids, cache, key_valid, logits_to_keep: int = 0):
        """Causal commit of ``ids`` ``(N, Q)`` (see :meth:`TriModeLM.extend`); keeps the last position's logits
        ``(N, V)`` on the cache. Returns ``(N, Q, V)`` (or the last ``logits_to_keep`` positions)."""
        out = super().extend(ids, cache, key_valid, logits_to_keep=logits_to_keep)
        cache.family_last_logits = out[:, -1].detach()
        return out

    def diffusion_logits(self, block, cache, key_valid, future_masks: int = 0):
        """Causal forward of ``block`` ``(N, B)`` after the cache, realigned: ``[:, 0]`` is the last committed
        token's logit, ``[:, j]`` block position ``j - 1``'s. The cache is cropped back. ``future_masks`` is
        ignored (a causal position never sees a later one)."""
        b = block.shape[1]
        logits = self._cached_forward(block, cache, key_valid, causal=True)
        cache.crop(-b)
        return torch.cat([_last_logits(cache)[:, None].to(logits.dtype), logits[:, :-1]], dim=1)


@dataclass
class _BlockState:
    """Bookkeeping of a :class:`BlockCausalFamilyLM` cache: what the KV columns hold and what is held back.

    ``valid``/``pos`` ``(N, C)``: cache columns holding a committed token, and their position ids; ``count``
    ``(N,)``: committed tokens per row (a multiple of the block size); ``pend_ids``/``pend_valid`` ``(N, T)``:
    the tokens of the current partial block, right-aligned (recomputed with every forward, never cached);
    ``last`` ``(N, V)`` or None: the last committed token's logit (shifted families)."""

    valid: torch.Tensor
    pos: torch.Tensor
    count: torch.Tensor
    pend_ids: torch.Tensor
    pend_valid: torch.Tensor
    last: torch.Tensor | None = None


def _right_align(rows: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-align 1-D id tensors into ``(N, T)`` ids (0 where empty) and ``(N, T)`` validity."""
    width = max((len(r) for r in rows), default=0)
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    valid = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r):] = r
            valid[i, width - len(r):] = True
    return ids, valid


class BlockCausalFamilyLM(FamilyLM):
    """SDAR and Fast-dLLM v2: block-causal attention at absolute positions in every forward (prompt prefill,
    denoising and commit): position ``p`` sees position ``k`` iff ``k // S ≤ p // S`` for the family's block size
    ``S`` (SDAR ``generate.py``: ``block_diffusion_attention_mask``). Only whole blocks enter the KV cache; the
    tokens of a partial block (the prompt's tail, or a decoding window that does not end on a block boundary) are
    held back on the cache and recomputed with the next forward, as the reference recomputes them inside the
    first decoded block. Fast-dLLM v2's logits are shifted."""

    def new_cache(self):
        """An empty KV cache with the block bookkeeping (``family_state``) attached."""
        cache = super().new_cache()
        cache.family_state = None                      # made on the first forward, when the batch size is known
        return cache

    def _state(self, cache, n: int) -> _BlockState:
        st = getattr(cache, "family_state", None)
        if isinstance(st, _BlockState):
            return st
        dev = self.device
        st = _BlockState(valid=torch.zeros((n, 0), dtype=torch.bool, device=dev),
                         pos=torch.zeros((n, 0), dtype=torch.long, device=dev),
                         count=torch.zeros((n,), dtype=torch.long, device=dev),
                         pend_ids=torch.zeros((n, 0), dtype=torch.long, device=dev),
                         pend_valid=torch.zeros((n, 0), dtype=torch.bool, device=dev))
        cache.family_state = st
        return st

    @staticmethod
    def _positions(st: _BlockState, seq_valid: torch.Tensor) -> torch.Tensor:
        """Position ids ``(N, T)`` of the tokens after the committed ones (the valid ones counted)."""
        return (st.count[:, None] + seq_valid.long().cumsum(1) - 1).clamp_min(0)

    def _forward(self, st: _BlockState, cache, seq, seq_valid, cols: torch.Tensor, pos: torch.Tensor):
        """Forward ``seq`` ``(N, T)`` at position ids ``pos`` after the cache under block-causal attention; appends
        ``T`` columns. Returns the logits of columns ``cols`` ``(N, len(cols), V)``."""
        k_pos = torch.cat([st.pos, pos], 1)
        k_ok = torch.cat([st.valid, seq_valid], 1)
        allowed = position_allowed(pos, k_pos, k_ok, "block_causal", self.block_size)
        t = seq.shape[1]
        diag = torch.arange(t, device=seq.device)
        allowed[:, diag, k_pos.shape[1] - t + diag] = True          # a padding query sees itself (no empty row)
        return self.call_backbone(seq, pos, to_additive(allowed, self.mask_dtype), cache, logits_to_keep=cols)

    def extend(self, ids, cache, key_valid, logits_to_keep: int = 0):
        """Commit ``ids`` ``(N, Q)`` (valid where ``key_valid[:, -Q:]``): with the held-back tokens before them,
        every whole block enters the KV cache and the rest is held back. Returns the logits of the new tokens
        ``(N, Q, V)`` (or of the last ``logits_to_keep``), computed under block-causal attention."""
        n, q = ids.shape
        st = self._state(cache, n)
        s = self.block_size
        seq = torch.cat([st.pend_ids, ids], 1)
        seq_valid = torch.cat([st.pend_valid, key_valid[:, -q:]], 1)
        t = seq.shape[1]
        total = st.count + seq_valid.sum(1)
        boundary = total // s * s
        keep = q if not 0 < logits_to_keep < q else logits_to_keep
        want = list(range(t - keep, t))
        pos = self._positions(st, seq_valid)
        commit = seq_valid & (pos < boundary[:, None])
        last_col = torch.where(commit.any(1), t - 1 - commit.flip(1).long().argmax(1), torch.zeros_like(total))
        cols = sorted(set(want) | set(last_col.tolist()))
        col_t = torch.tensor(cols, dtype=torch.long, device=ids.device)
        logits = self._forward(st, cache, seq, seq_valid, col_t, pos)
        index = {c: i for i, c in enumerate(cols)}
        has = commit.any(1)
        if has.any():
            lastl = logits[torch.arange(n, device=ids.device), torch.tensor([index[c] for c in last_col.tolist()],
                                                                             device=ids.device)]
            st.last = lastl.detach() if st.last is None else torch.where(has[:, None], lastl.detach(), st.last)
        st.valid = torch.cat([st.valid, commit], 1)
        st.pos = torch.cat([st.pos, pos], 1)
        st.count = boundary
        held = seq_valid & ~commit
        st.pend_ids, st.pend_valid = _right_align([seq[i][held[i]] for i in range(n)], ids.device)
        return logits[:, [index[c] for c in want]]

    def diffusion_logits(self, block, cache, key_valid, future_masks: int = 0):
        """Denoising forward of ``block`` ``(N, B)`` after the held-back tokens and the cache, block-causal at
        absolute positions (``future_masks`` are never visible and are ignored). Returns ``(N, B, V)`` aligned so
        ``[:, j]`` predicts block token ``j`` (shifted families realigned); the cache is left as it was."""
        n, b = block.shape
        st = self._state(cache, n)
        seq = torch.cat([st.pend_ids, block], 1)
        seq_valid = torch.cat([st.pend_valid, key_valid[:, -b:]], 1)
        t = st.pend_ids.shape[1]
        first = t - 1 if self.family.shift else t
        cols = torch.arange(max(first, 0), t + b - (1 if self.family.shift else 0), device=block.device)
        logits = self._forward(st, cache, seq, seq_valid, cols, self._positions(st, seq_valid))
        cache.crop(-(t + b))
        if not self.family.shift:
            return logits
        if t == 0:
            return torch.cat([self._last(st)[:, None].to(logits.dtype), logits], 1)
        held = st.pend_valid[:, -1:, None]                        # the token before the block is held back
        head = torch.where(held, logits[:, :1], (st.last if st.last is not None else logits[:, 0])[:, None]
                           .to(logits.dtype))
        return torch.cat([head, logits[:, 1:]], 1)

    def masked_block_forward(self, ids, pos_offsets, allowed_within, cache, key_valid, held_visible=None):
        """One forward of ``ids`` ``(N, Q)`` after the cached whole blocks and the held-back tokens, with the
        caller's visibility among the new tokens (a speculative-verification layout such as SimSD's paired
        data/mask sections); the cache is left as it was.

        The held-back tokens of the current partial block are prepended and recomputed, as in every forward of
        the family. Keys and queries:

        * cached whole blocks and held-back tokens, as keys: block-causal at absolute positions (a query sees
          them iff their block is not after its own);
        * held-back tokens, as queries: the cache and each other block-causally; the new tokens where
          ``held_visible`` says (default: block-causal, i.e. the whole current block, as :meth:`diffusion_logits`);
        * new tokens, as queries, over the new tokens: exactly ``allowed_within`` (the caller's layout replaces
          the family's bidirectional block there; it is not intersected with block positions, so a position-only
          ablation keeps the attention structure).

        Every query sees itself (a padding row is never empty).

        Args:
            ids: ``(N, Q)`` new token ids.
            pos_offsets: ``(Q,)`` or ``(N, Q)`` position ids relative to the first position after the committed and
                held-back tokens (``0`` is that position; a RoPE copy repeats offsets).
            allowed_within: ``(Q, Q)`` or ``(N, Q, Q)`` bool, query × key among the new tokens.
            cache: the family's KV cache (with its ``family_state``).
            key_valid: ``(N, ·)`` bool; its last ``Q`` columns mark real new tokens (False: padding).
            held_visible: ``(Q,)`` or ``(N, Q)`` bool, the new tokens the held-back tokens see (None: block-causal).

        Returns ``(N, Q, V)``: the backbone's logits at the new tokens as computed (position ``j``'s own logit; a
        shifted family's are not realigned here)."""
        n, q = ids.shape
        st = self._state(cache, n)
        dev = ids.device
        t, c = st.pend_ids.shape[1], st.pos.shape[1]
        new_valid = key_valid[:, -q:].to(dev).bool()
        held_pos = self._positions(st, st.pend_valid)
        start = st.count + st.pend_valid.long().sum(1)
        new_pos = start[:, None] + torch.as_tensor(pos_offsets, device=dev).long().expand(n, q)
        seq, pos = torch.cat([st.pend_ids, ids], 1), torch.cat([held_pos, new_pos], 1)
        k_pos = torch.cat([st.pos, pos], 1)
        k_ok = torch.cat([st.valid, st.pend_valid, new_valid], 1)
        allowed = position_allowed(pos, k_pos, k_ok, "block_causal", self.block_size)
        within = torch.as_tensor(allowed_within, device=dev).bool().expand(n, q, q)
        allowed[:, t:, c + t:] = within & new_valid[:, None, :]
        if held_visible is not None:
            seen = torch.as_tensor(held_visible, device=dev).bool().expand(n, q)
            allowed[:, :t, c + t:] = (seen & new_valid)[:, None, :].expand(n, t, q)
        diag = torch.arange(t + q, device=dev)
        allowed[:, diag, c + diag] = True                           # every query sees itself (no empty row)
        cols = torch.arange(t, t + q, device=dev)
        logits = self.call_backbone(seq, pos, to_additive(allowed, self.mask_dtype), cache, logits_to_keep=cols)
        cache.crop(-(t + q))
        return logits

    @staticmethod
    def _last(st: _BlockState) -> torch.Tensor:
        if st.last is None:
            raise FamilyError("a shifted family predicts block position 0 from the last committed token's logit; "
                              "commit the prompt (extend) before the first denoising forward")
        return st.last


class IdCache:
    """The "cache" of a family without an exact KV cache: the committed token ids ``(N, L)`` and their validity
    ``(N, L)``; every denoising forward recomputes the whole sequence from them."""

    def __init__(self, device):
        self.ids = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.valid = torch.zeros((0, 0), dtype=torch.bool, device=device)
        #: The approximate prefix cache (:meth:`RecomputeFamilyLM.approximate_prefix_cache`): the prefix's keys and
        #: values from the block's first forward, the prefix length they hold, and the last prefix position's logit.
        self.kv = None
        self.kv_len = -1
        self.kv_last = None

    def get_seq_length(self) -> int:
        """Committed tokens (columns), as ``DynamicCache.get_seq_length``."""
        return int(self.ids.shape[1])

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` columns (negative: drop ``-max_length``), as ``DynamicCache.crop``."""
        keep = max_length if max_length >= 0 else self.ids.shape[1] + max_length
        self.ids, self.valid = self.ids[:, :keep], self.valid[:, :keep]


class RecomputeFamilyLM(FamilyLM):
    """LLaDA and Dream: every position sees the whole sequence, the future masks of the generation included, and
    the reference recomputes it at every step (no KV cache). The "cache" keeps the committed ids
    (:class:`IdCache`); each denoising forward runs ``[committed | block | future masks]`` bidirectionally. Dream's
    logits are shifted (``logits = cat([l[:, :1], l[:, :-1]])`` in its ``generate``)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.commit_forward = False
        #: Fast-dLLM v1's prefix cache instead of the exact recompute (see :meth:`approximate_prefix_cache`).
        self.prefix_cache = False

    @contextlib.contextmanager
    def approximate_prefix_cache(self):
        """Within the block, reuse the prefix's keys and values (Fast-dLLM v1's prefix cache, an approximation):
        the first denoising forward after a commit runs the whole sequence and keeps the prefix's keys and values
        (computed while the prefix saw that step's block and future masks); the block's later forwards run only
        ``[block | future masks]`` over them. The exact path (the default) recomputes everything every forward."""
        old, self.prefix_cache = self.prefix_cache, True
        try:
            yield self
        finally:
            self.prefix_cache = old

    def new_cache(self) -> IdCache:
        """An empty :class:`IdCache`."""
        return IdCache(self.device)

    def extend(self, ids, cache: IdCache, key_valid, logits_to_keep: int = 0):
        """Append ``ids`` ``(N, Q)`` (valid where ``key_valid[:, -Q:]``) to the committed ids. Runs no forward and
        returns ``None``: the family has no next-token distribution of a commit."""
        q = ids.shape[1]
        if cache.ids.shape[0] == 0:
            cache.ids = ids[:, :0]
            cache.valid = key_valid[:, :0]
        cache.ids = torch.cat([cache.ids, ids], 1)
        cache.valid = torch.cat([cache.valid, key_valid[:, -q:]], 1)
        return None

    def diffusion_logits(self, block, cache: IdCache, key_valid, future_masks: int = 0):
        """Full bidirectional forward of ``[committed | block | future_masks × mask]`` (the reference's canvas).

        Args:
            block: ``(N, B)`` block ids (mask token where undecided).
            cache: the committed ids (:class:`IdCache`).
            key_valid: ``(N, L + B)``; only its last ``B`` columns are read.
            future_masks: mask tokens of the generation after this block (visible to every position).

        Returns ``(N, B, V)``, ``[:, j]`` predicting block token ``j`` (Dream's shift realigned)."""
        n, b = block.shape
        p = cache.ids.shape[1]
        fut = torch.full((n, int(future_masks)), self.mask_token_id, dtype=torch.long, device=block.device)
        seq = torch.cat([cache.ids, block, fut], 1)
        valid = torch.cat([cache.valid, key_valid[:, -b:], torch.ones_like(fut, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)
        allowed = position_allowed(pos, pos, valid, "full")
        diag = torch.arange(seq.shape[1], device=seq.device)
        allowed[:, diag, diag] = True
        start = p - 1 if self.family.shift else p
        if start < 0:
            raise FamilyError("a shifted family predicts block position 0 from the token before it; give a prompt")
        cols = torch.arange(start, start + b, device=block.device)
        mask = to_additive(allowed, self.mask_dtype)
        if not self.prefix_cache:
            return self.call_backbone(seq, pos, mask, None, logits_to_keep=cols)
        if cache.kv is None or cache.kv_len != p:                 # the block's first forward: keep the prefix KV
            kv = TriModeLM.new_cache(self)
            logits = self.call_backbone(seq, pos, mask, kv, logits_to_keep=cols)
            kv.crop(-(seq.shape[1] - p))                          # transformers 5: crop(-K) drops the last K
            cache.kv, cache.kv_len, cache.kv_last = kv, p, logits[:, :1] if self.family.shift else None
            return logits
        logits = self.call_backbone(seq[:, p:], pos[:, p:], mask[:, :, p:], cache.kv,
                                    logits_to_keep=torch.arange(b - (1 if self.family.shift else 0),
                                                                device=block.device))
        cache.kv.crop(-(seq.shape[1] - p))
        return torch.cat([cache.kv_last, logits], 1) if self.family.shift else logits


__all__ = ["FamilyLM", "WindowFamilyLM", "CausalFamilyLM", "BlockCausalFamilyLM", "RecomputeFamilyLM", "IdCache"]
