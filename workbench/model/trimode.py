"""TriModeLM: one causal LM, three decoding modes (NLD §2–3).

Wraps any ``transformers`` causal LM plus a mask-token id. The same weights give

* **AR mode**: causal next-token logits (logits at ``i`` predict token ``i + 1``);
* **diffusion mode**: logits at a masked position predict the token *at* that position; the block sees
  itself bidirectionally and the clean prefix causally (through the KV cache);
* the **training forward** over the dual stream ``[x_t | x_0]`` (NLD Fig. 3).

Cache conventions (transformers 5 ``DynamicCache``): any forward given a cache appends its tokens (the keyword is
``cache`` from transformers 5.24, ``past_key_values`` before; :func:`cache_keyword` picks the model's own, so no
deprecation warning is printed); :meth:`TriModeLM.diffusion_logits` crops them off again with ``cache.crop(-block_length)``, so
only :meth:`TriModeLM.extend` (the per-block KV-commit forward) grows the cache.

With a gated LoRA (:mod:`workbench.model.gated_lora`, a pretrained AR model converted to tri-mode) clean
positions run the frozen base and noisy / mask positions add the LoRA residual: :meth:`extend` is the base
model exactly (its AR logits never pick the added mask token), :meth:`diffusion_logits` runs with the adapter,
and the training forward gates per token.

A model without a mask token (a plain AR checkpoint) serves the AR paths; the diffusion paths raise
:class:`~workbench.tokenizer.TokenizerError` naming ``--add_mask_token``.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from ..tokenizer import TokenizerError
from .gated_lora import is_gated, lora_positions
from .kv_cache import use_growable_layers
from .attention import dual_stream_block_mask, to_path
from .masks import cached_allowed, chunk_block_allowed, dual_stream_allowed, dual_stream_mask, to_additive
from .window import PositionCache, attention_layout, layer_masks


@functools.lru_cache(maxsize=None)
def _cache_keyword_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_keyword(backbone: nn.Module) -> str:
    """The keyword the backbone's forward takes its KV cache by: ``cache`` (transformers ≥ 5.24, where
    ``past_key_values`` is deprecated) or ``past_key_values`` (earlier releases, and other models)."""
    base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone
    return _cache_keyword_of(type(base))


class BackboneModule(nn.Module):
    """A module around a transformers model held as ``self.backbone``: the device and dtype its masks and inputs
    follow (the base of :class:`TriModeLM` and of the released families' own adapters)."""

    @property
    def device(self) -> torch.device:
        """The device of the backbone's parameters."""
        return next(self.backbone.parameters()).device

    @property
    def mask_dtype(self) -> torch.dtype:
        """The dtype of the backbone's parameters, used for additive attention masks."""
        return next(self.backbone.parameters()).dtype


class TriModeLM(BackboneModule):
    """Tri-mode wrapper around a causal LM.

    Args:
        backbone: any ``AutoModelForCausalLM`` instance whose forward accepts ``position_ids`` and an
            additive 4D ``attention_mask`` (or a peft model wrapping one).
        mask_token_id: id of the mask token (must be < the backbone's vocabulary size), or ``None`` for a
            plain AR checkpoint (AR decoding only).

    Sliding-window models (Mistral, Gemma 2/3, …) get the window applied to every mask and a
    :class:`~workbench.model.window.PositionCache` (:mod:`workbench.model.window`).

    Raises ``ValueError`` if the mask token is outside the model's vocabulary, and
    :class:`~workbench.model.window.UnsupportedArchitectureError` (one line) for attention it cannot serve.
    """

    def __init__(self, backbone: PreTrainedModel, mask_token_id: int | None):
        super().__init__()
        vocab = backbone.get_input_embeddings().num_embeddings
        if mask_token_id is not None and not 0 <= mask_token_id < vocab:
            raise ValueError(f"mask token id {mask_token_id} is outside the model vocabulary ({vocab}); "
                             "resize the embeddings after adding the mask token")
        self.backbone = backbone
        #: Sliding-window layout of the backbone's layers (window None: full attention everywhere).
        self.layout = attention_layout(backbone)
        #: How masks reach the attention (:mod:`workbench.model.attention`): 'dense' (additive float, the
        #: reference), 'sdpa_bool' or 'flex'; switch with :func:`~workbench.model.attention.set_attention_path`.
        self.attention_path = "dense"
        self._mask_token_id = None if mask_token_id is None else int(mask_token_id)
        #: A commit (:meth:`extend`) runs a forward (False for a family whose "cache" only keeps token ids and whose
        #: every denoising forward recomputes the sequence: LLaDA, Dream); decoders count it in ``extra_forwards``.
        self.commit_forward = True
        #: A commit appends causal KV columns that any later forward may read as they are (see the families).
        self.causal_prefix = True
        #: Hide the mask token's column from AR logits (set for a mask token added to a pretrained AR model,
        #: whose AR distribution must stay the base's; gated models always hide it).
        self.hide_mask_logit = False

    @property
    def mask_token_id(self) -> int:
        """Id of the mask token. Raises :class:`~workbench.tokenizer.TokenizerError` for a model without one."""
        if self._mask_token_id is None:
            raise TokenizerError("this model has no mask token, which diffusion-mode decoding and training need; "
                                 "rerun with --add_mask_token true (AR policies need none)")
        return self._mask_token_id

    def set_added_mask_token(self, mask_token_id: int) -> None:
        """Record a mask token just added to a pretrained AR model (its embedding row already exists) and hide
        it from AR logits, so AR decoding stays the base model's. Raises ``ValueError`` outside the vocabulary."""
        vocab = self.backbone.get_input_embeddings().num_embeddings
        if not 0 <= mask_token_id < vocab:
            raise ValueError(f"mask token id {mask_token_id} is outside the model vocabulary ({vocab})")
        self._mask_token_id, self.hide_mask_logit = int(mask_token_id), True

    @property
    def vocab_size(self) -> int:
        """Width of the logits (rows of the output embedding; works through peft wrappers)."""
        out = self.backbone.get_output_embeddings()
        if out is not None and getattr(out, "weight", None) is not None:
            return int(out.weight.shape[0])
        return int(self.backbone.config.vocab_size)

    @property
    def modes(self) -> frozenset:
        """Decoding modes: ``'ar'`` always, ``'diffusion'`` with a mask token (a released diffusion LM's adapter
        gives its family's, :attr:`~workbench.model.families.adapters.FamilyLM.modes`)."""
        return frozenset({"ar", "diffusion"}) if self._mask_token_id is not None else frozenset({"ar"})

    @property
    def has_mask_token(self) -> bool:
        """True when the vocabulary has a mask token (diffusion mode needs one; AR mode does not)."""
        return self._mask_token_id is not None

    @property
    def gated(self) -> bool:
        """True when the backbone carries a gated LoRA (clean positions = the frozen base)."""
        return is_gated(self)

    # ------------------------------------------------------------------ training
    def dual_stream_logits(self, clean: torch.Tensor, noisy: torch.Tensor, block_length: int,
                           causal_in_block: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Training forward over ``[x_t | x_0]`` with shared position ids (NLD §2.2, Fig. 3).

        Args:
            clean: ``(N, L)`` clean ids ``x_0``.
            noisy: ``(N, L)`` noisy ids ``x_t`` (mask token at corrupted positions).
            block_length: diffusion block length (I-DLM: the stride); must divide ``L``.
            causal_in_block: I-DLM's mask (App. E, Fig. 8a: causal inside each noisy block) instead of
                NLD's bidirectional block.

        Returns:
            ``(ar_logits, diff_logits)``, each ``(N, L, V)``: AR logits of the clean stream and
            logits of the noisy stream.

        With a gated LoRA the noisy half runs base + LoRA and the clean half the base only (per-token gate).
        """
        n, seq_len = clean.shape
        ids = torch.cat([noisy, clean], dim=1)
        pos = torch.arange(seq_len, device=clean.device).repeat(2).unsqueeze(0).expand(n, -1)
        if self.attention_path == "flex":
            mask = dual_stream_block_mask(seq_len, block_length, clean.device, causal_in_block)
        elif self.attention_path == "sdpa_bool":
            mask = dual_stream_allowed(seq_len, block_length, clean.device, causal_in_block)[None, None]
        else:
            mask = dual_stream_mask(seq_len, block_length, self.mask_dtype, clean.device, causal_in_block)
        gate = torch.zeros((n, 2 * seq_len), dtype=torch.bool, device=clean.device)
        gate[:, :seq_len] = True
        with lora_positions(self, gate):
            logits = self.call_backbone(ids, pos, mask)
        return self.hide_mask_column(logits[:, seq_len:]), logits[:, :seq_len]

    def noisy_stream_logits(self, clean: torch.Tensor, noisy: torch.Tensor, block_length: int,
                            causal_in_block: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The training forward of a gated LoRA in two passes: the clean stream through the frozen base
        without gradient (its keys and values become a cache), then the noisy stream with the adapter,
        attending to those cached keys and values under the dual-stream visibility.

        Same result as the noisy half of :meth:`dual_stream_logits` (tests/test_gated_lora.py), but only the
        noisy stream is differentiated: about 2.5 forwards of ``L`` tokens instead of a differentiated forward
        of ``2L``. Layout: keys ``[x_0 (L) | x_t (L)]``, queries ``x_t``; position ids ``arange(L)`` in both.

        Args:
            clean: ``(N, L)`` clean ids ``x_0``; noisy: ``(N, L)`` noisy ids ``x_t``.
            block_length: block length (NLD) or stride (I-DLM); must divide ``L``.
            causal_in_block: I-DLM's causal-within-block noisy attention instead of NLD's bidirectional block.

        Returns ``(clean_logits, noisy_logits)``, each ``(N, L, V)``; ``clean_logits`` carry no gradient.
        Raises ``ValueError`` for a model without a gated LoRA (its clean stream needs gradients).
        """
        if not self.gated:
            raise ValueError("noisy_stream_logits needs a gated LoRA (the clean stream is the frozen base)")
        n, seq_len = clean.shape
        pos = torch.arange(seq_len, device=clean.device).unsqueeze(0).expand(n, -1)
        cache = self.new_cache()
        with torch.no_grad(), lora_positions(self, False):
            clean_logits = self.hide_mask_column(self.forward_backbone(clean, pos, None, cache))
        allowed = dual_stream_allowed(seq_len, block_length, clean.device, causal_in_block)[:seq_len]
        allowed = torch.cat([allowed[:, seq_len:], allowed[:, :seq_len]], dim=1)   # keys [clean | noisy]
        with lora_positions(self, True):
            noisy_logits = self.forward_backbone(noisy, pos, to_additive(allowed, self.mask_dtype), cache)
        return clean_logits, noisy_logits

    def causal_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Plain causal forward ``(N, L) -> (N, L, V)`` (AR mode without cache; stage-1 training)."""
        with lora_positions(self, False):
            return self.hide_mask_column(self.backbone(input_ids=ids, use_cache=False).logits)

    def hide_mask_column(self, logits: torch.Tensor) -> torch.Tensor:
        """AR logits ``(..., V)`` of a gated model, or of one with an added mask token, with the mask token's
        column at -inf: the base model never had that token, so its AR distribution (and argmax) is the
        base's exactly. Other models' logits are returned as they are."""
        if (self.gated or self.hide_mask_logit) and self._mask_token_id is not None \
                and logits.shape[-1] > self._mask_token_id:
            logits = logits.clone()
            logits[..., self._mask_token_id] = float("-inf")
        return logits

    # ------------------------------------------------------------------ inference with a KV cache
    def new_cache(self) -> DynamicCache:
        """An empty KV cache: the model's own ``DynamicCache``, or a :class:`~workbench.model.window.PositionCache`
        of full layers for a sliding-window model, whose full-attention layers append in place
        (:class:`~workbench.model.kv_cache.GrowableLayer`: no copy of the prefix per forward)."""
        if self.layout.windowed:
            return use_growable_layers(PositionCache())
        return use_growable_layers(DynamicCache(config=self.backbone.config))

    def call_backbone(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                      cache: DynamicCache | None = None, logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """The one backbone forward every masked path uses: ``ids`` ``(N, Q)`` at position ids ``pos`` ``(N, Q)``
        with a mask ``(N or 1, 1, Q, cache_len + Q)`` (``None``: causal), appending to ``cache`` if given. The mask
        is additive float, or already in :attr:`attention_path`'s representation (boolean, ``BlockMask``), and
        is converted to that path (:func:`~workbench.model.attention.to_path`). For a sliding-window model the
        window is applied on position ids (:func:`~workbench.model.window.layer_masks`) and the cache records the
        new keys' positions. Returns logits ``(N, Q, V)``, or ``(N, logits_to_keep, V)`` of the last positions
        when ``logits_to_keep`` > 0, or ``(N, K, V)`` of the positions a 1-D index tensor ``logits_to_keep`` of
        length K names (the LM head then runs on those positions only: on SmolLM2-135M it is a fifth of a
        forward's products)."""
        attn = mask
        if self.layout.windowed:
            k_pos = cache.key_positions(pos) if cache is not None else pos
            if mask is None:
                allowed = k_pos[:, None, :] <= pos[:, :, None]
                attn = to_additive(allowed, self.mask_dtype)
            attn = layer_masks(attn, pos, k_pos, self.layout)
        if self.attention_path != "dense":
            path = self.attention_path
            attn = {k: to_path(v, path) for k, v in attn.items()} if isinstance(attn, dict) else to_path(attn, path)
        kw = {cache_keyword(self.backbone): cache} if cache is not None else {}
        q = ids.shape[1]
        if not isinstance(logits_to_keep, torch.Tensor) and 0 < logits_to_keep < q:
            # the last positions as an index, not a slice: the LM head then reads a contiguous (N, K, d) copy. A
            # slice keeps the full sequence's batch stride, and matmul multiplies such an input batch by batch
            # against a contiguous copy of the whole LM head per row: 0.5 s instead of 6 ms for 8 rows in bf16
            # (benchmarks/bench_lm_head.py). Keeping all Q positions (an AR step) needs neither.
            logits_to_keep = torch.arange(q - int(logits_to_keep), q, device=ids.device)
        if isinstance(logits_to_keep, torch.Tensor):
            kw["logits_to_keep"] = logits_to_keep
        out = self.backbone(input_ids=ids, position_ids=pos, attention_mask=attn, use_cache=cache is not None, **kw)
        if cache is not None and self.layout.windowed:
            cache.record(pos)
        return out.logits

    def _cached_forward(self, ids: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
                        causal: bool, logits_to_keep: int = 0) -> torch.Tensor:
        """Forward ``ids`` ``(N, Q)`` after ``cache``; ``key_valid`` ``(N, cache_len + Q)`` marks real tokens.
        Position ids count only valid tokens, so left-padded rows get the same positions as unpadded ones."""
        q = ids.shape[1]
        pos = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, -q:]
        mask = to_additive(cached_allowed(key_valid, q, causal), self.mask_dtype)
        return self.forward_backbone(ids, pos, mask, cache, logits_to_keep)

    def forward_backbone(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
                         cache: DynamicCache, logits_to_keep: int = 0) -> torch.Tensor:
        """One backbone forward of ``ids`` ``(N, Q)`` at ``pos`` ``(N, Q)`` with an additive mask
        ``(N, 1, Q, cache_len + Q)`` (``None``: causal) that appends to ``cache``. Returns logits ``(N, Q, V)``
        (``(N, logits_to_keep, V)`` of the last positions when it is > 0)."""
        return self.call_backbone(ids, pos, mask, cache, logits_to_keep)

    def extend(self, ids: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
               logits_to_keep: int = 0) -> torch.Tensor:
        """Causal forward that appends ``ids`` ``(N, Q)`` to ``cache`` (prefill, AR step, or the per-block
        KV-commit forward). ``key_valid``: ``(N, cache_len + Q)``. Returns AR logits ``(N, Q, V)``, or of the last
        ``logits_to_keep`` positions ``(N, logits_to_keep, V)`` when it is > 0: a prefill or KV-commit forward
        whose logits are not read passes 1, and skips the LM head on the other positions.
        With a gated LoRA this is the frozen base model (adapter off)."""
        with lora_positions(self, False):                    # no-op without a gated LoRA
            return self.hide_mask_column(self._cached_forward(ids, cache, key_valid, causal=True,
                                                         logits_to_keep=logits_to_keep))

    def extend_and_diffuse(self, chunk: torch.Tensor, block: torch.Tensor, cache: DynamicCache,
                           key_valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`extend` of ``chunk`` and :meth:`diffusion_logits` of ``block`` after it, in one forward: the
        chunk is appended causally (a clean, base-model stream under a gated LoRA) and the block, which sees the
        cache, the chunk and itself, is cropped off again. What a self-drafting decoder needs when drafter and
        verifier share one KV cache (the verified tokens and the next draft in one forward).

        Args:
            chunk: ``(N, W)`` clean ids to append (``W ≥ 1``); block: ``(N, B)`` block ids (mask token at
                undecided positions); key_valid: ``(N, P + W + B)`` bool, False at left padding.

        Returns ``(ar_logits (N, W, V), diffusion_logits (N, B, V))``; the cache grows by ``W``.
        """
        w, b = chunk.shape[1], block.shape[1]
        q = w + b
        ids = torch.cat([chunk, block], dim=1)
        pos = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, -q:]
        allowed = chunk_block_allowed(key_valid, w, b)
        gate = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
        gate[:, w:] = True                                            # LoRA residual on the block only
        with lora_positions(self, gate):
            logits = self.call_backbone(ids, pos, to_additive(allowed, self.mask_dtype), cache)
        cache.crop(-b)
        return self.hide_mask_column(logits[:, :w]), logits[:, w:]

    def diffusion_logits(self, block: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
                         future_masks: int = 0) -> torch.Tensor:
        """Diffusion logits of a block over the cached clean prefix, without growing the cache.

        Args:
            block: ``(N, B)`` current block ids (mask token at undecided positions).
            cache: KV cache of the clean prefix (length ``P``); left unchanged on return.
            key_valid: ``(N, P + B)`` bool, False at left padding.
            future_masks: mask tokens that follow the block in the canvas (the rest of the generation). A tri-mode
                block sees only the prefix and itself, so they are ignored here; families whose positions see the
                whole canvas (LLaDA, Dream: :mod:`workbench.model.families.adapters`) run them.

        Returns ``(N, B, V)``: logits at position ``j`` predict the token at block position ``j``.
        """
        b = block.shape[1]
        with lora_positions(self, True):                      # gated LoRA: the block is the noisy stream
            logits = self._cached_forward(block, cache, key_valid, causal=False)
        cache.crop(-b)
        return logits
