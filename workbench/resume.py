"""Exact resume of Lightning training runs: the random-number state and one training log across interruptions.

* :class:`RngState`: a callback whose state (saved in every checkpoint) is the torch (CPU and CUDA), NumPy and
  Python random states at the moment of saving; restoring it makes dropout and any other global draw of the
  resumed run continue as the uninterrupted run would have. (Data order does not use these: the workbench's data
  modules draw from generators seeded by the seed, step or epoch.)
* :class:`LogHistory`: Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts, so the rows of
  every interrupted run before the resume point are kept in ``history.csv`` beside it first, and merged back when
  the run ends: the log survives any number of interruptions.
"""
from __future__ import annotations

import random
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

from .atomic import atomic_path, write_text
from .interrupts import SafeStop, stopping_at_safe_points
from .utils import is_rank_zero


class RngState(pl.Callback):
    """Save and restore the global random states with the checkpoint (see the module docstring)."""

    def state_dict(self) -> dict:
        # tensors, tuples and numbers only, so a checkpoint still loads with torch.load(weights_only=True)
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {"torch": torch.get_rng_state(),
                 "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
                 "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        torch.set_rng_state(state_dict["torch"])
        name, keys, pos, has_gauss, gauss = state_dict["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        random.setstate(state_dict["python"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])


class LogHistory:
    """The training log ``log_csv`` of a run that may be resumed from ``checkpoint`` (see the module docstring).

    Call :meth:`before_fit` before ``trainer.fit`` and :meth:`after_fit` after it returns. Only global rank 0
    touches the files (Lightning's loggers write there only); on other ranks both calls do nothing.
    """

    def __init__(self, log_csv: Path, checkpoint: Path | None):
        if not is_rank_zero():
            checkpoint = None                       # other ranks: nothing to keep or merge
        self.log_csv, self.checkpoint = Path(log_csv), checkpoint
        self.history = self.log_csv.parent / "history.csv"
        self.earlier = None

    def before_fit(self) -> None:
        """On a resume: keep the rows of every earlier run before the checkpoint's step in ``history.csv``."""
        if self.checkpoint is None or not Path(self.checkpoint).exists():
            return
        import pandas as pd

        step = torch.load(self.checkpoint, map_location="cpu", weights_only=False, mmap=True)["global_step"]
        parts = [pd.read_csv(f) for f in (self.history, self.log_csv) if f.exists() and f.stat().st_size]
        if not parts:
            return
        log = pd.concat(parts, ignore_index=True)
        self.earlier = log[log["step"] < step]
        write_text(self.history, self.earlier.to_csv(index=False))

    def after_fit(self) -> None:
        """Write the whole log (earlier runs + this one) to ``log_csv`` and drop ``history.csv``."""
        if self.earlier is None:
            return
        import pandas as pd

        parts = [self.earlier] + ([pd.read_csv(self.log_csv)] if self.log_csv.exists() else [])
        write_text(self.log_csv, pd.concat(parts, ignore_index=True).to_csv(index=False))
        self.history.unlink(missing_ok=True)


def trainable_shapes(module: torch.nn.Module, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """``{prefix + name: shape}`` of the parameters of ``module`` that require grad: the tensors an adapter run
    checkpoints (``prefix``: the attribute path of ``module`` in the LightningModule, e.g. ``"model."``)."""
    return {prefix + n: tuple(p.shape) for n, p in module.named_parameters() if p.requires_grad}


def check_trainable_state(state_dict: dict | None, expected: dict[str, tuple[int, ...]],
                          checkpoint: str | None = None) -> None:
    """Refuse a resume whose checkpoint does not hold exactly this run's trainable tensors.

    Adapter runs (a gated LoRA in ``train lm``, a drafter LoRA in ``train lora``) checkpoint only the tensors
    that train and load them non-strictly, since the frozen base comes from ``init_from``. A checkpoint written
    by another adapter setup (the other adapter kind, other target modules or rank, another ``init_from``) would
    then load none or part of its weights. ``state_dict``: the checkpoint's tensors by name (``None``: a strategy
    that keeps them elsewhere, e.g. DeepSpeed; not checked); ``expected``: ``{name: shape}`` of this run's
    trainable tensors (:func:`trainable_shapes`). A full-model checkpoint is refused too: an adapter run never
    writes one. Raises ``ValueError`` (one line) naming the first missing, unexpected or reshaped tensor.
    """
    if state_dict is None:
        return
    got = {k: tuple(v.shape) for k, v in state_dict.items()}
    missing, unexpected = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
    reshaped = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
    if missing or unexpected or reshaped:
        first = (f"missing {missing[0]!r}" if missing else f"unexpected {unexpected[0]!r}" if unexpected
                 else f"{reshaped[0]!r} is {got[reshaped[0]]}, this run's {expected[reshaped[0]]}")
        raise ValueError(f"{checkpoint or 'the checkpoint'} holds other trainable tensors than this run "
                         f"({len(missing)} missing, {len(unexpected)} unexpected, {len(reshaped)} reshaped; {first}): "
                         "it was written with another adapter setup; resume with the run's own init_from and "
                         "adapter options, or use a new out_dir")


def check_resume_state(checkpoint: Path, expected: dict[str, tuple[int, ...]]) -> None:
    """:func:`check_trainable_state` on the checkpoint file ``checkpoint`` (memory-mapped), before a resumed
    run writes anything. A checkpoint folder (DeepSpeed) is not checked here."""
    if Path(checkpoint).is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True).get("state_dict")
        check_trainable_state(state, expected, str(checkpoint))




def discard_stale_checkpoints(ckpt_dir: Path) -> None:
    """A fresh start in a run folder (no ``last.ckpt`` to resume from): remove the checkpoints an earlier attempt
    left (it failed before its first resume point, e.g. on a full disk), so that the best-checkpoint bookkeeping
    starts clean; Lightning would otherwise write ``best-3-v1.ckpt`` beside a stale ``best-3.ckpt``. Global rank 0
    only (call it while holding the run folder)."""
    if is_rank_zero() and Path(ckpt_dir).is_dir():
        for f in Path(ckpt_dir).glob("*.ckpt"):
            f.unlink()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, writing each checkpoint to a temporary name and renaming it into place
    (:mod:`workbench.atomic`): a full disk or a kill never leaves a truncated ``.ckpt``, and a full disk is one line
    (:class:`~workbench.atomic.DiskFullError`) naming the checkpoint and about the bytes it needed. Every ``train``
    command's trainer uses it (:func:`~workbench.distributed.make_trainer`)."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, tensor_bytes(checkpoint)) as tmp:
            torch.save(checkpoint, tmp)


def tensor_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) checkpoint: about what ``torch.save`` writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class LastAfterValidation(ModelCheckpoint):
    """Writes ``last.ckpt`` after every validation. Lightning 2.6 updates ``save_last`` only when a top-k
    checkpoint was saved at that step, which would leave a stale resume point whenever the monitored
    metric does not improve. Being a ``ModelCheckpoint`` it runs after the best-checkpoint callback
    listed before it, so ``last.ckpt`` carries that callback's updated state."""

    def __init__(self, dirpath: Path):
        super().__init__(dirpath=dirpath, save_top_k=0, save_last=False)

    def on_train_batch_end(self, *args, **kwargs) -> None:
        return None

    def on_train_epoch_end(self, *args, **kwargs) -> None:
        return None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from pytorch_lightning.trainer.states import TrainerFn

        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            trainer.save_checkpoint(Path(self.dirpath) / "last.ckpt", weights_only=False)


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``, the resume point, after every epoch and, with ``every_n_train_steps``, every that many steps.
    Lightning 2.6 writes ``save_last`` at an epoch's end only when a top-k checkpoint was saved there too, so with
    ``save_top_k=0`` a run killed before its end had no resume point at all. The epoch's checkpoint is written when
    the next epoch starts, once Lightning has closed the epoch (its counters, early stopping): a resume then starts
    the next epoch exactly as the uninterrupted run did (written inside ``on_train_epoch_end`` instead, a resume
    closes that epoch a second time)."""

    def __init__(self, dirpath: Path, every_n_train_steps: int | None = None):
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, save_on_train_epoch_end=True,
                         every_n_train_steps=every_n_train_steps)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch > 0:
            self._save_last(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._save_last(trainer)                    # the end of training (Lightning's own skips it once saved)

    def _save_last(self, trainer: pl.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class StopOnSignal(pl.Callback):
    """Ctrl-C and SIGTERM stop training at the next optimiser step with a resumable checkpoint
    (:mod:`workbench.interrupts`).

    Train inside :meth:`armed`: there a signal only sets a flag. After the next optimiser step (never inside a
    gradient accumulation) every rank agrees to stop, ``checkpoint`` (the run's ``last.ckpt``) is written, and the
    run ends with :class:`~workbench.interrupts.Interrupted` ("interrupted at step N; a checkpoint was saved: rerun
    the same command to resume"; exit status 130 or 143). A signal during validation stops after the validation.
    A run whose last step is done when the signal arrives finishes normally.
    """

    def __init__(self, checkpoint: Path):
        self.checkpoint = Path(checkpoint)
        self.flag = None

    def state_dict(self) -> dict:
        return {}

    @contextmanager
    def armed(self, what: str = "the run"):
        """Run ``trainer.fit`` inside this block (see the class docstring)."""
        with stopping_at_safe_points(what) as flag:
            self.flag = flag
            try:
                yield
            finally:
                self.flag = None

    def check(self, message: str) -> None:
        """Inside :meth:`armed`, outside a training loop (e.g. after ``trainer.validate``): end with ``message`` if
        a signal arrived."""
        if self.flag is not None and self.flag.signum is not None:
            raise SafeStop(self.flag.signum, message)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.flag is not None:            # Lightning put its own SIGTERM handler in place when the loop started
            self.flag.install()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.flag is not None:            # the same for trainer.validate, which installs Lightning's again too
            self.flag.install()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.flag is None or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        if not trainer.strategy.reduce_boolean_decision(self.flag.signum is not None, all=False):
            return
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return                                                  # the last step: the run finishes normally
        trainer.save_checkpoint(self.checkpoint, weights_only=False)
        raise SafeStop(self.flag.signum or signal.SIGTERM,
                       f"interrupted at step {trainer.global_step}; a checkpoint was saved: rerun the same command "
                       "to resume")


class ResumeChanges(pl.Callback):
    """Applies this run's settings over the ones a resumed checkpoint restores, and prints what changed:

    * ``lr``: the restored schedule's peak (its ``base_lrs``) is compared with ``lr``; when they differ the
      schedule keeps its shape and position and is scaled to the new peak (``lr(t) = lr / peak_old · lr_old(t)``,
      :func:`scale_learning_rate`). Compared with the checkpoint itself, not with a record, so a value is never
      recorded without being applied;
    * ``patience``: early stopping's patience (Lightning restores the old one with the checkpoint).
    """

    def __init__(self, lr: float | None = None, patience: int | None = None):
        self.lr, self.patience = lr, patience

    def state_dict(self) -> dict:
        return {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        peaks = [b for cfg in trainer.lr_scheduler_configs for b in getattr(cfg.scheduler, "base_lrs", [])]
        if self.lr is not None and peaks and abs(peaks[0] - self.lr) > 1e-12 * max(1.0, self.lr):
            scale_learning_rate(trainer, self.lr / peaks[0])
            print(f"lr {peaks[0]:g} → {self.lr:g} from step {trainer.global_step}: the schedule continues at its "
                  "position, scaled to the new peak", flush=True)
        if self.patience is not None:
            for cb in trainer.callbacks:
                if isinstance(cb, EarlyStopping) and cb.patience != self.patience:
                    print(f"early-stopping patience {cb.patience} → {self.patience} from step {trainer.global_step}",
                          flush=True)
                    cb.patience = self.patience


def scale_learning_rate(trainer: pl.Trainer, ratio: float) -> None:
    """Multiply the learning rate of every optimiser group of ``trainer``, its ``initial_lr`` and its schedulers'
    ``base_lrs`` by ``ratio`` (the rest of the schedule keeps its shape at the new scale)."""
    for opt in trainer.optimizers:
        for g in opt.param_groups:
            g["lr"] *= ratio
            if "initial_lr" in g:
                g["initial_lr"] *= ratio
    for cfg in trainer.lr_scheduler_configs:
        sched = cfg.scheduler
        if hasattr(sched, "base_lrs"):
            sched.base_lrs = [b * ratio for b in sched.base_lrs]
        if hasattr(sched, "_last_lr"):
            sched._last_lr = [g["lr"] for g in sched.optimizer.param_groups]


__all__ = ["AtomicCheckpointIO", "LastAfterValidation", "LastCheckpoint", "LogHistory", "ResumeChanges", "RngState",
           "StopOnSignal", "check_resume_state", "check_trainable_state", "discard_stale_checkpoints",
           "scale_learning_rate", "trainable_shapes"]
