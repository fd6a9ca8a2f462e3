"""DiffusionGemma (``model_type`` ``diffusion_gemma``) as a workbench model: an adapter around transformers' native
``DiffusionGemmaForBlockDiffusion`` (transformers 5.24, ``transformers/models/diffusion_gemma/``).

The model is an encoder-decoder over one shared weight stack (``model.encoder.language_model.*`` and
``model.decoder.*`` are tied, and ``lm_head`` is tied to the embeddings):

* the **encoder** runs causally (sliding-window and full layers) over clean tokens and *writes* their keys and
  values into a ``DynamicCache``: the prompt once, then every finished canvas (:meth:`DiffusionGemmaLM.extend`);
* the **decoder** runs a canvas of ``canvas_length`` tokens bidirectionally over the cache and itself, *reading*
  the cache without growing it (its attention concatenates the canvas keys to the cached ones), and adds a
  self-conditioning signal made from the previous step's logits (:meth:`DiffusionGemmaLM.canvas_logits`).

There is **no mask token**: undecided canvas positions hold tokens drawn uniformly from the vocabulary.
DiffusionGemma's own sampler (re-noising, self-conditioning) is
:func:`workbench.decoding.families.diffusion_gemma.entropy_bound_decode`. For the workbench's mask-based decoders,
the collector and SOL, :attr:`DiffusionGemmaLM.mask_token_id` is a virtual id one past the vocabulary, which
:meth:`DiffusionGemmaLM.diffusion_logits` replaces with a fixed noise token per position: a commit-once sampler over a
fixed noise canvas, a different sampler from the reference.

Encoder logits (what :meth:`DiffusionGemmaLM.extend` returns). transformers never applies ``lm_head`` to the
encoder output and defines no loss at all (``DiffusionGemmaForBlockDiffusion.forward`` has no ``labels``; it applies
``lm_head`` and the soft-cap to the decoder's ``last_hidden_state`` only). The encoder's final hidden state is
exposed as ``encoder_last_hidden_state``, documented as being there "e.g. to compute an autoregressive loss on the
encoder during training" (``DiffusionGemmaModelOutputWithPast``). Applying the tied ``lm_head`` and the soft-cap to
it gives *exactly* the logits of a Gemma-4 causal LM (``Gemma4ForCausalLM`` with ``enable_moe_block=True``,
``attention_k_eq_v=True``, ``hidden_size_per_layer_input=0``, ``final_logit_softcapping=30``) holding the same
weights: the state dict loads strictly and the logits agree to 0.0 (tests/test_family_diffusion_gemma.py). So they
have the form of next-token logits (position ``i`` predicts token ``i + 1``); whether a released checkpoint was
trained so that they are a good AR distribution cannot be checked offline (inferred from that docstring only).
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from ..trimode import BackboneModule

#: Text sub-config of :func:`tiny_diffusion_gemma` (besides the vocabulary): a two-layer MoE model with one
#: sliding-window layer (window 16) and one full layer.
TINY_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, global_head_dim=32, num_global_key_value_heads=1,
                 sliding_window=16, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                 max_position_embeddings=2048, layer_types=["sliding_attention", "full_attention"])
#: Vision sub-config of :func:`tiny_diffusion_gemma`: the model requires one; the default is a 167.6 M-parameter
#: tower that takes 2.7 s to build.
TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, position_embedding_size=64)


class DiffusionGemmaLM(BackboneModule):
    """Workbench adapter of a ``DiffusionGemmaForBlockDiffusion``.

    Args:
        backbone: the native model (``DiffusionGemmaForBlockDiffusion``); kept as :attr:`backbone`.

    Padding follows transformers' ``generate``: the 2-D ``key_valid`` mask is its ``attention_mask`` (False at left
    padding), and position ids are absolute cache indices (``cache_len … cache_len + Q - 1``), padding included,
    exactly as ``generate`` numbers them (``encoder_position_ids`` / ``decoder_position_ids``). RoPE is relative,
    so a padded row agrees with its unpadded run up to rounding, not bit for bit.

    Raises ``TypeError`` for a backbone that is not a DiffusionGemma model.
    """

    #: Decoding modes (see :data:`workbench.model.families.spec.MODES`): the canvas sampler only. The encoder
    #: logits of :meth:`extend` have the form of AR logits but are not known to be trained as such.
    modes = ("diffusion",)
    #: Its sliding-window KV cache is not a plain causal append of columns, so SOL's prefix bank recomputes prefixes
    #: through :meth:`extend` (``workbench.sol.bank.make_bank``); every commit is an encoder forward.
    causal_prefix = False
    commit_forward = True

    def __init__(self, backbone: nn.Module):
        super().__init__()
        if getattr(getattr(backbone, "config", None), "model_type", None) != "diffusion_gemma" \
                or not hasattr(backbone, "model") or not hasattr(backbone.model, "decoder"):
            raise TypeError(f"DiffusionGemmaLM wraps a DiffusionGemmaForBlockDiffusion, got {type(backbone).__name__}")
        self.backbone = backbone

    # ------------------------------------------------------------------ properties
    @property
    def mask_token_id(self) -> int:
        """A **virtual** mask id, ``V`` (one past the vocabulary): DiffusionGemma has no mask token (its undecided
        canvas positions hold uniform random tokens), so the workbench's mask-based decoders, the collector and SOL
        mark undecided positions with ``V``, and :meth:`diffusion_logits` feeds the model a fixed noise token there
        (:meth:`noise_tokens`); the virtual id's logit column is ``-inf``."""
        return self.vocab_size

    @property
    def has_mask_token(self) -> bool:
        """True: the virtual mask id of :attr:`mask_token_id` (the checkpoint itself has no mask token)."""
        return True

    @property
    def vocab_size(self) -> int:
        """Width of the logits (``text_config.vocab_size``)."""
        return int(self.backbone.config.get_text_config().vocab_size)

    @property
    def canvas_length(self) -> int:
        """Tokens per canvas (the block length of block diffusion; ``config.canvas_length``, 256 when released)."""
        return int(self.backbone.config.canvas_length)

    # ------------------------------------------------------------------ cache
    def new_cache(self) -> DynamicCache:
        """An empty cache of the type ``generate`` uses by default: ``DynamicCache`` over the text config (its
        sliding-window layers keep the last ``sliding_window - 1`` keys; ``get_seq_length()`` counts all tokens)."""
        return DynamicCache(config=self.backbone.config.get_text_config(decoder=True))

    @staticmethod
    def _check_key_valid(key_valid: torch.Tensor, n: int, cache_len: int, q: int, what: str) -> None:
        if key_valid.dim() != 2 or tuple(key_valid.shape) != (n, cache_len + q):
            raise ValueError(f"{what}: key_valid must be (N, cache_len + Q) = ({n}, {cache_len + q}), "
                             f"got {tuple(key_valid.shape)}")

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``lm_head`` and the final soft-cap (30) of ``DiffusionGemmaForBlockDiffusion.forward``, in fp32."""
        logits = self.backbone.lm_head(hidden).to(torch.float32)
        cap = self.backbone.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ------------------------------------------------------------------ forwards
    def extend(self, ids: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
               logits_to_keep: int = 0) -> torch.Tensor:
        """The encoder commit: a causal forward that appends ``ids`` to ``cache`` (``generate``'s step 1.a).

        Args:
            ids: ``(N, Q)`` clean token ids (the prompt, or a finished canvas).
            cache: from :meth:`new_cache`; grows by ``Q``.
            key_valid: ``(N, cache_len + Q)`` bool, False at (left) padding: ``generate``'s ``attention_mask``.
            logits_to_keep: > 0 computes the logits of the last ``logits_to_keep`` positions only.

        Returns the encoder logits ``(N, Q, V)`` fp32 (``(N, logits_to_keep, V)`` when > 0): the tied ``lm_head``
        and the soft-cap applied to the encoder's last hidden state, so logit ``i`` has the form of a next-token
        prediction for position ``i + 1`` (module docstring: equal to ``Gemma4ForCausalLM``; not known to be a
        trained AR distribution). The masks are built as ``generate`` builds them
        (``encoder.create_masks_for_generate``). Raises ``ValueError`` for a ``key_valid`` of the wrong shape.
        """
        n, q = ids.shape
        cache_len = cache.get_seq_length()
        self._check_key_valid(key_valid, n, cache_len, q, "extend")
        bb = self.backbone
        pos = torch.arange(cache_len, cache_len + q, dtype=torch.int32, device=ids.device).unsqueeze(0)
        ids = ids.clone(memory_format=torch.contiguous_format)
        dummy = torch.empty((n, q, 0), dtype=bb.dtype, device=ids.device)
        masks = bb.model.encoder.create_masks_for_generate(config=bb.config, inputs_embeds=dummy,
                                                           attention_mask=key_valid.bool(), cache=cache,
                                                           position_ids=pos, mm_token_type_ids=None)
        hidden = bb.model.encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=pos).last_hidden_state
        if 0 < logits_to_keep < q:
            hidden = hidden[:, q - logits_to_keep:].contiguous()
        return self._logits(hidden)

    def canvas_logits(self, canvas: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
                      self_conditioning: torch.Tensor | None = None) -> torch.Tensor:
        """One decoder forward over a canvas, reading ``cache`` without growing it (``generate``'s step 1.c.i).

        Args:
            canvas: ``(N, C)`` canvas ids (random tokens at undecided positions).
            cache: the encoder cache of the clean prefix (length ``P``); unchanged on return.
            key_valid: ``(N, P + C)`` bool, False at left padding (the canvas columns are True).
            self_conditioning: ``(N, C, V)`` logits of the previous denoising step (``None`` on the first step:
                a zero self-conditioning signal); they enter the decoder through their softmax.

        Returns ``(N, C, V)`` fp32 soft-capped logits; logit ``j`` predicts canvas position ``j``. The numbers are
        those of ``backbone(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=...,
        decoder_position_ids=arange(P, P + C), decoder_attention_mask=...)`` with the mask mapping ``generate``
        builds (``decoder.create_diffusion_decoder_attention_mask``). Raises ``ValueError`` for a ``key_valid``
        of the wrong shape.
        """
        n, c = canvas.shape
        cache_len = cache.get_seq_length()
        self._check_key_valid(key_valid, n, cache_len, c, "canvas_logits")
        bb = self.backbone
        pos = torch.arange(cache_len, cache_len + c, dtype=torch.int32, device=canvas.device).unsqueeze(0)
        masks = bb.model.decoder.create_diffusion_decoder_attention_mask(
            config=bb.config, inputs_embeds=canvas.unsqueeze(-1), cache=cache, decoder_attention_mask=key_valid.bool())
        return bb(decoder_input_ids=canvas, self_conditioning_logits=self_conditioning,
                  decoder_attention_mask=masks, cache=cache, decoder_position_ids=pos).logits

    def noise_tokens(self, positions: torch.Tensor) -> torch.Tensor:
        """The fixed noise token of each absolute canvas position in ``positions`` (any shape): uniform random tokens
        drawn once with seed 0 (a table grown as needed), so a denoising forward depends on the decided positions
        alone."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        table = getattr(self, "_noise", None)
        if table is None or table.numel() < need:
            table = torch.randint(self.vocab_size, (max(need, 4096),), generator=torch.Generator().manual_seed(0))
            self._noise = table
        return table.to(positions.device)[positions]

    def diffusion_logits(self, block: torch.Tensor, cache: DynamicCache, key_valid: torch.Tensor,
                         future_masks: int = 0) -> torch.Tensor:
        """The generic decoders' denoising forward: :meth:`canvas_logits` without self-conditioning, the virtual mask
        id (:attr:`mask_token_id`) replaced by the position's fixed noise token (:meth:`noise_tokens`): a commit-once
        sampler over a fixed noise canvas, not DiffusionGemma's own re-noising sampler (the ``diffusion_gemma``
        decoder).

        Args:
            block: ``(N, B)`` ids, the virtual mask id at undecided positions. cache: the encoder cache of the
                prefix (unchanged on return). key_valid: ``(N, P + B)``. future_masks: ignored (never visible).

        Returns ``(N, B, V + 1)`` fp32: the model's logits and the virtual mask's column at ``-inf``."""
        n, b = block.shape
        undecided = block == self.mask_token_id
        if undecided.any():
            start = cache.get_seq_length()
            pos = torch.arange(start, start + b, device=block.device).expand(n, b)
            block = torch.where(undecided, self.noise_tokens(pos), block)
        logits = self.canvas_logits(block, cache, key_valid)
        return torch.cat([logits, logits.new_full((n, b, 1), float("-inf"))], dim=-1)


def tiny_diffusion_gemma(vocab_size: int = 512, canvas_length: int = 8, seed: int = 0) -> DiffusionGemmaLM:
    """A tiny random DiffusionGemma (about 221 k parameters for ``vocab_size=512``; builds in ~0.05 s) wrapped in
    :class:`DiffusionGemmaLM`, fp32, eval mode, for tests. Text: :data:`TINY_TEXT` (two MoE layers, sliding window
    16); vision: :data:`TINY_VISION`. Special ids: pad 0, eos 1, bos 2 (the text config's defaults), and
    ``boi``/``eoi``/``image`` = ``vocab_size - 4 … vocab_size - 2``. The weights depend on ``seed`` only; the
    global RNG state is left as it was. Its ``generation_config`` is empty, so ``generate`` uses its global
    defaults (no EOS, no pad). Raises ``ValueError`` for ``vocab_size < 8``."""
    from transformers import (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig,
                              Gemma4VisionConfig)

    if vocab_size < 8:
        raise ValueError(f"tiny_diffusion_gemma needs vocab_size >= 8, got {vocab_size}")
    text = DiffusionGemmaTextConfig(vocab_size=vocab_size, **TINY_TEXT)
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=Gemma4VisionConfig(**TINY_VISION),
                               canvas_length=canvas_length, boi_token_id=vocab_size - 4,
                               eoi_token_id=vocab_size - 3, image_token_id=vocab_size - 2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        backbone = DiffusionGemmaForBlockDiffusion(cfg).eval()
    return DiffusionGemmaLM(backbone)
