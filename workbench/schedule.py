"""The learning-rate schedule every trainer of the workbench uses: linear warm-up, then cosine decay to a floor.

NLD §5.1–5.2 decays with a WSD (warm-up, stable, decay) schedule; the workbench's short legs (hundreds of steps,
resumed across legs) use cosine decay instead, a deviation from the paper's recipe."""
from __future__ import annotations

import math
from typing import Callable

import torch


def warmup_cosine(warmup_steps: int, max_steps: int, min_lr_ratio: float) -> Callable[[int], float]:
    """Learning-rate multiplier per optimiser step, for ``torch.optim.lr_scheduler.LambdaLR``.

    Steps ``0 .. warmup_steps - 1`` rise linearly to 1 (step s gives ``(s + 1) / warmup_steps``). After that the
    multiplier follows half a cosine from 1 down to ``min_lr_ratio``, reached at ``max_steps`` and held beyond it.
    With ``warmup_steps = 0`` the cosine starts at step 0.

    Args:
        warmup_steps: warm-up length in optimiser steps (≥ 0).
        max_steps: step at which the floor is reached.
        min_lr_ratio: the floor, as a fraction of the peak learning rate, in [0, 1].

    Raises:
        ValueError: ``warmup_steps < 0`` or ``min_lr_ratio`` outside [0, 1].
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        frac = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))

    return multiplier


def optimizer_config(opt: torch.optim.Optimizer, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> dict:
    """What a LightningModule's ``configure_optimizers`` returns: ``opt`` with :func:`warmup_cosine`, stepped
    every optimiser step (not every epoch)."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(warmup_steps, max_steps, min_lr_ratio))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
