"""KV cache of the clean prefixes of many prompts, for SOL's lockstep forwards.

Layout per layer: keys / values ``(n_prompts, heads, P0 + n_blocks·B, head_dim)`` and a validity mask
``(n_prompts, P0 + n_blocks·B)``. Prompts are left-padded into the first ``P0`` columns; block ``b``'s
committed tokens go to columns ``[P0 + b·B, P0 + (b + 1)·B)`` when the block is done. Invalid columns
(padding, blocks not committed yet) are masked out, and position ids count only valid columns, so every
prompt sees exactly its own prefix whatever the others are doing.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..decoding.base import autocast_for, left_pad
from ..model.kv_cache import GrowableLayer
from ..model.window import PositionCache


def top_and_confidence(logits: torch.Tensor, mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(top, conf)`` ``(R, B)`` on the CPU: the argmax of ``logits`` ``(R, B, V)`` (float32) and its probability,
    the mask token never predicted (its column set to ``-inf`` in place)."""
    logits[..., mask_token_id] = float("-inf")
    conf, top = torch.softmax(logits, dim=-1).max(dim=-1)
    return top.cpu(), conf.cpu()


def make_bank(model, prompts: list[list[int]], extra_cols: int, pad_id: int, precision: str = "fp32",
              batch: int = 32, room: int = 32):
    """The prefix bank for ``model``: a :class:`PrefixBank` of KV columns where the model's commits are causal KV
    appends (``model.causal_prefix``: the tri-mode models, NLD, I-DLM), else an :class:`IdBank` that recomputes
    each prefix through the model's own commit (block-causal families hold partial blocks back; LLaDA and Dream
    have no KV cache)."""
    if getattr(model, "causal_prefix", True):
        return PrefixBank(model, prompts, extra_cols, pad_id, precision, batch=batch, room=room)
    return IdBank(model, prompts, extra_cols, pad_id, precision)


