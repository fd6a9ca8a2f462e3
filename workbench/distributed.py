"""Devices, strategies and the global-batch rule shared by every ``workbench train`` command.

Every training run is defined by its **global batch** ``G`` (windows, rows or block states per optimiser
step), its step count and its learning-rate schedule, none of which depends on how many devices run it.
Lightning's ``accelerator``, ``devices``, ``num_nodes``, ``strategy`` and ``precision`` only decide how a
step is computed:

    G = per-device batch × world size × gradient accumulation,    world size = devices × num_nodes

:func:`batch_plan` checks the rule once, before anything is written, and :func:`make_trainer` builds the
``pl.Trainer`` from it. The data modules then load ``per_device`` items per forward, and Lightning's
distributed sampler deals the items of each step to the ranks (see :mod:`workbench.data` for the order).

Launching: ``--devices N --strategy ddp`` on one machine re-runs the same command line once per extra rank
(Lightning's subprocess launcher); on a SLURM cluster ``srun`` starts the ranks and Lightning reads the SLURM
environment (docs/commands.md: Training on several devices). No distributed code of our own: Lightning's strategies
do the work.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Lightning strategies a ``train`` command accepts (``deepspeed`` only where the package is installed).
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp", "deepspeed")


@dataclass
class DeviceConfig:
    """The Lightning fields every ``train`` command takes from its config and command line (a mixin of the
    commands' config dataclasses)."""

    accelerator: str = "auto"
    """Lightning accelerator ('cpu', 'gpu', 'auto')."""
    devices: int = 1
    """Devices (processes) per node. More than one needs a parallel ``strategy`` (auto picks DDP)."""
    num_nodes: int = 1
    """Nodes (machines); each runs ``devices`` processes. On SLURM, launch with ``srun`` (docs/commands.md)."""
    strategy: str = "auto"
    """Lightning strategy: 'auto', 'ddp', 'ddp_spawn', 'fsdp', or 'deepspeed' where installed."""
    micro_batch_size: int | None = None
    """Items per device per forward; the rest of the global batch is gradient accumulation. None: the global
    batch divided by the world size (no accumulation)."""

    def validate_devices(self) -> None:
        """Raise ``ValueError`` (one line) for a bad device field (Lightning checks availability itself)."""
        if self.devices < 1 or self.num_nodes < 1:
            raise ValueError(f"devices and num_nodes must be ≥ 1, got {self.devices} and {self.num_nodes}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; valid: {', '.join(STRATEGIES)}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be ≥ 1, got {self.micro_batch_size}")


def check_accelerator(accelerator: str, devices: int = 1, strategy: str = "auto") -> None:
    """Refuse (one-line ``ValueError``) an ``accelerator`` that asks for a GPU on a machine where torch finds none
    ('gpu': CUDA or Apple MPS; 'cuda'; 'mps'), naming what to pass instead. Call it before any set-up, so that
    nothing is chosen or written first. Lightning's own refusal ("No supported gpu backend found!") names neither
    the cause nor the fix; any other accelerator is left to Lightning."""
    acc = str(accelerator).lower()
    if acc not in ("gpu", "cuda", "mps"):
        return
    from pytorch_lightning.accelerators import CUDAAccelerator, MPSAccelerator

    cuda, mps = CUDAAccelerator.is_available(), MPSAccelerator.is_available()
    if {"gpu": cuda or mps, "cuda": cuda, "mps": mps}[acc]:
        return
    wanted = {"gpu": "GPU (CUDA or Apple MPS)", "cuda": "CUDA GPU", "mps": "Apple MPS device"}[acc]
    cpu = "--accelerator cpu" + (" --devices 1" if devices > 1 else "") + (" --strategy auto" if strategy != "auto"
                                                                            else "")
    raise ValueError(f"--accelerator {accelerator}: no {wanted} was found on this machine (torch.cuda.is_available() "
                     f"is false); pass {cpu} to run on its CPU, or run on a machine with a GPU")


@dataclass(frozen=True)
class BatchPlan:
    """How one optimiser step of ``global_batch`` items is computed: ``per_device`` items per forward on each
    of ``world`` ranks, ``accumulate`` forwards per step (``global_batch = per_device · world · accumulate``)."""

    global_batch: int
    per_device: int
    world: int
    accumulate: int

    def micro_step(self, rank: int, first_row: int) -> int:
        """Which forward of its step (0-based) rank ``rank`` is running, from the position ``first_row`` of its
        first item in the step's global batch: a sequential ``DistributedSampler`` gives rank ``r`` the items
        ``r, r + world, r + 2·world, …``, ``per_device`` of them per forward."""
        return (int(first_row) - rank) // (self.world * self.per_device)


def batch_plan(global_batch: int, world: int, micro_batch_size: int | None = None) -> BatchPlan:
    """The :class:`BatchPlan` of a global batch on ``world`` ranks.

    Raises ``ValueError`` with the numbers when ``world`` (times ``micro_batch_size``) does not divide
    ``global_batch``.
    """
    if global_batch < 1 or world < 1:
        raise ValueError(f"the global batch and the world size must be ≥ 1, got {global_batch} and {world}")
    if micro_batch_size is None and global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by the world size {world} (devices × "
                         f"num_nodes); choose a batch_size that is a multiple of {world}")
    per_device = micro_batch_size or global_batch // world
    if global_batch % (per_device * world):
        raise ValueError(f"global batch {global_batch} is not a multiple of micro_batch_size {per_device} × world "
                         f"size {world} = {per_device * world}; change batch_size or micro_batch_size")
    return BatchPlan(global_batch, per_device, world, global_batch // (per_device * world))


def check_resume(checkpoint, plan: BatchPlan) -> None:
    """Refuse (one-line ``ValueError``) to resume from ``checkpoint`` with another gradient accumulation than it
    was written with: Lightning counts the forwards it restores, so a run resumed with another accumulation would
    start its next step part-way through a global batch. The device count may change (the global batch and the
    data stream do not); choose ``micro_batch_size`` so that the accumulation stays the same."""
    import torch

    ck = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    step = int(ck.get("global_step", 0))
    try:
        done = int(ck["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["processed"])
    except (KeyError, TypeError):
        return
    if step and done != step * plan.accumulate:
        old = done / step
        raise ValueError(f"{checkpoint} was written with gradient accumulation {old:g} and this run would use "
                         f"{plan.accumulate}; resume with the same accumulation: micro_batch_size = batch_size / "
                         f"(devices × num_nodes × {old:g}) = {plan.global_batch / (plan.world * old):g}")


def resume_point(ckpt_dir, resume: bool, plan: BatchPlan | None = None):
    """``(last.ckpt path, whether to resume from it)`` of a run's checkpoint folder; with ``plan``, a resume
    with another gradient accumulation is refused (:func:`check_resume`)."""
    from pathlib import Path

    last = Path(ckpt_dir) / "last.ckpt"
    resuming = bool(resume) and last.exists()
    if resuming and plan is not None:
        check_resume(last, plan)
    return last, resuming


def forward_index(module, batch_idx: int) -> int:
    """Which forward of the current optimiser step a LightningModule's ``training_step`` is running, over all
    ranks: ``rank + world × (batch_idx mod accumulation)``; 0 on one device without accumulation. (Steps start
    at a multiple of the accumulation: :func:`check_resume` keeps it fixed across resumes.)"""
    trainer = module.trainer
    return int(trainer.global_rank + trainer.world_size * (batch_idx % trainer.accumulate_grad_batches))


def make_trainer(cfg: DeviceConfig, global_batch: int, val_check_steps: int | None = None, **kwargs):
    """A ``pl.Trainer`` on ``cfg``'s accelerator, devices, nodes and strategy, with the gradient accumulation
    of :func:`batch_plan`, and that plan. ``val_check_steps``: validate every this many optimiser steps
    (Lightning counts forwards, so it is multiplied by the accumulation). ``kwargs`` go to ``pl.Trainer``
    (precision, loggers, callbacks …).

    Build it before writing any output: Lightning raises here for devices it cannot see, and the plan for
    a batch the devices do not divide. Raises ``ValueError`` (:func:`batch_plan`) and Lightning's
    ``MisconfigurationException``.
    """
    import pytorch_lightning as pl

    cfg.validate_devices()
    check_accelerator(cfg.accelerator, cfg.devices, cfg.strategy)   # a property of this machine, not of the config
    if cfg.strategy == "deepspeed":
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise ValueError("strategy 'deepspeed' needs the deepspeed package (pip install deepspeed); "
                             "use 'ddp' or 'fsdp'")
    plan = batch_plan(global_batch, cfg.devices * cfg.num_nodes, cfg.micro_batch_size)
    defaults = dict(num_sanity_val_steps=0, enable_model_summary=False)
    if cfg.strategy not in ("deepspeed", "fsdp"):          # those two write checkpoints with their own writers
        from .resume import AtomicCheckpointIO

        defaults["plugins"] = [AtomicCheckpointIO()]
    if val_check_steps is not None:
        defaults.update(val_check_interval=val_check_steps * plan.accumulate, check_val_every_n_epoch=None)
    trainer = pl.Trainer(accelerator=cfg.accelerator, devices=cfg.devices, num_nodes=cfg.num_nodes,
                         strategy=cfg.strategy, accumulate_grad_batches=plan.accumulate, **{**defaults, **kwargs})
    return trainer, plan


__all__ = ["DeviceConfig", "BatchPlan", "batch_plan", "check_accelerator", "make_trainer", "check_resume", "resume_point", "forward_index",
           "STRATEGIES"]
