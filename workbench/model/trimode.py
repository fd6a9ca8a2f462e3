"""TriModeLM: one causal LM, three decoding modes (NLD §2–3).

Wraps any ``transformers`` causal LM plus a mask-token id. The same weights give

* **AR mode**: causal next-token logits (logits at ``i`` predict token ``i + 1``);
* **diffusion mode**: logits at a masked position predict the token *at* that position; the block sees
  itself bidirectionally and the clean prefix causally (through the KV cache);
* the **training forward** over the dual stream ``[x_t | x_0]`` (NLD Fig. 3).

Cache conventions (transformers 5 ``DynamicCache``): any forward given ``past_key_values`` appends its
tokens; :meth:`TriModeLM.diffusion_logits` crops them off again with ``cache.crop(-block_length)``, so
only :meth:`TriModeLM.extend` (the per-block KV-commit forward) grows the cache.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from .masks import cached_allowed, dual_stream_mask, to_additive


class TriModeLM(nn.Module):
    """Tri-mode wrapper around a causal LM.

    Args:
        backbone: any ``AutoModelForCausalLM`` instance whose forward accepts ``position_ids`` and an
            additive 4D ``attention_mask``.
        mask_token_id: id of the mask token (must be < the backbone's vocabulary size).

    Raises ``ValueError`` if the mask token is outside the model's vocabulary.
    """

    def __init__(self, backbone: PreTrainedModel, mask_token_id: int):
        super().__init__()
        vocab = backbone.get_input_embeddings().num_embeddings
        if not 0 <= mask_token_id < vocab:
            raise ValueError(f"mask token id {mask_token_id} is outside the model vocabulary ({vocab}); "
                             "resize the embeddings after adding the mask token")
        self.backbone = backbone
        self.mask_token_id = int(mask_token_id)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    @property
    def mask_dtype(self) -> torch.dtype:
        return next(self.backbone.parameters()).dtype

    # ------------------------------------------------------------------ training
    def dual_stream_logits(self, clean: torch.Tensor, noisy: torch.Tensor, block_length: int
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training forward over ``[x_t | x_0]`` with shared position ids (NLD §2.2, Fig. 3).

        Args:
            clean: ``(N, L)`` clean ids ``x_0``.
            noisy: ``(N, L)`` noisy ids ``x_t`` (mask token at corrupted positions).
            block_length: diffusion block length; must divide ``L``.

        Returns:
            ``(ar_logits, diff_logits)``, each ``(N, L, V)``: AR logits of the clean stream and
            diffusion logits of the noisy stream.
        """
        n, seq_len = clean.shape
        ids = torch.cat([noisy, clean], dim=1)
        pos = torch.arange(seq_len, device=clean.device).repeat(2).unsqueeze(0).expand(n, -1)
        mask = dual_stream_mask(seq_len, block_length, self.mask_dtype, clean.device)
        logits = self.backbone(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).logits
        return logits[:, seq_len:], logits[:, :seq_len]

    def causal_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward ``(N, L) -> (N, L, V)`` (AR mode without cache; stage-1 training)."""
        return self.backbone(input_ids=ids, use_cache=False).logits

    # ------------------------------------------------------------------ inference with a KV cache
    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.backbone.config)

    def _cached_forward(self, ids: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
                        causal: bool) -> torch.Tensor:
        """Forward ``ids`` ``(N, Q)`` after ``cache``; ``key_valid`` ``(N, cache_len + Q)`` marks real tokens.
        Position ids count only valid tokens, so left-padded rows get the same positions as unpadded ones."""
        q = ids.shape[1]
        pos = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, -q:]
        mask = to_additive(cached_allowed(key_valid, q, causal), self.mask_dtype)
        return self.backbone(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                             use_cache=True).logits

    def extend(self, ids: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor) -> torch.Tensor:
        """Causal forward that appends ``ids`` ``(N, Q)`` to ``cache`` (prefill, AR step, or the per-block
        KV-commit forward). ``key_valid``: ``(N, cache_len + Q)``. Returns AR logits ``(N, Q, V)``."""
        return self._cached_forward(ids, cache, key_valid, causal=True)

    def diffusion_logits(self, block: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor) -> torch.Tensor:
        """Diffusion logits of a block over the cached clean prefix, without growing the cache.

        Args:
            block: ``(N, B)`` current block ids (mask token at undecided positions).
            cache: KV cache of the clean prefix (length ``P``); left unchanged on return.
            key_valid: ``(N, P + B)`` bool, False at left padding.

        Returns ``(N, B, V)``: logits at position ``j`` predict the token at block position ``j``.
        """
        b = block.shape[1]
        logits = self._cached_forward(block, cache, key_valid, causal=False)
        cache.crop(-b)
        return logits