class IdBank:
    """The prefixes of ``prompts`` as token ids ``(n_prompts, P0 + extra_cols)`` with their validity; every
    :meth:`evaluate` commits the rows' prefixes into a fresh cache of the model (its own semantics) before the
    diffusion forward. Same interface and results as :class:`PrefixBank` for any model; one prefix forward more
    per evaluation."""

    def __init__(self, model, prompts: list[list[int]], extra_cols: int, pad_id: int, precision: str = "fp32"):
        self.model, self.precision = model, precision
        ids, valid = left_pad(prompts, pad_id, model.device)
        n, self.p0 = ids.shape
        self.ids = torch.full((n, self.p0 + extra_cols), pad_id, dtype=torch.long, device=model.device)
        self.ids[:, :self.p0] = ids
        self.valid = torch.zeros((n, self.p0 + extra_cols), dtype=torch.bool, device=model.device)
        self.valid[:, :self.p0] = valid

    @torch.no_grad()
    def commit(self, rows: list[int], blocks: torch.Tensor, col: int) -> None:
        """Write ``blocks`` ``(R, B)`` into the prefixes of ``rows`` at column ``col``."""
        r = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        b = blocks.shape[1]
        self.ids[r, col:col + b] = blocks.to(self.ids.device)
        self.valid[r, col:col + b] = True

    @torch.no_grad()
    def evaluate(self, rows: torch.Tensor, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Diffusion forward of ``states`` ``(R, B)`` over the prefixes of ``rows`` ``(R,)``: ``(top, conf)``."""
        with autocast_for(self.model.device, self.precision):
            cache = self.model.new_cache()
            valid = self.valid[rows]
            self.model.extend(self.ids[rows], cache, valid, logits_to_keep=1)
            kv = torch.cat([valid, torch.ones(states.shape, dtype=torch.bool, device=valid.device)], 1)
            logits = self.model.diffusion_logits(states.to(valid.device), cache, kv).float()
        return top_and_confidence(logits, self.model.mask_token_id)


class PrefixBank:
    """Prefix KV of ``prompts`` (prefilled in chunks of ``batch`` prompts).

    ``room`` (tokens, ≥ the block length) free key/value columns follow the ``P0 + extra_cols`` columns of
    every row, so a gathered cache takes a forward's tokens in place without a concatenation copy."""

    def __init__(self, model, prompts: list[list[int]], extra_cols: int, pad_id: int, precision: str = "fp32",
                 batch: int = 32, room: int = 32):
        self.model, self.precision = model, precision
        ids, valid = left_pad(prompts, pad_id, model.device)
        n, self.p0 = ids.shape
        total = self.p0 + extra_cols
        self.valid = torch.zeros((n, total), dtype=torch.bool, device=model.device)
        self.valid[:, :self.p0] = valid
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        with torch.no_grad(), autocast_for(model.device, precision):
            for s in range(0, n, batch):
                cache = model.new_cache()
                model.extend(ids[s:s + batch], cache, valid[s:s + batch], logits_to_keep=1)
                for i, layer in enumerate(cache.layers):
                    if s == 0:
                        shape = (n, *layer.keys.shape[1:2], total + room, layer.keys.shape[-1])
                        self.k.append(torch.zeros(shape, dtype=layer.keys.dtype, device=model.device))
                        self.v.append(torch.zeros(shape, dtype=layer.values.dtype, device=model.device))
                    self.k[i][s:s + batch, :, :self.p0] = layer.keys
                    self.v[i][s:s + batch, :, :self.p0] = layer.values

    def cache_for(self, rows: torch.Tensor) -> tuple[DynamicCache, torch.Tensor]:
        """A fresh cache holding the prefixes of ``rows`` ``(R,)`` (rows may repeat) and their validity
        ``(R, cols)``; the next forward's tokens (up to ``room``) are written in place after them."""
        cache = self.model.new_cache()
        cols = self.valid.shape[1]
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            layer = GrowableLayer.over(k.index_select(0, rows), v.index_select(0, rows), cols)
            if i < len(cache.layers):
                cache.layers[i] = layer
            else:                       # a lazily initialised cache (sliding-window models' PositionCache)
                cache.layers.append(layer)
        valid = self.valid[rows]
        if isinstance(cache, PositionCache):  # position ids of the bank's columns (invalid ones are masked)
            cache.positions = (valid.long().cumsum(1) - 1).clamp_min(0)
        return cache, valid

    @torch.no_grad()
    def commit(self, rows: list[int], blocks: torch.Tensor, col: int) -> None:
        """KV-commit forward: append ``blocks`` ``(R, B)`` (causal) to the prefixes of ``rows`` at column ``col``."""
        r = torch.tensor(rows, dtype=torch.long, device=self.valid.device)
        b = blocks.shape[1]
        with autocast_for(self.model.device, self.precision):
            cache, valid = self.cache_for(r)
            kv = torch.cat([valid, torch.ones((len(rows), b), dtype=torch.bool, device=valid.device)], 1)
            self.model.extend(blocks.to(valid.device), cache, kv, logits_to_keep=1)
        for i, layer in enumerate(cache.layers):
            self.k[i][r, :, col:col + b] = layer.keys[:, :, -b:].to(self.k[i].dtype)
            self.v[i][r, :, col:col + b] = layer.values[:, :, -b:].to(self.v[i].dtype)
        self.valid[r, col:col + b] = True

    @torch.no_grad()
    def evaluate(self, rows: torch.Tensor, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Diffusion forward of ``states`` ``(R, B)`` over the prefixes of ``rows`` ``(R,)``.
        Returns ``(top, conf)``, each ``(R, B)``: argmax token and its probability."""
        with autocast_for(self.model.device, self.precision):
            cache, valid = self.cache_for(rows)
            kv = torch.cat([valid, torch.ones(states.shape, dtype=torch.bool, device=valid.device)], 1)
            logits = self.model.diffusion_logits(states.to(valid.device), cache, kv).float()
        return top_and_confidence(logits, self.model.mask_token_id)
