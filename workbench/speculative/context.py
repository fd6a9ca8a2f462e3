"""The verified context of a batched self-speculative decode: a growing KV cache with punched-out keys.

State per row: the verified prefix ``x_1..x_n`` lives in the KV cache (computed by the AR verifier);
the last verified token ``x_{n+1}`` is *not* cached yet (it is the verifier's own token of the previous
cycle, whose keys no forward has produced). Every cycle therefore starts its forwards with ``x_{n+1}``.

Rows accept different numbers of draft tokens, so one shared cache keeps every verified forward's
keys and marks rejected draft tokens invalid in ``valid`` (``False`` keys are never attended and do not
count towards position ids, see :meth:`~workbench.model.trimode.TriModeLM.extend`). Columns invalid in
every row at the tail of the cache are cropped off.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .adapter import verifier_mode


@dataclass
class Checkpoint:
    """Snapshot of a :class:`SpecContext` (cache length, validity, last token) for real-context resets."""

    length: int
    valid: torch.Tensor
    last: torch.Tensor


class SpecContext:
    """KV cache ``cache`` (length ``C``), key validity ``valid`` ``(N, C)`` bool and last verified token
    ``last`` ``(N,)`` long of a batch of rows."""

    def __init__(self, cache: DynamicCache, valid: torch.Tensor, last: torch.Tensor):
        self.cache, self.valid, self.last = cache, valid, last

    @classmethod
    def prefill(cls, model, ids: torch.Tensor, valid: torch.Tensor) -> "SpecContext":
        """Cache ``ids[:, :-1]`` (left-padded prompts ``(N, P)``, validity ``(N, P)``) with the verifier
        (adapter disabled); the last prompt token becomes ``last``. Not counted as a forward."""
        cache = model.new_cache()
        if ids.shape[1] > 1:
            with verifier_mode(model):
                model.extend(ids[:, :-1], cache, valid[:, :-1], logits_to_keep=1)
        return cls(cache, valid[:, :-1], ids[:, -1].clone())

    @property
    def length(self) -> int:
        """Cache length ``C`` (valid and punched-out keys)."""
        return self.valid.shape[1]

    def positions(self) -> torch.Tensor:
        """``(N,)`` position id of ``last``: the number of valid cached keys of each row."""
        return self.valid.long().sum(dim=1)

    def with_new(self, q: int) -> torch.Tensor:
        """Key validity ``(N, C + q)`` for a forward appending ``q`` valid tokens."""
        ones = torch.ones((self.valid.shape[0], q), dtype=torch.bool, device=self.valid.device)
        return torch.cat([self.valid, ones], dim=1)

    def commit(self, keep: torch.Tensor, next_token: torch.Tensor, active: torch.Tensor) -> None:
        """After a verify forward appended ``Q`` keys: keep those marked in ``keep`` ``(N, Q)`` (the old
        last token and the accepted drafts), punch out the rest, make ``next_token`` ``(N,)`` the new
        last token of ``active`` ``(N,)`` rows (inactive rows keep nothing), then crop dead tail columns."""
        self.valid = torch.cat([self.valid, keep & active[:, None]], dim=1)
        self.last = torch.where(active, next_token, self.last)
        alive = self.valid.any(dim=0).nonzero()
        keep_len = int(alive[-1]) + 1 if len(alive) else 0
        if keep_len < self.length:
            self.cache.crop(keep_len - self.length)   # transformers 5: crop(-K) removes the last K keys
            self.valid = self.valid[:, :keep_len]

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.length, self.valid.clone(), self.last.clone())

    def reset_to_real(self, model, saved: Checkpoint, real: torch.Tensor) -> None:
        """Real-context reset: drop everything appended since ``saved`` and continue from the real text.

        Caches ``[saved.last, real[:, :-1]]`` with the verifier and makes ``real[:, -1]`` the last token.
        ``real``: ``(N, s)`` real continuation of the segment just decoded. One model forward.
        """
        if self.length > saved.length:
            self.cache.crop(saved.length - self.length)
        self.valid, self.last = saved.valid, saved.last
        seq = torch.cat([saved.last[:, None], real[:, :-1]], dim=1)
        kv = self.with_new(seq.shape[1])
        with verifier_mode(model):
            model.extend(seq, self.cache, kv, logits_to_keep=1)
        self.valid, self.last = kv, real[:, -1].clone()
