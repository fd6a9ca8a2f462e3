"""``workbench train deer --stage 1|2 --config <yaml>``: DEER two-stage alignment of a diffusion drafter
(DEER, arXiv:2512.15176 §3.1) on teacher answers of the AR target (``workbench deer teacher``).

Stage 1 starts from a fresh ``drafter_preset`` model (or ``drafter_init``: a tri-mode checkpoint, or a released
diffusion LM of a family whose forward is DEER's drafter forward, NLD, as the paper starts from a released dLLM;
:func:`~workbench.deer.models.build_drafter`); stage 2 starts from the stage-1 drafter (``drafter_init`` is
required). Run directory ``out_dir``: ``config.yaml`` (resolved config),
``logs/version_{k}/metrics.csv`` (CSV logs, one version per start or resume), ``checkpoints/last.ckpt``
(resume point), ``metrics.json`` and the final drafter in ``drafter/`` (a :func:`~workbench.model.io.
save_checkpoint` directory loadable with ``load_checkpoint``). A rerun with the same ``out_dir`` resumes.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from ..distributed import DeviceConfig, make_trainer, resume_point
from ..trackers import TRACKER_SETTINGS, TrackerConfig, Trackers
from ..atomic import write_json
from ..resume import LogHistory, ResumeChanges, RngState, StopOnSignal, discard_stale_checkpoints
from ..run_folder import check_run, open_run, training_run, update_record
from ..model.fingerprint import weights_fingerprint
from ..model.io import save_checkpoint
from ..model.presets import PRESETS
from ..utils import staged_dir, write_run_config
from .data import SPLIT_BY, TeacherDataModule, load_teacher
from .masking import NOISE, SPANS
from .models import RELEASED_KEY, build_drafter, count_parameters, load_target, released_family
from .module import DeerModule
from .shared import drafter_from_target, is_shared_drafter, load_shared_drafter, prepare_target, save_shared_drafter
from ..model.loading import ModelLoading


@dataclass
class DeerTrainConfig(DeviceConfig, ModelLoading, TrackerConfig):
    """One stage of DEER alignment (arXiv:2512.15176 §3.1): Stage I AR-style distillation or Stage II refinement.
    Device fields: :class:`~workbench.distributed.DeviceConfig` (``batch_size`` is the global batch); trackers:
    :class:`~workbench.trackers.TrackerConfig`."""

    stage: int = 1
    """1: AR-style distillation (Eq. 1–2); 2: Scribe refinement (Eq. 3–4), starting from the stage-1 drafter."""
    teacher: str = "runs/deer/teacher"
    """Teacher directory written by `workbench deer teacher`."""
    target: str | None = None
    """AR target whose tokenizer the drafter shares (default: the teacher data's target)."""
    drafter_preset: str = "deer_drafter"
    """Preset of a fresh stage-1 drafter."""
    drafter_init: str | None = None
    """Start from this tri-mode checkpoint, 'builtin:<name>', or a released diffusion LM's folder (its built-in class,
    weights, mask token and tokenizer; NLD's forward is DEER's drafter forward, other families are refused) (required
    in stage 2: the stage-1 `drafter/`)."""
    init_layers: int | None = None
    """Keep only the first init_layers decoder layers of drafter_init (a smaller drafter from a trained model)."""
    shared_layers: int | None = None
    """Stage 1 of a pretrained AR target: the drafter is the target's first shared_layers decoder layers, sharing
    its frozen embedding and LM head, saved without them (workbench.deer.shared). Stage 2 of such a drafter needs
    only drafter_init."""
    sep_token: str = "<|im_start|>"
    """Existing token used as DEER's separator when the target's tokenizer has none (SmolLM2); for a released dLLM's
    drafter_init without a separator, added at an unused embedding row when its tokenizer lacks this token."""
    out_dir: str = "runs/deer/stage1"
    """Run directory: config, CSV logs, checkpoints, metrics.json and the drafter in `drafter/`."""
    batch_size: int = 16
    """Teacher rows per optimiser step."""
    max_steps: int = 1000
    """Optimiser steps of this stage."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of lr."""
    warmup_steps: int = 50
    """Linear warm-up steps."""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    alpha: float = 1.01
    """Stage II weight base α of w_i = α^(R−i) (Eq. 3)."""
    r_max: int = 96
    """Stage II span length R ~ U{1..r_max} (§3.1.2)."""
    noise: str = "uniform"
    """Noise level t: 'uniform' (t ~ U(t_min, 1], Eq. 1 / 4) or 'full' (t = 1)."""
    t_min: float = 1e-3
    """Lower end of t."""
    max_context: int | None = 320
    """Context tokens (prompt + answer prefix) kept before SEP (the most recent); null keeps all."""
    val_percent: int = 5
    """Percent of teacher prompts (or source files, with split_by 'document') held out for validation."""
    split_by: str = "prompt"
    """Validation split: 'prompt' (by prompt id) or 'document' (by source file: the teacher cuts each file into
    up to per_file prompts, and the prompt split trains on a held-out prompt's siblings)."""
    val_rows: int = 128
    """At most this many validation rows."""
    val_every: int = 100
    """Validate every this many optimiser steps."""
    val_draft_length: int = 16
    """Block length k of the simulated greedy acceptance (val/accept_len)."""
    checkpoint_every: int = 100
    """Write checkpoints/last.ckpt every this many steps."""
    precision: str = "32-true"
    """Lightning precision ('32-true' or 'bf16-mixed')."""
    resume: bool = True
    """Resume from out_dir/checkpoints/last.ckpt when it exists."""
    seed: int = 0
    """Seed of initialisation, data order and noise."""
    max_time: str | None = None
    """Optional wall-clock limit 'DD:HH:MM:SS' (stops cleanly; resumable)."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for an inconsistent configuration."""
        self.validate_devices()
        self.trackers()                             # an unknown or missing tracker, one line
        if self.stage not in SPANS:
            raise ValueError(f"unknown DEER stage {self.stage!r}; valid: {', '.join(map(str, SPANS))}")
        if self.stage == 2 and not self.drafter_init:
            raise ValueError("stage 2 starts from the stage-1 drafter: set drafter_init to its drafter/ directory")
        if self.shared_layers is not None and (self.shared_layers <= 0 or self.drafter_init or self.init_layers):
            raise ValueError("shared_layers must be positive and builds the stage-1 drafter from the target: leave "
                             "drafter_init and init_layers unset")
        if self.init_layers is not None and (self.init_layers <= 0 or not self.drafter_init):
            raise ValueError("init_layers must be positive and needs drafter_init")
        if self.drafter_init is None and self.drafter_preset not in PRESETS:
            raise ValueError(f"unknown drafter preset {self.drafter_preset!r}; valid: {', '.join(PRESETS)}")
        if self.noise not in NOISE:
            raise ValueError(f"unknown DEER noise {self.noise!r}; valid: {', '.join(NOISE)}")
        if self.alpha <= 0 or self.r_max <= 0 or not 0 < self.t_min <= 1:
            raise ValueError("alpha and r_max must be positive and t_min in (0, 1]")
        if self.batch_size <= 0 or self.max_steps <= 0 or self.val_draft_length <= 0:
            raise ValueError("batch_size, max_steps and val_draft_length must be positive")
        if not 0 < self.val_percent < 100:
            raise ValueError(f"val_percent must be in (0, 100), got {self.val_percent}")
        if self.split_by not in SPLIT_BY:
            raise ValueError(f"unknown split_by {self.split_by!r}; valid: {', '.join(SPLIT_BY)}")


def train_deer(cfg: DeerTrainConfig) -> Path:
    """Run (or resume) one DEER stage; returns the saved drafter directory ``out_dir/drafter``.

    Raises ``ValueError`` for a bad config or incomplete teacher data, ``FileNotFoundError`` for missing
    teacher data, :class:`~workbench.deer.models.TokenizerMismatchError` when ``drafter_init`` does not
    share the target's tokenizer, :class:`~workbench.utils.RunDirError` for an unwritable run directory.
    """

    cfg.validate()
    released_family(cfg.drafter_init)             # a released dLLM DEER's drafter cannot start from: nothing written
    settings = load_teacher(cfg.teacher).settings
    target_spec = cfg.target or settings["target"]
    check_run(**run_folder_args(cfg, target_spec))   # another kind, a store, changed settings: nothing written yet
    ckpt_dir = Path(cfg.out_dir) / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=cfg.checkpoint_every,
                           save_top_k=0, save_on_train_epoch_end=False)
    stop = StopOnSignal(ckpt_dir / "last.ckpt")
    trackers = Trackers(cfg, cfg.out_dir, "train deer", resuming=bool(cfg.resume) and (ckpt_dir / "last.ckpt").exists())
    # devices and the global-batch rule are checked before the run directory is written
    trainer, plan = make_trainer(cfg, cfg.batch_size, val_check_steps=min(cfg.val_every, cfg.max_steps),
                                 max_steps=cfg.max_steps, precision=cfg.precision, gradient_clip_val=cfg.grad_clip,
                                 logger=trackers.loggers,
                                 callbacks=[ckpt, RngState(), stop, ResumeChanges(lr=cfg.lr), *trackers.callbacks],
                                 enable_progress_bar=cfg.progress_bar, log_every_n_steps=10, max_time=cfg.max_time)
    last, resuming = resume_point(ckpt_dir, cfg.resume, plan)     # same accumulation, or a one-line refusal
    with open_run(**run_folder_args(cfg, target_spec)) as folder:  # the run record first, the folder locked
        return _fit_and_save(cfg, folder, settings, target_spec, trainer, plan, stop, last if resuming else None,
                             trackers)


