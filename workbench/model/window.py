"""Sliding-window attention (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``, Ministral …) under the
workbench's own masks and caches.

The workbench hands every backbone an explicit additive 4D mask (dual stream, diffusion blocks, draft trees,
SimSD layouts), and transformers uses such a mask as given, for every layer. A sliding layer must then receive
the mask with the window applied, and a model mixing sliding and full layers a ``{"full_attention": …,
"sliding_attention": …}`` mapping, which its forward accepts in place of the mask (the models whose forward reads
``causal_mask_mapping := attention_mask``). The window is transformers' own rule (``sliding_window_overlay``: a
query sees keys less than ``W`` positions back), taken on **position ids**, so left-padded rows, the dual
stream's shared positions and SimSD's copied positions see the keys the unpadded sequence would.

``DynamicCache(config=…)`` keeps only the last ``W − 1`` keys of a sliding layer and refuses ``crop`` once full,
while the workbench crops speculative tokens and keeps prefix banks. :class:`PositionCache` keeps every key in
full layers (the window is in the mask) and records each key's position id, so the window can be applied to
the cached keys too.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache

#: Layer types whose attention the workbench serves.
SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")


class UnsupportedArchitectureError(ValueError):
    """A model whose attention the workbench cannot serve exactly (one-line reason)."""


@dataclass(frozen=True)
class AttentionLayout:
    """Which layers attend through a sliding window.

    ``window``: the window ``W`` in tokens (keys less than ``W`` positions back are seen), or None when every
    layer is full attention. ``mixed``: both kinds occur, so the backbone takes a mask per layer type.
    """

    window: int | None
    mixed: bool

    @property
    def windowed(self) -> bool:
        """True when some layer attends through a sliding window."""
        return self.window is not None


def attention_layout(backbone) -> AttentionLayout:
    """The :class:`AttentionLayout` of a ``transformers`` causal LM (or a peft model around one), from its
    config's layer types as transformers itself reads them (``get_layer_types_and_kwargs``).

    Raises :class:`UnsupportedArchitectureError` for layer types other than full and sliding attention
    (chunked, linear, KV-sharing), for several window sizes, and for a model mixing full and sliding layers
    whose forward does not take a mask per layer type.
    """
    from transformers.cache_utils import get_layer_types_and_kwargs

    base = backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone
    config = base.config.get_text_config(decoder=True)
    try:
        types, kwargs = get_layer_types_and_kwargs(config)
    except Exception as e:                      # pragma: no cover - configs transformers cannot read
        raise UnsupportedArchitectureError(f"{type(base).__name__}: cannot read its layer types ({e})") from None
    bad = sorted(set(types) - set(SERVED_LAYER_TYPES))
    if bad:
        raise UnsupportedArchitectureError(
            f"{type(base).__name__} has {', '.join(bad)} layers; the workbench serves full and sliding-window "
            "attention only")
    windows = {int(kw["sliding_window"]) for t, kw in zip(types, kwargs) if t == "sliding_attention"}
    if not windows:
        return AttentionLayout(None, False)
    if len(windows) > 1:
        raise UnsupportedArchitectureError(f"{type(base).__name__} uses several sliding windows {sorted(windows)}; "
                                           "the workbench serves one")
    mixed = "full_attention" in types
    if mixed and not _takes_mask_mapping(type(_inner_model(base))):
        raise UnsupportedArchitectureError(
            f"{type(base).__name__} mixes sliding and full attention layers but its forward takes one attention "
            "mask for all, so the workbench's masks cannot honour the window")
    return AttentionLayout(min(windows), mixed)


def _inner_model(base):
    """The decoder stack (``model.model`` of a ``*ForCausalLM``) whose forward builds the masks."""
    inner = getattr(base, "model", None)
    return inner if isinstance(inner, torch.nn.Module) else base


@functools.lru_cache(maxsize=None)
def _takes_mask_mapping(cls: type) -> bool:
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):                # pragma: no cover
        return False
    return "attention_mask, dict)" in src


def window_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Keys inside the sliding window: ``|q_pos − k_pos| < window`` (transformers' ``sliding_window_overlay``
    on position ids, made symmetric so bidirectional blocks keep the same window; causal masks block later keys
    anyway). ``q_pos`` ``(N, Q)``, ``k_pos`` ``(N, K)`` → bool ``(N, Q, K)``."""
    return (q_pos[:, :, None] - k_pos[:, None, :]).abs() < window


def layer_masks(mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, layout: AttentionLayout):
    """The attention mask argument for a backbone of ``layout``: ``mask`` itself (no window); ``mask`` with the
    window applied (every layer sliding); or ``{"full_attention": mask, "sliding_attention": windowed}``.

    ``mask``: additive or boolean ``(N or 1, 1, Q, K)``; ``q_pos`` ``(N, Q)`` and ``k_pos`` ``(N, K)``: position ids of the
    queries and of every key (cached keys first)."""
    if not layout.windowed:
        return mask
    inside = window_allowed(q_pos, k_pos, layout.window).unsqueeze(1)          # (N, 1, Q, K)
    if mask.dtype == torch.bool:                                                # boolean masks (sdpa_bool path)
        windowed = mask & inside
    else:
        windowed = mask.masked_fill(~inside, torch.finfo(mask.dtype).min)
    return {"full_attention": mask, "sliding_attention": windowed} if layout.mixed else windowed


class PositionCache(DynamicCache):
    """A ``DynamicCache`` of full layers (every key kept, ``crop`` always allowed) that records the position id
    of each cached key, ``positions`` ``(N, cache_len)``, for sliding-window masks over cached keys.

    The positions follow the cache through :meth:`crop` and :meth:`batch_select_indices`; whoever appends keys
    appends their positions with :meth:`record` (``TriModeLM.call_backbone`` does)."""

    def __init__(self):
        super().__init__()
        self.positions: torch.Tensor | None = None

    def record(self, pos: torch.Tensor) -> None:
        """Append the position ids ``(N, Q)`` of the keys the last forward added."""
        self.positions = pos if self.positions is None else torch.cat([self.positions, pos.to(self.positions)], 1)

    def key_positions(self, pos: torch.Tensor) -> torch.Tensor:
        """Position ids of every key a forward of queries at ``pos`` ``(N, Q)`` attends to: the cached keys'
        then its own ``(N, cache_len + Q)``."""
        if self.positions is None or self.positions.shape[1] == 0:
            return pos
        return torch.cat([self.positions.to(pos), pos], dim=1)

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.positions is not None and tokens_to_remove:
            self.positions = self.positions[:, :self.positions.shape[1] - abs(tokens_to_remove)]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.positions is not None:
            self.positions = self.positions[indices.to(self.positions.device)]


__all__ = ["AttentionLayout", "attention_layout", "layer_masks", "window_allowed", "PositionCache",
           "UnsupportedArchitectureError"]
