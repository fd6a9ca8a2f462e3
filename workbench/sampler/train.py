"""``workbench train sampler``: train the confidence sampler (NLD App. A) on a trajectory store.

Run directory ``out_dir``: ``config.yaml`` (resolved config), ``logs/version_0/metrics.csv`` (one CSV log across
any number of resumes), ``checkpoints/last.ckpt`` (resume point, written after every validation),
``checkpoints/best-*.ckpt`` (best ``val/auc``), ``metrics.json``, and the best sampler saved with
:func:`~workbench.sampler.network.save_sampler` in ``out_dir/sampler``. Early stopping on ``val/auc``
(NLD App. A). A rerun with the same ``out_dir`` resumes from ``last.ckpt`` exactly: the optimiser, schedule and
random states (dropout) continue, and a run stopped mid-epoch skips the batches of that epoch it already trained on,
so the losses and final weights are those of an uninterrupted run.
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

from ..distributed import DeviceConfig, make_trainer
from ..trackers import TRACKER_SETTINGS, TrackerConfig, Trackers
from ..atomic import write_json
from ..resume import LastCheckpoint, LogHistory, ResumeChanges, RngState, StopOnSignal, discard_stale_checkpoints
from ..run_folder import check_run, open_run, read_record, training_run, update_record
from ..utils import staged_dir, write_run_config
from .data import SPLIT_BY, SamplerDataModule
from .module import SamplerModule
from .network import SAMPLER_PRESETS, SamplerNet, count_parameters, sampler_preset, save_sampler
from ..model.loading import ModelLoading


@dataclass
class SamplerTrainConfig(DeviceConfig, ModelLoading, TrackerConfig):
    """Training of the confidence sampler on a trajectory store (NLD App. A). Device fields:
    :class:`~workbench.distributed.DeviceConfig` (``batch_size`` is the global batch); trackers:
    :class:`~workbench.trackers.TrackerConfig`."""

    store: str = "trajectories/tiny-serial.zarr"
    """Trajectory store (``workbench collect``)."""
    extra_stores: list[str] = field(default_factory=list)
    """More stores of the same model, read with --store as one dataset: e.g. the hybrid policy's beside the serial
    one, NLD App. A's two trajectory policies (held-out prompts are chosen by prompt id, so a prompt collected under
    both policies is held out in both)."""
    block_length: int = 32
    """Block length B of the store group to train on."""
    out_dir: str = "runs/sampler"
    """Run directory: config, CSV logs, checkpoints, and the final sampler in ``sampler/``."""
    preset: str = "default"
    """Sampler preset: 'default' (NLD App. A, 4 layers, d = 384, ~4.8 M params) or 'micro'."""
    kind: str | None = None
    """Override: 'attention' or 'mlp' (the MLP-only ablation)."""
    d_model: int | None = None
    """Override: hidden width d."""
    depth: int | None = None
    """Override: number of blocks."""
    heads: int | None = None
    """Override: attention heads."""
    feature_dim: int = 144
    """Feature width F; must equal the store's feature_spec."""
    batch_size: int = 256
    """Block states (store rows) per optimiser step: the global batch, whatever the devices. Each epoch the
    store's row blocks are dealt round-robin to the ranks' readers (``workbench.sampler.data``), so a step's
    rows differ from a one-device run's, but an epoch covers the same rows once."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)."""
    warmup_steps: int = 100
    """Linear warm-up steps before the cosine decay (at most 10 % of the schedule)."""
    max_epochs: int = 20
    """Maximum passes over the training split."""
    max_steps: int = -1
    """Maximum optimiser steps (-1: no limit); also the cosine horizon when set."""
    patience: int = 3
    """Early stopping: validations without a val/auc improvement before stopping."""
    val_every: int | None = None
    """Validate every this many training steps (None: at the end of every epoch, or at the last step when
    ``max_steps`` ends the run inside its first epoch)."""
    val_fraction: float = 0.1
    """Share of prompts (or documents or trajectories, see split_by) held out for validation."""
    split_by: str = "prompt"
    """Held-out unit: 'prompt' (all blocks of a prompt), 'document' (every prompt cut from one source file; a store
    collected with several cuts per file shares text between its prompts, so 'prompt' lets it leak into the
    held-out AUC) or 'traj'."""
    num_workers: int = 0
    """DataLoader workers reading the store."""
    block_rows: int = 1024
    """Contiguous rows per store read (the shuffle granule)."""
    buffer_blocks: int = 8
    """Row blocks in each reader's shuffle buffer."""
    precision: str = "32-true"
    """Lightning precision ('32-true', 'bf16-mixed')."""
    seed: int = 0
    """Seed of initialisation and shuffling."""
    model: str | None = None
    """Optional checkpoint (or 'builtin:tiny'): the store must have been collected with this model."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""
    resume: bool = True
    """Resume from ``out_dir/checkpoints/last.ckpt`` when it exists."""

    def sampler_config(self):
        """The network's :class:`~workbench.sampler.network.SamplerConfig` (preset + overrides)."""
        return sampler_preset(self.preset, kind=self.kind, d_model=self.d_model, depth=self.depth, heads=self.heads,
                              feature_dim=self.feature_dim, max_block_length=max(64, self.block_length))

    def validate(self) -> None:
        """Raise ``ValueError`` (one line) for an inconsistent configuration."""
        self.validate_devices()
        self.trackers()                             # an unknown or missing tracker, one line
        if self.preset not in SAMPLER_PRESETS:
            raise ValueError(f"unknown sampler preset {self.preset!r}; valid: {', '.join(SAMPLER_PRESETS)}")
        if self.split_by not in SPLIT_BY:
            raise ValueError(f"unknown split_by {self.split_by!r}; valid: {', '.join(SPLIT_BY)}")
        if self.block_length <= 0 or self.batch_size <= 0 or self.max_epochs <= 0 or self.patience <= 0:
            raise ValueError("block_length, batch_size, max_epochs and patience must be positive")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"--max_steps must be positive, or -1 for no limit (max_epochs decides); got "
                             f"{self.max_steps}, which would export an untrained sampler")
        self.sampler_config()


