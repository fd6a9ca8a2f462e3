"""Draft pathway vs verifier pathway of one model carrying a LoRA adapter (NLD §3.3).

The LoRA drafter lives on the diffusion draft pathway only: the AR verifier is the same backbone with
the adapter disabled. With a plain (adapter-free) backbone both contexts are no-ops, so every decoding
function can call them unconditionally.
"""
from __future__ import annotations

import contextlib

from peft import PeftModel


def has_adapter(model) -> bool:
    """True if ``model.backbone`` (a :class:`~workbench.model.trimode.TriModeLM`) is a peft model."""
    return isinstance(model.backbone, PeftModel)


def verifier_mode(model):
    """Context manager: forwards inside run without the adapter (the AR verifier / prefix KV cache)."""
    return model.backbone.disable_adapter() if has_adapter(model) else contextlib.nullcontext()

