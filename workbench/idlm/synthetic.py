"""A synthetic strided model with known acceptance, to check ISD and I-DLM Eq. 3 without training.

Its AR distribution is a fixed sequence: at every clean position ``i`` the argmax is ``f(i + 1)`` (the token at
``i + 1``). A mask at position ``i`` proposes ``f(i + 1)`` too, correctly with probability ``p`` (an independent
draw per forward and slot) and a wrong token otherwise. Both are logit-shifted like an I-DLM model, so ISD's
acceptance per proposal is exactly ``p`` and Eq. 3 predicts its TPF. It implements the parts of
:class:`~workbench.model.trimode.TriModeLM` the speculative decoders use (cache, ``extend``, ``_cached_forward``).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..model.gated_lora import is_gated  # noqa: F401  (documents the interface: no gated LoRA here)


class _Cache:
    def __init__(self):
        self.length = 0

    def crop(self, n: int) -> None:
        self.length = self.length + n if n < 0 else n

    def get_seq_length(self) -> int:
        return self.length


class SyntheticStrided:
    """See the module docstring. ``vocab`` ids; the mask token is the last one; ``p`` ∈ [0, 1]; ``seed`` seeds
    the proposal draws."""

    def __init__(self, p: float, vocab: int = 64, seed: int = 0, margin: float = 8.0):
        self.p, self.vocab, self.margin = p, vocab, margin
        self.mask_token_id = vocab - 1
        self.has_mask_token, self.gated = True, False
        self.device, self.mask_dtype = torch.device("cpu"), torch.float32
        self.backbone = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=1 << 20, vocab_size=vocab))
        self.rng = torch.Generator().manual_seed(seed)

    def token_at(self, pos: torch.Tensor) -> torch.Tensor:
        """The fixed sequence: ``f(pos)`` in ``1..vocab − 2``."""
        return (pos * 7 + 3) % (self.vocab - 2) + 1

    def new_cache(self) -> _Cache:
        return _Cache()

    def _cached_forward(self, ids: torch.Tensor, cache: _Cache, key_valid: torch.Tensor, causal: bool = True):
        q = ids.shape[1]
        pos = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, -q:]
        cache.length += q
        target = self.token_at(pos + 1)                                    # (N, Q): logit shift
        is_mask = ids == self.mask_token_id
        wrong = torch.rand(ids.shape, generator=self.rng) >= self.p
        target = torch.where(is_mask & wrong, (target % (self.vocab - 2)) + 1, target)
        logits = torch.zeros(*ids.shape, self.vocab)
        logits.scatter_(2, target[..., None], self.margin)
        logits[..., self.mask_token_id] = float("-inf")                    # it never predicts the mask token
        return logits

    def hide_mask_column(self, logits: torch.Tensor) -> torch.Tensor:
        """AR logits as they are: this model never predicts the mask token."""
        return logits

    def extend(self, ids, cache, key_valid, logits_to_keep: int = 0):
        logits = self._cached_forward(ids, cache, key_valid)         # every position: the same random stream
        return logits[:, -logits_to_keep:] if logits_to_keep else logits


__all__ = ["SyntheticStrided"]