def _model_fingerprint(spec: str) -> str:
    from ..model.load import load_model
    from ..model.fingerprint import model_fingerprint

    model, _, _ = load_model(spec, "cpu")
    return model_fingerprint(model)


def sampler_data(cfg: SamplerTrainConfig, fingerprint: str | None = None) -> SamplerDataModule:
    """The :class:`~workbench.sampler.data.SamplerDataModule` of ``cfg``'s store(s), reader and split settings;
    ``fingerprint``: the model fingerprint the stores must carry (None: unchecked). Raises
    :class:`~workbench.trajectories.store.StoreError` as the data module does."""
    stores = [cfg.store, *cfg.extra_stores] if cfg.extra_stores else cfg.store
    return SamplerDataModule(stores, cfg.block_length, cfg.batch_size, cfg.feature_dim, cfg.val_fraction,
                             cfg.split_by, cfg.num_workers, cfg.seed, cfg.block_rows, cfg.buffer_blocks, fingerprint)


def validation_interval(cfg: SamplerTrainConfig, steps_per_epoch: int) -> int | None:
    """Optimiser steps between validations: ``cfg.val_every`` when set; else ``None`` (at each epoch's end), except
    when ``max_steps`` ends the run inside its first epoch (``steps_per_epoch`` steps): then ``max_steps``, so the run
    still validates once, at its last step, and early stopping and the best checkpoint have a ``val/auc``."""
    if cfg.val_every:
        return cfg.val_every
    return cfg.max_steps if 0 < cfg.max_steps < steps_per_epoch else None


def train_sampler(cfg: SamplerTrainConfig, callbacks: list | None = None) -> Path:
    """Train (or resume) a sampler; returns the saved sampler directory ``out_dir/sampler``.

    Raises ``ValueError`` for a bad config, :class:`~workbench.trajectories.store.StoreError` for a missing /
    mismatched store (feature spec, model fingerprint) or an empty split, :class:`~workbench.utils.RunDirError`
    for an unwritable run directory.
    """
    cfg.validate()
    check_run(**run_folder_args(cfg))           # another kind, a store, changed settings: before anything is written
    fingerprint = _model_fingerprint(cfg.model) if cfg.model else None
    data = sampler_data(cfg, fingerprint)
    steps_per_epoch = data.train_steps_per_epoch()
    val_every = validation_interval(cfg, steps_per_epoch)
    ckpt_dir = Path(cfg.out_dir) / "checkpoints"
    best = ModelCheckpoint(dirpath=ckpt_dir, filename="best-{epoch}-{step}", monitor="val/auc", mode="max",
                           save_top_k=1, auto_insert_metric_name=False)
    # the resume point: at the end of every epoch (a resume then starts the next epoch), and with a validation
    # interval also every val_every steps (a resume skips the batches of that epoch already trained on)
    last_ckpt = LastCheckpoint(ckpt_dir, every_n_train_steps=val_every)
    early = EarlyStopping(monitor="val/auc", mode="max", patience=cfg.patience, check_finite=False)
    stop = StopOnSignal(ckpt_dir / "last.ckpt")
    trackers = Trackers(cfg, cfg.out_dir, "train sampler", resuming=bool(cfg.resume) and (ckpt_dir / "last.ckpt").exists())
    # devices and the global-batch rule are checked before the run directory is written
    trainer, plan = make_trainer(cfg, cfg.batch_size, val_check_steps=val_every, max_epochs=cfg.max_epochs,
                                 max_steps=cfg.max_steps, precision=cfg.precision, logger=trackers.loggers,
                                 callbacks=[best, last_ckpt, early, RngState(), stop,
                                            ResumeChanges(lr=cfg.lr, patience=cfg.patience), *trackers.callbacks,
                                            *(callbacks or [])],
                                 enable_progress_bar=cfg.progress_bar, log_every_n_steps=10,
                                 **({} if val_every else {"check_val_every_n_epoch": 1}))
    data.per_device_batch = plan.per_device
    with open_run(**run_folder_args(cfg)) as folder:             # the run record first, the folder locked
        return _fit_and_export(cfg, folder, data, trainer, best, stop, steps_per_epoch, trackers)


