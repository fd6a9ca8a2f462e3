"""Refusing weights that hold NaN or infinity when a checkpoint is loaded: such a model decodes garbage (argmax of
NaN logits is token 0, NUL bytes for a byte-level tokenizer) and a trajectory store would record NaN probabilities,
so the load fails in one line naming the first non-finite tensor instead."""
from __future__ import annotations

from typing import Callable

import torch

from .errors import CheckpointError


def first_non_finite(module: torch.nn.Module) -> tuple[str, int] | None:
    """``(name, count)`` of the first floating-point parameter of ``module`` (``named_parameters`` order) holding
    NaN or ±inf, with the number of such entries; ``None`` when all are finite. Buffers are not checked (a model
    may keep ``-inf`` in a mask buffer on purpose).

    One pass over the weights: each tensor's sum is checked first (NaN and inf propagate into it), and only a
    tensor whose sum is not finite is scanned entry by entry, so that a sum overflowing in a low precision is not
    taken for a bad weight."""
    seen: set[int] = set()
    for name, t in module.named_parameters():
        if not t.is_floating_point() or id(t) in seen or t.device.type == "meta":
            continue
        seen.add(id(t))
        with torch.no_grad():
            if bool(torch.isfinite(t.sum(dtype=torch.float32))):
                continue
            bad = int((~torch.isfinite(t)).sum())
        if bad:
            return name, bad
    return None


def check_finite(module: torch.nn.Module, where, rename: Callable[[str], str] | None = None) -> None:
    """Raise :class:`~workbench.model.errors.CheckpointError` (one line) when a weight of ``module`` holds NaN or
    ±inf, naming the tensor (``rename`` maps the module's name to the checkpoint's) and how many entries."""
    found = first_non_finite(module)
    if found is not None:
        name, bad = found
        name = rename(name) if rename is not None else name
        raise CheckpointError(f"{where}: tensor {name} holds {bad} NaN or infinite value(s); the weights are damaged "
                              "(restore them from the release)")


__all__ = ["first_non_finite", "check_finite"]
