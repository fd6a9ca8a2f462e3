"""``workbench train lora``: align a LoRA drafter on the diffusion pathway to the model's own AR
verifier with the LK-hybrid + CE loss (NLD §3.3, Eq. 6–9, App. B / Fig. 11).

Run directory ``out_dir``: ``config.yaml`` (resolved config), ``logs/version_{k}/metrics.csv`` (CSV logs,
one version per start or resume), ``checkpoints/last.ckpt`` (resume point, written after every
validation) and ``checkpoints/best-*.ckpt`` (best ``val/tau_greedy``; LoRA tensors + optimiser state
only), ``baseline.json`` (validation metrics of the adapter-free drafter, fresh runs only),
``metrics.json``, and the best adapter as a peft ``save_pretrained`` directory in ``adapter/``
(load with ``PeftModel.from_pretrained(base_backbone, out_dir/adapter)``). A rerun with the same
``out_dir`` resumes from ``last.ckpt``.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ..distributed import DeviceConfig, make_trainer, resume_point
from ..trackers import TRACKER_SETTINGS, TrackerConfig, Trackers
from ..atomic import write_json
from ..resume import (LastAfterValidation, LogHistory, ResumeChanges, RngState, StopOnSignal, check_trainable_state,
                      discard_stale_checkpoints, trainable_shapes)
from ..run_folder import check_run, open_run, training_run, update_record
from ..utils import write_run_config
from .data import SOURCES, DrafterDataModule, self_distill_windows
from .lora import add_lora, resolve_target_modules, save_adapter
from .losses import DEFAULT_LOSS, check_loss_name
from .module import LoraDrafterModule
from ..model.loading import ModelLoading

DEFAULT_BASE = "builtin:tiny"  # = workbench/assets/tiny
#: Values of ``LoraTrainConfig.drafter_adapter``.
DRAFTER_ADAPTERS = ("auto", "new", "gated")
#: Fields of a new LoRA only (unused when the gated adapter of a converted model trains).
NEW_LORA_FIELDS = ("rank", "lora_alpha", "lora_dropout", "target_modules")


@dataclass
class LoraTrainConfig(DeviceConfig, ModelLoading, TrackerConfig):
    """LoRA drafter training with the LK-hybrid + CE loss (NLD §3.3). Device fields:
    :class:`~workbench.distributed.DeviceConfig` (``batch_size`` is the global batch); trackers:
    :class:`~workbench.trackers.TrackerConfig`."""

    init_from: str = DEFAULT_BASE
    """Tri-mode checkpoint directory (or 'builtin:tiny') whose diffusion pathway gets the adapter."""
    add_mask_token: bool = False
    """Add a [MASK] token (embedding row = the mean of the others, deterministic) when the checkpoint's tokenizer
    has none, e.g. a plain Hugging Face AR model such as smollm2-135m."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    out_dir: str = "runs/lora"
    """Run directory: config, logs, checkpoints, metrics and the adapter in ``adapter/``."""
    loss: str = DEFAULT_LOSS
    """Loss variant: kl, tv, ce, lk_alpha, lk_hybrid, lk_hybrid_ce (NLD Eq. 9, default)."""
    drafter_adapter: str = "auto"
    """Which LoRA the loss trains: 'new' adds one on ``target_modules`` (NLD §3.3: o_proj, rank 128); 'gated'
    continues the gated LoRA of a converted model (e.g. smollm2-135m-trimode), whose diffusion pathway is that
    adapter and whose AR verifier is the base, at the adapter's own rank and modules (``rank``, ``lora_alpha``
    and ``target_modules`` are then unused); 'auto' picks 'gated' for a model that carries a gated LoRA, else
    'new'."""
    rank: int = 128
    """LoRA rank r (NLD §3.3: 128; the demo's small setting is ``configs/lora_tiny.yaml``, r = 16)."""
    lora_alpha: float = 512.0
    """LoRA α; the update is scaled by α / r (NLD: α = 512 at r = 128)."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    target_modules: list[str] = field(default_factory=lambda: ["o_proj"])
    """Modules that get adapters (paper: o_proj only; in a family without o_proj, e.g. GPT-2 or GPT-NeoX, o_proj
    means its attention output projection)."""
    draft_length: int = 8
    """Draft length k of the training cycles (positions per draft block)."""
    tau: float = 3.0
    """Distribution-matching temperature τ for p and q."""
    top_k: int = 200
    """K of the union top-K support U_j."""
    eta: float = 0.5
    """η of λ_j = exp(−η sg[α_j])."""
    ce_tau: float = 1.0
    """Temperature of the restricted drafter softmax in the CE term."""
    lambda_kl: float = 1.0
    """Weight of L_LK in Eq. 9."""
    lambda_ce: float = 1.0
    """Weight of L_CE in Eq. 9."""
    sample_fraction: float = 0.9
    """Share of rows (draft blocks) whose draft tokens are sampled at draft_temperature; the rest are greedy."""
    draft_temperature: float = 1.0
    """Sampling temperature T_draft of the sampled rows."""
    data_source: str = "corpus"
    """Training prefixes: 'corpus' (train-split windows) or 'self_distill' (the verifier's AR continuations)."""
    min_prefix: int = 32
    """Shortest training / validation prefix in tokens (≥ 2)."""
    max_prefix: int = 192
    """Longest prefix (corpus window length)."""
    distill_prompts: int = 256
    """Self-distillation: number of corpus prompts continued by the verifier."""
    distill_prompt_len: int = 96
    """Self-distillation: prompt length in tokens."""
    distill_gen_len: int = 96
    """Self-distillation: generated tokens per prompt."""
    distill_temperature: float = 0.0
    """Self-distillation: AR sampling temperature (0 = greedy)."""
    distill_cache: str | None = None
    """Self-distillation cache file (default: out_dir/self_distill.pt); reused when its settings match."""
    batch_size: int = 16
    """Draft blocks per optimiser step."""
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of lr."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    max_steps: int = 300
    """Optimiser steps."""
    val_every: int = 50
    """Validate (and write ``last.ckpt`` / ``best-*.ckpt``) every this many steps."""
    val_windows: int = 64
    """Validation prefixes (corpus validation split, fixed cuts)."""
    monitor: str = "val/tau_greedy"
    """Checkpoint selection metric (maximised): val/tau_greedy or val/tau_expected."""
    precision: str = "32-true"
    """Lightning precision: '32-true' or 'bf16-mixed' (autocast, also on CPU)."""
    seed: int = 0
    """Seed of the prefix cuts, draft sampling and data."""
    resume: bool = True
    """Resume from out_dir/checkpoints/last.ckpt when it exists."""
    baseline: bool = True
    """Validate the adapter-free drafter before training (fresh runs) into baseline.json."""
    max_time: str | None = None
    """Optional wall-clock limit 'DD:HH:MM:SS'."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""

    def validate(self) -> None:
        """Raise a one-line ``ValueError`` for an inconsistent configuration."""
        self.validate_devices()
        self.trackers()                             # an unknown or missing tracker, one line
        check_loss_name(self.loss)
        if self.drafter_adapter not in DRAFTER_ADAPTERS:
            raise ValueError(f"unknown drafter_adapter {self.drafter_adapter!r}; valid: {', '.join(DRAFTER_ADAPTERS)}")
        if self.rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {self.rank}")
        if self.lora_alpha <= 0:
            raise ValueError(f"lora_alpha must be positive, got {self.lora_alpha}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one module (paper: o_proj)")
        if self.draft_length < 1:
            raise ValueError(f"draft_length must be at least 1, got {self.draft_length}")
        if self.tau <= 0 or self.ce_tau <= 0 or self.top_k < 1:
            raise ValueError("tau and ce_tau must be positive and top_k at least 1")
        if not 0.0 <= self.sample_fraction <= 1.0:
            raise ValueError(f"sample_fraction must lie in [0, 1], got {self.sample_fraction}")
        if self.data_source not in SOURCES:
            raise ValueError(f"unknown data_source {self.data_source!r}; valid: {', '.join(SOURCES)}")
        if not 2 <= self.min_prefix <= self.max_prefix:
            raise ValueError(f"need 2 <= min_prefix ({self.min_prefix}) <= max_prefix ({self.max_prefix})")
        if self.batch_size <= 0 or self.max_steps <= 0 or self.val_every <= 0 or self.val_windows <= 0:
            raise ValueError("batch_size, max_steps, val_every and val_windows must be positive")
        if self.monitor not in ("val/tau_greedy", "val/tau_expected"):
            raise ValueError(f"unknown monitor {self.monitor!r}; valid: val/tau_greedy, val/tau_expected")

    def loss_hparams(self) -> dict:
        """Keyword arguments of the loss functions (:mod:`workbench.drafter.losses`)."""
        return dict(tau=self.tau, top_k=self.top_k, eta=self.eta, ce_tau=self.ce_tau, lambda_kl=self.lambda_kl,
                    lambda_ce=self.lambda_ce)


def drafter_kind(spec: str, choice: str) -> str:
    """'new' or 'gated': the LoRA that ``train lora`` trains on the model ``spec`` for ``drafter_adapter`` =
    ``choice`` (see :class:`LoraTrainConfig`). Raises ``ValueError`` (one line) for 'gated' on a model without
    a gated LoRA, or 'new' on one with it (a second LoRA on the draft pathway of a gated model is not
    supported)."""
    from ..model.named import resolve

    gated = resolve(str(spec))[1] is not None
    if choice == "auto":
        return "gated" if gated else "new"
    if choice == "gated" and not gated:
        raise ValueError(f"{spec} carries no gated LoRA to continue; use --drafter_adapter new (or auto)")
    if choice == "new" and gated:
        raise ValueError(f"{spec} is a gated-LoRA model: its draft pathway is that adapter; align it with "
                         "--drafter_adapter gated (or auto)")
    return choice


def check_resume_adapter(checkpoint: Path, kind: str, cfg: LoraTrainConfig, model) -> None:
    """Refuse (one-line ``ValueError``) to resume from ``checkpoint`` (a ``last.ckpt`` file) when it trained
    another drafter adapter than this run would, before anything is written: the other kind (``kind``, 'new' or
    'gated', :func:`drafter_kind`; e.g. after ``init_from`` changed between a plain and a gated-LoRA model), a
    new LoRA of another rank or other target modules, or a gated adapter with other tensors than ``model``'s.
    Its tensors would otherwise load partly or not at all (the checkpoint loads non-strictly). Checkpoints from
    before the kind was recorded are checked by name as they load
    (:func:`~workbench.resume.check_trainable_state`); a checkpoint folder (DeepSpeed) is not checked."""
    if not Path(checkpoint).is_file():
        return
    ck = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    old = ck.get("drafter_adapter")
    if old is not None and old != kind:
        raise ValueError(f"{checkpoint} trained a {old!r} drafter adapter and this run would train a {kind!r} one; "
                         "resume with the run's own init_from and --drafter_adapter, or use a new out_dir")
    if kind == "gated":
        check_trainable_state(ck.get("state_dict"), trainable_shapes(model, "model."), str(checkpoint))
    lora = ck.get("drafter_lora")
    now = {"rank": cfg.rank, "target_modules": list(cfg.target_modules)}
    if kind == "new" and lora is not None and lora != now:
        raise ValueError(f"{checkpoint} trained a LoRA with rank {lora['rank']} on {lora['target_modules']}, and "
                         f"this run asks for rank {now['rank']} on {now['target_modules']}; resume with the run's own "
                         "--rank and --target_modules, or use a new out_dir")


def _check_context(model, cfg: LoraTrainConfig) -> None:
    ctx = int(getattr(model.backbone.config, "max_position_embeddings", 1 << 30))
    longest = max(cfg.max_prefix, cfg.distill_prompt_len + cfg.distill_gen_len) + cfg.draft_length
    if longest > ctx:
        raise ValueError(f"prefix + draft = {longest} tokens exceeds the model context ({ctx})")


def _build_data(model, tok, cfg: LoraTrainConfig, out: Path) -> DrafterDataModule:
    from ..tokenizer import is_byte_tokenizer

    tokenizer = None if is_byte_tokenizer(tok) else tok
    data = DrafterDataModule(cfg.corpus, cfg.min_prefix, cfg.max_prefix, cfg.batch_size,
                             train_windows=cfg.max_steps * cfg.batch_size, val_windows=cfg.val_windows,
                             seed=cfg.seed, tokenizer=tokenizer)
    if cfg.data_source == "self_distill":
        from ..corpus import by_split, load_corpus
        from ..data import encode_documents

        tokens = encode_documents(by_split(load_corpus(cfg.corpus), "train"), tokenizer)
        data.distilled = self_distill_windows(model, tokens, cfg.distill_prompts, cfg.distill_prompt_len,
                                              cfg.distill_gen_len, cfg.distill_temperature, cfg.seed,
                                              cfg.distill_cache or out / "self_distill.pt",
                                              pad_id=_pad_id(tok))
        data.distill_prompt_len = cfg.distill_prompt_len
    return data


def _pad_id(tok) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else 0


def train_lora(cfg: LoraTrainConfig) -> Path:
    """Train (or resume) a LoRA drafter; returns the adapter directory ``out_dir/adapter``.

    Raises ``ValueError`` for a bad config, :class:`~workbench.model.io.CheckpointError` for a missing
    ``init_from``, :class:`~workbench.utils.RunDirError` for an unwritable run directory and
    :class:`~workbench.corpus.CorpusError` for an empty corpus — all before anything is written.
    """
    cfg.validate()
    from ..model.load import load_model

    kind = drafter_kind(cfg.init_from, cfg.drafter_adapter)
    model, tok, meta = load_model(cfg.init_from, add_mask_token=cfg.add_mask_token, trainable_adapter=kind == "gated")
    _check_context(model, cfg)
    if kind == "new":
        cfg.target_modules = resolve_target_modules(model.backbone, list(cfg.target_modules))   # before any output
    check_run(**run_folder_args(cfg))           # another kind, a store, changed settings: before anything is written
    ckpt_dir = Path(cfg.out_dir) / "checkpoints"
    best = ModelCheckpoint(dirpath=ckpt_dir, filename="best-{step}", monitor=cfg.monitor, mode="max", save_top_k=1,
                           auto_insert_metric_name=False, save_on_train_epoch_end=False)
    stop = StopOnSignal(ckpt_dir / "last.ckpt")
    trackers = Trackers(cfg, cfg.out_dir, "train lora", resuming=bool(cfg.resume) and (ckpt_dir / "last.ckpt").exists())
    # devices and the global-batch rule are checked before the run directory is written
    trainer, plan = make_trainer(cfg, cfg.batch_size, val_check_steps=min(cfg.val_every, cfg.max_steps),
                                 max_steps=cfg.max_steps, precision=cfg.precision, gradient_clip_val=cfg.grad_clip,
                                 logger=trackers.loggers,
                                 callbacks=[best, LastAfterValidation(ckpt_dir), RngState(), stop,
                                            ResumeChanges(lr=cfg.lr), *trackers.callbacks],
                                 enable_progress_bar=cfg.progress_bar, log_every_n_steps=min(10, cfg.max_steps),
                                 max_time=cfg.max_time)
    last, resuming = resume_point(ckpt_dir, cfg.resume, plan)     # same accumulation, or a one-line refusal
    if resuming:
        check_resume_adapter(last, kind, cfg, model)
    with open_run(**run_folder_args(cfg)) as folder:             # the run record first, the folder locked
        return _fit_and_save(cfg, folder, model, tok, meta, kind, trainer, plan, best, stop,
                             last if resuming else None, trackers)


def _fit_and_save(cfg: LoraTrainConfig, folder, model, tok, meta: dict, kind: str, trainer, plan, best, stop,
                  last: Path | None, trackers: Trackers) -> Path:
    """Train the drafter LoRA in the open run ``folder`` (resuming from ``last``) and save the best adapter."""
    out = write_run_config(folder.path, asdict(cfg))
    resuming = last is not None
    if not resuming:
        discard_stale_checkpoints(out / "checkpoints")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    data = _build_data(model, tok, cfg, out)
    data.per_device_batch = plan.per_device
    if kind == "new":
        add_lora(model, cfg.rank, cfg.lora_alpha, cfg.lora_dropout, cfg.target_modules)
    model.train()                    # Llama has no dropout here; only LoRA dropout reacts to the mode
    module = LoraDrafterModule(model, cfg, pad_id=_pad_id(tok), adapter_kind=kind)
    warnings.filterwarnings("ignore", message=r".*Checkpoint directory .* exists and is not empty.*")
    trackers.start(trainer, asdict(cfg))
    try:
        return _validate_fit_save(cfg, folder, out, model, meta, kind, trainer, best, stop, last, module, data)
    finally:
        trackers.finish()


def _validate_fit_save(cfg: LoraTrainConfig, folder, out: Path, model, meta: dict, kind: str, trainer, best, stop,
                       last: Path | None, module, data) -> Path:
    """The baseline validation (a fresh run), the fit and the saved adapter of :func:`_fit_and_save`."""
    resuming = last is not None
    if cfg.baseline and not resuming:
        with stop.armed("the baseline validation"):       # a signal: stop once the validation is done
            base_metrics = trainer.validate(module, datamodule=data, verbose=False)[0]
            stop.check("interrupted during the baseline validation, before training; rerun the same command")
        if trainer.is_global_zero:
            write_json(out / "baseline.json", base_metrics, sort_keys=True)
    history = LogHistory(out / "logs" / "version_0" / "metrics.csv", last if resuming else None)
    history.before_fit()                        # one log across interruptions
    t0 = time.time()
    with stop.armed("training"):                  # Ctrl-C / SIGTERM: a checkpoint, one line, exit 130 / 143
        trainer.fit(module, datamodule=data, ckpt_path=str(last) if resuming else None)
    wall = time.time() - t0
    if not trainer.is_global_zero:                # rank 0 writes the adapter, metrics and log
        return out / "adapter"
    history.after_fit()
    best_path = best.best_model_path
    if best_path and Path(best_path).exists():
        state = torch.load(best_path, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state, strict=False)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    info = {"init_from": cfg.init_from, "drafter_adapter": kind, "loss": cfg.loss, "draft_length": cfg.draft_length,
            **({"rank": cfg.rank, "lora_alpha": cfg.lora_alpha, "target_modules": list(cfg.target_modules)}
               if kind == "new" else {}),
            "global_step": trainer.global_step,
            "best_checkpoint": Path(best_path).name if best_path else None,
            "best_score": float(best.best_model_score) if best.best_model_score is not None else None,
            "monitor": cfg.monitor, "train_config": {k: v for k, v in asdict(cfg).items()
                                                      if kind == "new" or k not in NEW_LORA_FIELDS}}
    fit_vals = [v for v in module.validations if cfg.monitor in v]
    info["best_validation"] = max(fit_vals, key=lambda v: v[cfg.monitor]) if fit_vals else None
    adapter = (save_adapter(model, out / "adapter", info) if kind == "new"
               else save_aligned_gated(model, meta["adapter_meta"], info, out))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    write_json(out / "metrics.json", {
        "global_step": trainer.global_step, "wall_s_this_run": wall, "trainable_params": trainable,
        "best_checkpoint": info["best_checkpoint"], "best_" + cfg.monitor.replace("/", "_"): info["best_score"],
        "best_validation": info["best_validation"], "validations": module.validations, "final": metrics})
    update_record(folder, finished=trainer.global_step >= cfg.max_steps)
    return adapter


#: Settings of a ``train lora`` run that a resume may change (the others are refused by name): how it runs, and
#: whether a fresh run validates the adapter-free drafter first.
LORA_MAY_CHANGE = ("baseline", *TRACKER_SETTINGS)
#: Settings a resume applies to the rest of an unfinished run (:class:`~workbench.resume.ResumeChanges`).
LORA_APPLIED = ("lr",)


def run_folder_args(cfg: LoraTrainConfig) -> dict:
    """The keyword arguments of :func:`~workbench.run_folder.check_run` / ``open_run`` for ``cfg``'s run folder."""
    return training_run(cfg, "train lora", LORA_MAY_CHANGE, LORA_APPLIED)


def save_aligned_gated(model, source_meta: dict, info: dict, out: Path) -> Path:
    """Save the aligned gated adapter as ``out/adapter``: a gated-adapter folder that loads as ``--model
    out/adapter`` on the same base (:func:`~workbench.model.gated_lora.save_gated_adapter`), its
    ``workbench.json`` the source adapter's ``source_meta`` (base, fingerprint, conversion legs) plus
    ``drafter_alignment`` = ``info``. Written in ``out/adapter.partial`` and renamed (never half-written)."""
    from ..model.gated_lora import save_gated_adapter

    meta = {**source_meta, "drafter_alignment": info}
    dtype = getattr(torch, str(meta.get("adapter_dtype", "bfloat16")))        # the source adapter's precision
    return save_gated_adapter(model, out / "adapter", meta, dtype=dtype)


def main(argv: list[str]) -> int:
    """``workbench train lora --config <yaml> [--field value ...]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench train lora", LoraTrainConfig, argv)
    print(f"adapter saved to {train_lora(cfg)}")
    return 0


__all__ = ["LoraTrainConfig", "train_lora", "main"]