def _fit_and_export(cfg: SamplerTrainConfig, folder, data, trainer, best, stop, steps_per_epoch: int,
                    trackers: Trackers) -> Path:
    """Train in the open run ``folder`` (resuming from its ``last.ckpt``) and export the best sampler (rank 0)."""
    out = write_run_config(folder.path, asdict(cfg))
    ckpt_dir = out / "checkpoints"
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    scfg = cfg.sampler_config()
    net = SamplerNet(scfg)
    total = cfg.max_steps if cfg.max_steps > 0 else cfg.max_epochs * steps_per_epoch
    module = SamplerModule(net, cfg.lr, cfg.weight_decay, min(cfg.warmup_steps, total // 10), total)
    last = ckpt_dir / "last.ckpt"
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")
    resuming = cfg.resume and last.exists()
    if not resuming:
        discard_stale_checkpoints(ckpt_dir)
    history = LogHistory(out / "logs" / "version_0" / "metrics.csv", last if resuming else None)
    history.before_fit()                        # one log across interruptions (CSVLogger deletes metrics.csv)
    trackers.start(trainer, asdict(cfg))
    t0 = time.time()
    try:
        with stop.armed("training"):              # Ctrl-C / SIGTERM: a checkpoint, one line, exit 130 / 143
            trainer.fit(module, datamodule=data, ckpt_path=str(last) if resuming else None)
    finally:
        trackers.finish()
    wall = time.time() - t0
    if not trainer.is_global_zero:                # rank 0 writes the sampler, metrics and log
        return out / "sampler"
    history.after_fit()
    if best.best_model_path and Path(best.best_model_path).exists():
        state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
        net.load_state_dict({k[len("net."):]: v for k, v in state.items() if k.startswith("net.")})
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best_auc = float(best.best_model_score) if best.best_model_score is not None else None
    meta = {"feature_spec": data.store_attrs.get("feature_spec"),
            "model_fingerprint": data.store_attrs.get("model_fingerprint"),
            "tokenizer_hash": data.store_attrs.get("tokenizer_hash"), "store": cfg.store,
            "extra_stores": list(cfg.extra_stores), "store_policy": data.store_attrs.get("policy"),
            "block_length": cfg.block_length,
            "best_val_auc": best_auc, "best_checkpoint": best.best_model_path or None,
            "global_step": trainer.global_step, "n_parameters": count_parameters(net), "train_config": asdict(cfg),
            "resumes": (read_record(folder.path) or {}).get("resumes", [])}
    # the decoding policy needs the store's token PCA table to compute the same features live
    from ..trajectories.store import StoreReader

    pca = StoreReader(cfg.store, cfg.block_length).token_pca
    with staged_dir(out / "sampler") as tmp:     # the whole export or none of it
        save_sampler(net.eval(), scfg, tmp, meta)
        if pca is not None:
            import numpy as np

            np.save(tmp / "token_pca.npy", np.asarray(pca))
    write_json(out / "metrics.json", {"global_step": trainer.global_step, "epoch": trainer.current_epoch,
                                      "wall_s_this_run": wall, "best_val_auc": best_auc,
                                      "n_train_rows": data.n_train_rows, "n_val_rows": data.n_val_rows,
                                      "single_class_validation": module.single_class_validation, **metrics})
    early = trainer.early_stopping_callback
    update_record(folder, finished=bool(early is not None and early.stopped_epoch) or trainer.current_epoch >=
                  cfg.max_epochs or 0 < cfg.max_steps <= trainer.global_step)
    return out / "sampler"


#: Settings a ``train sampler`` resume applies (besides the operational ones, every other change is refused) to the rest of an unfinished run (:class:`~workbench.resume.ResumeChanges`).
SAMPLER_APPLIED = ("lr", "patience")


def run_folder_args(cfg: SamplerTrainConfig) -> dict:
    """The keyword arguments of :func:`~workbench.run_folder.check_run` / ``open_run`` for ``cfg``'s run folder."""
    return training_run(cfg, "train sampler", may_change=TRACKER_SETTINGS, applied=SAMPLER_APPLIED)


def main(argv: list[str]) -> int:
    """``workbench train sampler --config <yaml> [--field value ...]``; prints the sampler directory."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench train sampler", SamplerTrainConfig, argv)
    out = train_sampler(cfg)
    print(f"sampler saved to {out}")
    metrics = Path(cfg.out_dir) / "metrics.json"
    if metrics.is_file() and json.loads(metrics.read_text()).get("single_class_validation"):
        print(f"workbench train sampler: warning: the validation labels of {cfg.store} (B = {cfg.block_length}) have "
              "a single class, so val/auc is 0.5 by definition and early stopping saw no signal; hold out more "
              "with --val_fraction, or collect more prompts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