def _fit_and_save(cfg: DeerTrainConfig, folder, settings: dict, target_spec: str, trainer, plan, stop,
                  last: Path | None, trackers: Trackers) -> Path:
    """Train the drafter in the open run ``folder`` (resuming from ``last``) and save it (rank 0)."""
    out = write_run_config(folder.path, {**asdict(cfg), "target": target_spec})
    resuming = last is not None
    if not resuming:
        discard_stale_checkpoints(out / "checkpoints")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    target, tok = load_target(target_spec)
    shared = cfg.shared_layers is not None or (cfg.drafter_init is not None and is_shared_drafter(cfg.drafter_init))
    if shared:
        target, tok = prepare_target(target, tok, cfg.sep_token)
        base_fp = weights_fingerprint(target)
        drafter = (load_shared_drafter(cfg.drafter_init, target, tok, base_fp) if cfg.drafter_init
                   else drafter_from_target(target, cfg.shared_layers))
    else:
        drafter, dtok = build_drafter(target, tok, cfg.drafter_preset, cfg.drafter_init, cfg.seed, cfg.init_layers,
                                      cfg.sep_token)
        if getattr(drafter, RELEASED_KEY, None):
            tok = dtok                  # a released dLLM's own tokenizer: the target's ids plus its mask and separator
    drafter.train()
    module = DeerModule(drafter, cfg.stage, int(tok.sep_token_id), int(tok.pad_token_id), alpha=cfg.alpha,
                        r_max=cfg.r_max, noise=cfg.noise, t_min=cfg.t_min, max_context=cfg.max_context,
                        val_draft_length=cfg.val_draft_length, lr=cfg.lr, weight_decay=cfg.weight_decay,
                        warmup_steps=cfg.warmup_steps, max_steps=cfg.max_steps, min_lr_ratio=cfg.min_lr_ratio,
                        seed=cfg.seed)
    data = TeacherDataModule(cfg.teacher, cfg.batch_size, cfg.max_steps * cfg.batch_size, cfg.val_percent,
                             cfg.val_rows, cfg.seed, per_device_batch=plan.per_device, split_by=cfg.split_by)
    history = LogHistory(out / "logs" / "version_0" / "metrics.csv", last if resuming else None)
    history.before_fit()                        # one log across interruptions
    trackers.start(trainer, {**asdict(cfg), "target": target_spec})
    t0 = time.time()
    try:
        with stop.armed("training"):              # Ctrl-C / SIGTERM: a checkpoint, one line, exit 130 / 143
            trainer.fit(module, datamodule=data, ckpt_path=str(last) if resuming else None)
    finally:
        trackers.finish()
    wall = time.time() - t0
    if not trainer.is_global_zero:                # rank 0 writes the drafter, metrics and log
        return out / "drafter"
    history.after_fit()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    meta = {"deer_stage": cfg.stage, "preset": None if cfg.drafter_init or shared else cfg.drafter_preset,
            "init_from": cfg.drafter_init, "init_layers": cfg.init_layers, "target": target_spec,
            "teacher": cfg.teacher,
            "teacher_settings": settings, "train_config": asdict(cfg), "global_step": trainer.global_step,
            "parameters": count_parameters(drafter), "final_metrics": metrics}
    if getattr(drafter, RELEASED_KEY, None):
        meta[RELEASED_KEY] = getattr(drafter, RELEASED_KEY)
    drafter.eval()
    with staged_dir(out / "drafter") as tmp:
        if shared:
            save_shared_drafter(drafter, target, tok, tmp, meta, base_fp)
        else:
            save_checkpoint(drafter, tok, tmp, meta)
    write_json(out / "metrics.json", {"global_step": trainer.global_step, "wall_s_this_run": wall,
                                      "parameters": count_parameters(drafter), **metrics})
    update_record(folder, finished=trainer.global_step >= cfg.max_steps)
    return out / "drafter"


#: Settings of a ``train deer`` run that a resume may change (the others are refused by name): how it runs and
#: how often it checkpoints.
DEER_MAY_CHANGE = ("checkpoint_every", *TRACKER_SETTINGS)
#: Settings a resume applies to the rest of an unfinished run (:class:`~workbench.resume.ResumeChanges`).
DEER_APPLIED = ("lr",)


def run_folder_args(cfg: DeerTrainConfig, target_spec: str) -> dict:
    """The keyword arguments of :func:`~workbench.run_folder.check_run` / ``open_run`` for ``cfg``'s run folder
    (``target_spec``: the AR target the run aligns to, recorded in place of an unset ``target``)."""
    return training_run(replace(cfg, target=target_spec), "train deer", DEER_MAY_CHANGE, DEER_APPLIED)


def main(argv: list[str]) -> int:
    """``workbench train deer --stage 1|2 --config <yaml> [--field value ...]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench train deer", DeerTrainConfig, argv)
    print(f"drafter saved to {train_deer(cfg)}")
    return 0
