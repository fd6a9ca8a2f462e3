"""The one-line error of a model, checkpoint or adapter folder the workbench cannot use (its own module so that
every layer of ``workbench.model`` can raise it without importing the model classes)."""
from __future__ import annotations


class CheckpointError(ValueError):
    """Raised for a missing or non-Hugging-Face model path, or an adapter whose config does not fit its weights."""


__all__ = ["CheckpointError"]
