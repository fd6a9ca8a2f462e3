"""Stable fingerprints of a model (config + weights) and a tokenizer, stored in trajectory stores so a
store can be matched to the model and tokenizer that produced it."""
from __future__ import annotations

import hashlib
import json

import torch


#: Attribute set on a model whose weights were cast after loading (``decoding.base.cast_for_precision``): the
#: fingerprint of the weights it was loaded with, which :func:`model_fingerprint` then returns.
SOURCE_FINGERPRINT_ATTR = "source_fingerprint"


def model_fingerprint(model) -> str:
    """sha256 (first 16 hex digits) of the backbone's config JSON and every weight tensor's bytes. A model cast
    to bf16 for decoding keeps the fingerprint of its loaded weights (``SOURCE_FINGERPRINT_ATTR``), so it still
    matches the stores and samplers made from it."""
    cached = getattr(model, SOURCE_FINGERPRINT_ATTR, None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    bb = model.backbone if hasattr(model, "backbone") else model
    h.update(json.dumps(bb.config.to_diff_dict(), sort_keys=True, default=str).encode())
    for name, t in sorted(bb.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
    """sha256 (first 16 hex digits) of the tokenizer's vocabulary and special tokens."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps(sorted(str(x) for x in tokenizer.all_special_tokens)).encode())
    return h.hexdigest()[:16]


def weights_fingerprint(model) -> str:
    """sha256 (first 16 hex digits) of every weight tensor's float32 bytes, by name, without the config:
    the same weights give the same fingerprint under any transformers version. Adapters record their base's
    fingerprint so that an adapter for other weights is refused."""
    h = hashlib.sha256()
    bb = model.backbone if hasattr(model, "backbone") else model
    for name, t in sorted(bb.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
