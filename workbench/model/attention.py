"""Attention paths for the workbench's masks: the same visibility, three representations.

* ``dense`` (the reference): additive float masks ``(N, 1, Q, K)`` (0 = attend, dtype-min = blocked), which every
  attention implementation of transformers takes, the eager one included.
* ``sdpa_bool``: the backbone on PyTorch SDPA with boolean masks (True = attend): a quarter of the float mask's
  memory, and SDPA's fused CPU / GPU kernels take it without materialising an additive copy.
* ``flex``: the backbone on FlexAttention with ``BlockMask``s (``torch.nn.attention.flex_attention``). The dual
  stream's training mask (NLD Fig. 3) is built from its rule (:func:`dual_stream_mask_mod`), never as an
  ``L × L`` tensor, and tiles that are entirely blocked are skipped. Other masks (decoding) become a ``BlockMask``
  over their boolean tensor. GPUs only in practice: PyTorch 2.13 has no FlexAttention backward on CPU (``train lm``
  refuses ``--attention flex`` there), and inductor's CPU flex template fails to build on this machine.

:func:`set_attention_path` switches a model; ``TriModeLM.call_backbone`` converts each mask for the path.
"""
from __future__ import annotations

import torch

#: Attention paths (see the module docstring).
ATTENTION_PATHS = ("dense", "sdpa_bool", "flex")
#: The transformers attention implementation each path runs on (None: keep the model's own).
_IMPLEMENTATION = {"dense": None, "sdpa_bool": "sdpa", "flex": "flex_attention"}


def check_attention_path(path: str) -> None:
    """Raise ``ValueError`` listing the valid names for an unknown path."""
    if path not in ATTENTION_PATHS:
        raise ValueError(f"unknown attention path {path!r}; valid: {', '.join(ATTENTION_PATHS)}")


def set_attention_path(model, path: str) -> None:
    """Switch the :class:`~workbench.model.trimode.TriModeLM` ``model`` to ``path``: its backbone's attention
    implementation (``set_attn_implementation``) and the mask representation ``call_backbone`` hands it.

    Raises ``ValueError`` for an unknown path, or ``flex`` on a sliding-window model (its per-layer-type masks
    are built densely)."""
    check_attention_path(path)
    if path == "flex" and model.layout.windowed:
        raise ValueError("the flex attention path does not serve sliding-window models yet; use sdpa_bool or dense")
    impl = _IMPLEMENTATION[path]
    base = model.backbone.get_base_model() if hasattr(model.backbone, "get_base_model") else model.backbone
    if impl is not None and base.config._attn_implementation != impl:
        base.set_attn_implementation(impl)
    model.attention_path = path


def dual_stream_mask_mod(seq_len: int, block_length: int, causal_in_block: bool = False):
    """The dual stream's visibility (:func:`~workbench.model.masks.dual_stream_allowed`, NLD Fig. 3) as a
    FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``: index ``< seq_len`` is the noisy stream, the rest
    the clean stream, both at positions ``index mod seq_len``."""
    def mask_mod(b, h, q_idx, kv_idx):
        q_noisy, k_noisy = q_idx < seq_len, kv_idx < seq_len
        qp, kp = q_idx % seq_len, kv_idx % seq_len
        qb, kb = qp // block_length, kp // block_length
        same_block = qb == kb
        if causal_in_block:
            same_block = same_block & (kp <= qp)
        noisy_noisy = q_noisy & k_noisy & same_block
        noisy_clean = q_noisy & ~k_noisy & (kb < qb)
        clean_clean = ~q_noisy & ~k_noisy & (kp <= qp)
        return noisy_noisy | noisy_clean | clean_clean

    return mask_mod


def dual_stream_block_mask(seq_len: int, block_length: int, device, causal_in_block: bool = False):
    """``BlockMask`` of the dual stream ``(1, 1, 2·seq_len, 2·seq_len)`` from :func:`dual_stream_mask_mod`.
    Raises ``ValueError`` if ``block_length`` does not divide ``seq_len``."""
    from torch.nn.attention.flex_attention import create_block_mask

    if block_length <= 0 or seq_len % block_length:
        raise ValueError(f"block length {block_length} must be positive and divide the sequence length {seq_len}")
    n = 2 * seq_len
    return create_block_mask(dual_stream_mask_mod(seq_len, block_length, causal_in_block), None, None, n, n,
                             device=device)


def to_path(mask, path: str):
    """``mask`` ``(N, 1, Q, K)`` (additive float, or boolean with True = attend) in ``path``'s representation:
    itself (``dense``, whose masks are built additive), boolean (``sdpa_bool``) or a ``BlockMask`` over its
    boolean tensor (``flex``). Other objects (a ``BlockMask`` already, None) are returned as they are."""
    if not isinstance(mask, torch.Tensor) or path == "dense":
        return mask
    allowed = mask if mask.dtype == torch.bool else mask == 0
    if path == "sdpa_bool":
        return allowed
    from torch.nn.attention.flex_attention import create_block_mask

    table = allowed[:, 0]                                      # (N, Q, K)
    n, q, k = table.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return table[b if n > 1 else 0, q_idx, kv_idx]

    return create_block_mask(mask_mod, n if n > 1 else None, None, q, k, device=mask.device)


__all__ = ["ATTENTION_PATHS", "check_attention_path", "set_attention_path", "dual_stream_mask_mod",
           "dual_stream_block_mask", "to_path"]
