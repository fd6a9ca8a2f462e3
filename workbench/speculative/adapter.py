"""Draft pathway vs verifier pathway of one model carrying a LoRA adapter (NLD §3.3).

The LoRA drafter lives on the diffusion draft pathway only: the AR verifier is the same backbone with
the adapter disabled. With a plain (adapter-free) backbone both contexts are no-ops, so every decoding
function can call them unconditionally.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from peft import PeftModel

from ..model.gated_lora import adapters_disabled


def has_adapter(model) -> bool:
    """True if ``model.backbone`` (a :class:`~workbench.model.trimode.TriModeLM`) is a peft model."""
    return isinstance(model.backbone, PeftModel)


def verifier_mode(model):
    """Context manager: forwards inside run without the adapter (the AR verifier / prefix KV cache).
    :func:`~workbench.model.gated_lora.adapters_disabled`: peft's switch without its per-call model walk."""
    return adapters_disabled(model.backbone) if has_adapter(model) else contextlib.nullcontext()


def check_adapter_dir(adapter_dir) -> Path:
    """``adapter_dir`` as a Path; raises ``FileNotFoundError`` if it holds no peft ``adapter_config.json``."""
    d = Path(adapter_dir)
    if not (d / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{d} is not a peft adapter directory (no adapter_config.json)")
    return d


def load_adapter(model, adapter_dir, trainable: bool = False):
    """Attach the peft adapter saved in ``adapter_dir`` to ``model.backbone`` (in place) and return ``model``.

    Raises ``FileNotFoundError`` if ``adapter_dir`` holds no ``adapter_config.json``, and
    :class:`~workbench.model.io.CheckpointError` (one line) for an adapter whose config disagrees with its weights or
    whose weights do not fit the model (:func:`~workbench.model.adapter_check.check_adapter`), before anything is loaded.
    """
    from ..model.adapter_check import check_adapter

    d = check_adapter_dir(adapter_dir)
    check_adapter(d, model.backbone)
    model.backbone = PeftModel.from_pretrained(model.backbone, d, is_trainable=trainable)
    return model
