"""``workbench train lm``: the tri-mode LM training run (NLD §2: joint AR + block-diffusion objective,
global loss averaging, two-stage schedule) as a Lightning module + a runner.

The network is a plain :class:`~workbench.model.trimode.TriModeLM`; :class:`TriModeLMModule` owns only
the loss, the stage schedule, metrics and logging.
"""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.accelerators import CPUAccelerator
from pytorch_lightning.callbacks import ModelCheckpoint

from ..data import LMDataModule
from ..distributed import BatchPlan, DeviceConfig, batch_plan, check_accelerator, make_trainer, resume_point
from ..trackers import TRACKER_SETTINGS, TrackerConfig, Trackers
from ..evaluation.metrics import whitespace_ids
from ..model.io import save_checkpoint
from ..model.load import load_model
from ..model.attention import check_attention_path, set_attention_path
from ..model.gated_lora import DEFAULT_TARGETS
from ..model.losses import AVERAGING, ar_loss, diffusion_loss, idlm_loss, joint_loss
from ..model.noise import NOISE_PER, mask_blocks
from ..model.presets import PRESETS, preset_config
from ..model.trimode import TriModeLM
from ..model.unlikelihood import repeated_ngram_mask, unlikelihood_loss
from ..speculative.accept import accepted_prefix_length
from ..tokenizer import MASK_ID, byte_tokenizer
from ..atomic import write_bytes, write_json
from ..run_folder import check_run, open_run, read_record, training_run, update_record
from ..utils import RunDirError, staged_dir, step_generator, write_run_config
from ..resume import (LogHistory, ResumeChanges, RngState, StopOnSignal, check_resume_state, check_trainable_state,
                      discard_stale_checkpoints, trainable_shapes)
from ..schedule import optimizer_config
from ..model.loading import ModelLoading


#: Training objectives of ``workbench train lm``.
OBJECTIVES = ("nld", "idlm")


@dataclass
class LMTrainConfig(DeviceConfig, ModelLoading, TrackerConfig):
    """Configuration of a tri-mode LM training run (every field settable from YAML or the command line).
    The device fields (``accelerator``, ``devices``, ``num_nodes``, ``strategy``, ``micro_batch_size``) come
    from :class:`~workbench.distributed.DeviceConfig`, the trackers (``logger``, ``mlflow_uri``, ``wandb_project``)
    from :class:`~workbench.trackers.TrackerConfig`; ``batch_size`` is the global batch."""

    logger: str | list[str] = "csv,tensorboard"
    """Experiment trackers: csv (always on), tensorboard, mlflow, wandb; a list or comma-separated
    (--logger csv,tensorboard,mlflow). A missing package is named with the pip extra that installs it."""

    preset: str = "tiny"
    """Model preset (micro, tiny, small) used when ``init_from`` is not given."""
    init_from: str | None = None
    """Start from this local Hugging Face checkpoint directory instead of a fresh preset."""
    add_mask_token: bool = False
    """With ``init_from``: add ``[MASK]`` to a tokenizer that has none (the embeddings are resized)."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    train_data: str | list[str] | None = None
    """Self-distillation: a ``workbench deer teacher`` folder, or a list of them, whose answers (the model's own
    continuations of train-split prompts) replace the corpus's train split; validation stays on the corpus.
    None: the corpus."""
    out_dir: str = "runs/train_lm"
    """Run directory: resolved config, logs, Lightning checkpoints and the final model in ``model/``."""
    seq_len: int = 256
    """Training window length in tokens (must be a multiple of every block length)."""
    batch_size: int = 16
    """Windows per optimiser step: the global batch, whatever the number of devices."""
    block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    """Block lengths B; one is drawn per batch so one checkpoint decodes at every B."""
    alpha: float = 0.3
    """Diffusion loss weight in stage 2 (NLD Eq. 3)."""
    stage1_steps: int = 4000
    """Stage 1 (α = 0, AR only) lasts this many optimiser steps; stage 2 (α = ``alpha``) follows."""
    max_steps: int = 8000
    """Total optimiser steps (the length of the learning-rate schedule and of the data stream)."""
    stop_at_step: int | None = None
    """End the run at this step although the schedule spans ``max_steps`` (reproduces a leg that its
    ``max_time`` limit stopped early; None: run to ``max_steps``)."""
    averaging: str = "global"
    """Loss averaging: 'global' (NLD Eq. 5) or 'sequence' (Eq. 4)."""
    t_min: float = 1e-3
    """Lower end of the noise level t ~ U(t_min, 1)."""
    noise_per: str = "sequence"
    """Training noise level draw: 'sequence' (one t per window, NLD Eq. 2) or 'block' (one t per block, the
    BD3-LM variant every shipped checkpoint was trained with). Validation always draws per block: the same
    expectation with less variance, comparable across legs."""
    lr: float = 1.5e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay floor as a fraction of ``lr``."""
    warmup_steps: int = 200
    """Linear warm-up steps."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip."""
    val_every: int = 500
    """Validate every this many optimiser steps."""
    val_windows: int = 64
    """Validation windows (held-out files)."""
    val_block_length: int = 16
    """Block length of the validation diffusion loss."""
    precision: str = "bf16-mixed"
    """Lightning precision: 'bf16-mixed' (autocast on CPU and GPU) or '32-true'."""
    log_every_n_steps: int = 10
    """Write the training metrics every this many optimiser steps."""
    attention: str = "dense"
    """Attention path (``workbench.model.attention``): 'dense' (additive float masks, the reference),
    'sdpa_bool' (PyTorch SDPA with boolean masks) or 'flex' (FlexAttention block masks; GPU)."""
    checkpoint_every: int = 250
    """Write ``checkpoints/last.ckpt`` every this many steps (resume point)."""
    resume: bool = True
    """Resume from ``out_dir/checkpoints/last.ckpt`` when it exists."""
    seed: int = 0
    """Seed for initialisation, data windows, block lengths and noise."""
    max_time: str | None = None
    """Optional wall-clock limit 'DD:HH:MM:SS' (training stops cleanly and can be resumed)."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""
    ul_prob: float = 0.0
    """Probability that a step is a sequence-level unlikelihood step instead of a joint-loss step
    (Welleck et al. 2020; 0 = the plain NLD recipe). See :func:`unlikelihood_step`."""
    ul_prefix_len: int = 128
    """Unlikelihood steps: tokens of each training window used as the prompt."""
    ul_gen_len: int = 128
    """Unlikelihood steps: tokens decoded AR-greedy after the prompt (prompt + generation must be a
    multiple of every block length)."""
    ul_ngram: int = 8
    """Unlikelihood steps: a generated token is penalised when it lies in a repeated n-gram of this length
    (whitespace tokens are never penalised)."""
    ul_weight: float = 1.0
    """Weight of the unlikelihood loss on unlikelihood steps."""
    objective: str = "nld"
    """'nld': joint AR + block-diffusion loss (NLD Eq. 1–5); 'idlm': I-DLM's all-masked, causal, logit-shifted
    loss with auto-balancing (I-DLM §3.1, Eq. 1–2; blocks = strides drawn from ``block_lengths``)."""
    idlm_clean_scale: float | None = None
    """I-DLM only: None balances the clean loss by Eq. 2's ŝ; a number fixes its scale (App. H.1: 0.2 in the
    first stride expansions of full training). Under a gated LoRA the clean loss is a constant either way."""
    lora_rank: int = 0
    """> 0: convert ``init_from`` with a per-token gated LoRA of this rank (I-DLM App. G) instead of training
    every weight: the base stays frozen, noisy / mask positions add the LoRA residual, clean positions are
    the base exactly. 0: full training."""
    lora_alpha: float | None = None
    """LoRA α (update scaled by α / r); None: 4 · ``lora_rank``, NLD's ratio (r = 128, α = 512)."""
    lora_targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    """Linear modules that get the gated LoRA (default: every attention and MLP projection)."""
    lora_init: str | None = None
    """Continue from this gated adapter folder (a previous leg's ``model/``) instead of a fresh LoRA; its
    rank and targets are used and its base fingerprint must match ``init_from``."""
    val_prompts: int = 0
    """Held-out prompts decoded at each validation with the self-speculative decoder of the objective (NLD:
    linear self-speculation, greedy, draft length ``val_draft_length``; I-DLM: ISD at stride ``val_draft_length``)
    to log ``val/tau``, the acceptance length (bonus token counted; for ISD its tokens per forward) and, for I-DLM,
    ``val/isd_accept``. 0: only the teacher-forced estimate ``val/tau_tf`` is logged."""
    val_draft_length: int = 8
    """Draft length k (NLD) or stride (I-DLM) of the validation acceptance."""
    val_gen_len: int = 64
    """Tokens decoded per validation prompt."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for an inconsistent configuration."""
        self.validate_devices()
        self.trackers()                             # an unknown or missing tracker, one line
        check_attention_path(self.attention)
        if self.init_from is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid: {', '.join(PRESETS)}")
        if self.averaging not in AVERAGING:
            raise ValueError(f"unknown loss averaging {self.averaging!r}; valid: {', '.join(AVERAGING)}")
        if self.idlm_clean_scale is not None and (self.idlm_clean_scale < 0 or self.objective != "idlm"):
            raise ValueError(f"idlm_clean_scale must be ≥ 0 (or null for Eq. 2's auto-balance) and needs objective "
                             f"idlm; got {self.idlm_clean_scale} with objective {self.objective}")
        if self.noise_per not in NOISE_PER:
            raise ValueError(f"unknown noise_per {self.noise_per!r}; valid: {', '.join(NOISE_PER)}")
        if not self.block_lengths:
            raise ValueError("block_lengths is empty; every training batch draws its block length from it: give at "
                             "least one, e.g. [4, 8, 16, 32]")
        if self.lora_rank and not self.lora_targets:
            raise ValueError("lora_targets is empty, so the gated LoRA would adapt nothing; name at least one module, "
                             "e.g. [q_proj, v_proj]")
        for b in [*self.block_lengths, self.val_block_length]:
            if b <= 0 or self.seq_len % b:
                raise ValueError(f"block length {b} must be positive and divide seq_len {self.seq_len}")
        if self.stop_at_step is not None and not 0 < self.stop_at_step <= self.max_steps:
            raise ValueError(f"stop_at_step ({self.stop_at_step}) must lie in (0, max_steps={self.max_steps}]")
        if not 0 <= self.stage1_steps <= self.max_steps:
            raise ValueError(f"stage1_steps ({self.stage1_steps}) must lie in [0, max_steps={self.max_steps}]")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be ≥ 0, got {self.lora_rank}")
        if self.lora_rank and not self.init_from:
            raise ValueError("a gated LoRA (lora_rank > 0) converts a pretrained model: give --init_from")
        if self.lora_rank and self.ul_prob > 0:
            raise ValueError("unlikelihood steps train the AR pathway, which a gated LoRA keeps frozen; "
                             "set ul_prob 0 or lora_rank 0")
        for name in ("seq_len", "batch_size", "max_steps", "val_every", "val_windows", "checkpoint_every",
                     "log_every_n_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("warmup_steps, weight_decay and grad_clip must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.val_prompts < 0 or self.val_draft_length < 1 or self.val_gen_len < 1:
            raise ValueError("val_prompts must be ≥ 0, val_draft_length and val_gen_len ≥ 1")
        if self.ul_weight < 0:
            raise ValueError(f"ul_weight must be ≥ 0, got {self.ul_weight}")
        if not 0.0 <= self.ul_prob <= 1.0:
            raise ValueError(f"ul_prob must lie in [0, 1], got {self.ul_prob}")
        if self.ul_prob > 0:
            ul_len = self.ul_prefix_len + self.ul_gen_len
            if not (1 <= self.ul_prefix_len <= self.seq_len and 1 <= self.ul_ngram <= self.ul_gen_len):
                raise ValueError(f"unlikelihood steps need 1 ≤ ul_prefix_len ≤ seq_len ({self.seq_len}) and "
                                 f"ul_gen_len ≥ ul_ngram ≥ 1; got {self.ul_prefix_len}, {self.ul_gen_len}, "
                                 f"{self.ul_ngram}")
            for b in self.block_lengths:
                if ul_len % b:
                    raise ValueError(f"block length {b} must divide ul_prefix_len + ul_gen_len = {ul_len}")


class TriModeLMModule(pl.LightningModule):
    """Loss, two-stage schedule, metrics and logging for a :class:`TriModeLM`.

    Stage 1 (step < ``stage1_steps``): α = 0, a plain causal forward (AR loss only, half the compute of
    the dual stream). Stage 2: the dual-stream forward with ``L_AR + α L_diff`` and a block length drawn
    per batch from ``block_lengths``. With ``ul_prob > 0`` a step is, with that probability, a
    sequence-level unlikelihood step instead (:func:`unlikelihood_step`). Block length, noise and the step
    kind come from generators seeded by the global step, so a resumed run draws the same ones.

    With a gated LoRA (``lora_rank > 0``) the clean stream is the frozen base: the AR loss is a constant and
    is skipped, and each step is :meth:`gated_step`. ``objective: idlm`` trains I-DLM's loss instead of NLD's.

    ``val_prompts`` are ``(prompt ids, real continuation ids)`` pairs for the decoded validation acceptance.

    **Several devices.** ``plan`` (:func:`~workbench.distributed.batch_plan`) says how a step's global batch of
    ``G`` windows is split over ranks and accumulation steps. The noise is drawn for all ``G`` windows from the
    step's generator and each forward takes its own windows' rows (:meth:`shard_noise`), and the diffusion
    loss is normalised by the global batch's count of masked tokens (Eq. 5) or sequences (Eq. 4). With DDP's
    gradient averaging and Lightning's accumulation, the step's gradient is then the one-device gradient
    (``tests/test_distributed.py``). The AR term needs nothing: every window has the same number of targets.
    Not sharded exactly: I-DLM's ŝ (estimated per forward) and unlikelihood steps (noise drawn per forward).
    """

    def __init__(self, model: TriModeLM, cfg: LMTrainConfig, whitespace: frozenset[int] = frozenset(),
                 val_prompts: list[tuple[list[int], list[int]]] | None = None, plan: BatchPlan | None = None):
        super().__init__()
        self.model, self.cfg, self.whitespace = model, cfg, whitespace
        self.val_prompts = val_prompts or []
        self.plan = plan or batch_plan(cfg.batch_size, 1)
        self.shards = self.plan.world * self.plan.accumulate    # forwards per optimiser step, all ranks
        self.sync = self.plan.world > 1                          # logged values: mean over ranks
        # a gated run checkpoints only what trains (the frozen base comes from init_from)
        self.strict_loading = not (model is not None and model.gated)

    def alpha_at(self, step: int) -> float:
        return 0.0 if step < self.cfg.stage1_steps else self.cfg.alpha

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.model.gated:
            trainable = trainable_shapes(self)
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.model.gated:            # loaded non-strictly: a checkpoint of another setup would load nothing
            check_trainable_state(checkpoint.get("state_dict"), trainable_shapes(self),
                                  getattr(self._trainer, "ckpt_path", None))

    def shard_noise(self, batch: torch.Tensor, rows: torch.Tensor, b: int, g: torch.Generator):
        """NLD's block noise (:func:`~workbench.model.noise.mask_blocks`) drawn from ``g`` for the step's whole
        global batch ``(G, L)``, of which ``batch`` ``(N, L)`` holds rows ``rows`` ``(N,)``: each window gets
        the noise it gets on one device. Returns ``(noisy, masked, t, total_masked)``; ``total_masked``
        ``(G, L)`` is None when this forward is the whole step (one device, no accumulation)."""
        template = torch.zeros(self.plan.global_batch, batch.shape[1], dtype=batch.dtype)
        _, masked_all, t_all = mask_blocks(template, b, self.model.mask_token_id, self.cfg.t_min, g,
                                           per=self.cfg.noise_per)
        idx = rows.cpu()
        masked, t = masked_all[idx].to(batch.device), t_all[idx].to(batch.device)
        noisy = torch.where(masked, torch.full_like(batch, self.model.mask_token_id), batch)
        return noisy, masked, t, (masked_all.to(batch.device) if self.shards > 1 else None)

    def diffusion_share(self, logits, batch, masked, t, total_masked) -> torch.Tensor:
        """NLD Eq. 2 with Eq. 4/5 averaging over the step's global batch, scaled by the number of forwards per
        step so that DDP's mean over ranks and Lightning's mean over accumulation steps give the global
        batch's loss (and gradient) exactly. On one device without accumulation: :func:`diffusion_loss`."""
        l_diff = diffusion_loss(logits, batch, masked, t, averaging=self.cfg.averaging, total_masked=total_masked)
        return l_diff * self.shards if total_masked is not None else l_diff

    def step_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows, inside the current step's global batch, of the windows with stream indices ``index`` ``(N,)``
        (:class:`~workbench.data.LMDataModule`: step ``s`` holds windows ``s·G … (s+1)·G − 1``)."""
        rows = index - self.global_step * self.plan.global_batch
        if bool((rows < 0).any() or (rows >= self.plan.global_batch).any()):
            raise RuntimeError(f"step {self.global_step} received windows {index.tolist()} outside its global batch "
                               f"of {self.plan.global_batch}; the data stream and the step counter disagree")
        return rows

    def gated_step(self, batch: torch.Tensor, g: torch.Generator,
                   rows: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """One step of a gated-LoRA conversion: the clean stream through the frozen base without gradient, the
        noisy stream with the adapter (:meth:`~workbench.model.trimode.TriModeLM.noisy_stream_logits`).

        * ``nld``: NLD's block-diffusion loss (Eq. 2, 1/t weights, block length drawn per batch); ``L_AR`` of
          the frozen base is constant and skipped.
        * ``idlm``: noisy stream all [MASK], causal inside each stride-sized block (App. E), logits shifted;
          ``L = L_mask + ŝ · L_clean`` (Eq. 2) with ``L_clean`` the frozen base's constant AR loss, so only
          ``L_mask`` trains.

        Returns ``(loss, logs)``.
        """
        b = draw_block_length(self.cfg.block_lengths, g)
        if self.cfg.objective == "idlm":
            noisy = torch.full_like(batch, self.model.mask_token_id)
            clean_logits, noisy_logits = self.model.noisy_stream_logits(batch, noisy, b, causal_in_block=True)
            loss, l_mask, l_clean = idlm_loss(noisy_logits, clean_logits, batch,
                                                clean_scale=self.cfg.idlm_clean_scale)
            return loss, {"train/mask_loss": l_mask, "train/clean_loss": l_clean, "train/block_length": float(b)}
        rows = torch.arange(batch.shape[0]) if rows is None else rows
        noisy, masked, t, total = self.shard_noise(batch, rows, b, g)
        _, noisy_logits = self.model.noisy_stream_logits(batch, noisy, b)
        l_diff = self.diffusion_share(noisy_logits, batch, masked, t, total)
        return l_diff, {"train/diff_loss": l_diff, "train/block_length": float(b)}

    def is_unlikelihood_step(self, step: int) -> bool:
        """Whether optimiser step ``step`` is an unlikelihood step (probability ``ul_prob``, seeded by the step)."""
        p = self.cfg.ul_prob
        return p > 0 and float(torch.rand(1, generator=step_generator(self.cfg.seed, step, 3))) < p

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        batch, index = batch                        # (N, L) windows and their stream indices (N,)
        step = self.global_step
        alpha = self.alpha_at(step)
        rows = self.step_rows(index)
        if self.model.gated:
            loss, logs = self.gated_step(batch, step_generator(self.cfg.seed, step, 1), rows)
        elif self.cfg.objective == "idlm":
            g = step_generator(self.cfg.seed, step, 1)
            b = draw_block_length(self.cfg.block_lengths, g)
            clean_logits, noisy_logits = self.model.dual_stream_logits(
                batch, torch.full_like(batch, self.model.mask_token_id), b, causal_in_block=True)
            loss, l_mask, l_clean = idlm_loss(noisy_logits, clean_logits, batch,
                                                clean_scale=self.cfg.idlm_clean_scale)
            logs = {"train/mask_loss": l_mask, "train/clean_loss": l_clean, "train/block_length": float(b)}
        elif self.is_unlikelihood_step(step):
            loss, logs = unlikelihood_step(self.model, batch, self.cfg, step_generator(self.cfg.seed, step, 4),
                                           self.whitespace)
        elif alpha == 0.0:
            loss = l_ar = ar_loss(self.model.causal_logits(batch), batch, averaging=self.cfg.averaging)
            logs = {"train/ar_loss": l_ar, "train/stage": 1.0}
        else:
            g = step_generator(self.cfg.seed, step, 1)
            b = draw_block_length(self.cfg.block_lengths, g)
            noisy, masked, t, total = self.shard_noise(batch, rows, b, g)
            ar_logits, diff_logits = self.model.dual_stream_logits(batch, noisy, b)
            l_ar = ar_loss(ar_logits, batch, averaging=self.cfg.averaging)
            l_diff = self.diffusion_share(diff_logits, batch, masked, t, total)
            loss = joint_loss(l_ar, l_diff, alpha)
            logs = {"train/ar_loss": l_ar, "train/diff_loss": l_diff, "train/stage": 2.0, "train/block_length": float(b)}
        self.log_step({**logs, "train/loss": loss}, rows)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def log_step(self, logs: dict, rows: torch.Tensor) -> None:
        """Log a step's training metrics once per optimiser step: the mean over its accumulation forwards (each
        forward's values are summed here and logged at the step's last forward) and over ranks
        (``sync_dist``), so the logged loss is the global batch's whatever the devices and accumulation."""
        a = self.plan.accumulate
        if a == 1:                                  # the values as they are: no host sync on the hot path
            self.log_dict(logs, prog_bar=True, sync_dist=self.sync)
            return
        values = {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in logs.items()}
        micro = self.plan.micro_step(self.global_rank, int(rows[0]))
        acc = self._step_logs = {} if micro == 0 else self._step_logs
        for k, v in values.items():
            acc[k] = acc.get(k, 0.0) + v / a
        if micro == a - 1:
            self.log_dict(dict(acc), prog_bar=True, sync_dist=self.sync)

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        b = self.cfg.val_block_length
        n = batch.shape[0]
        if self.cfg.objective == "idlm":
            noisy = torch.full_like(batch, self.model.mask_token_id)
            if self.model.gated:
                ar_logits, noisy_logits = self.model.noisy_stream_logits(batch, noisy, b, causal_in_block=True)
            else:
                ar_logits, noisy_logits = self.model.dual_stream_logits(batch, noisy, b, causal_in_block=True)
            _, l_mask, l_ar = idlm_loss(noisy_logits, ar_logits, batch)
            tau = teacher_forced_tau(noisy_logits, ar_logits, b, shifted=True)
            self.log_dict({"val/ar_loss": l_ar, "val/mask_loss": l_mask, "val/tau_tf": tau}, batch_size=n,
                          prog_bar=True, sync_dist=self.sync)
            return
        g = step_generator(self.cfg.seed, 10**9 + batch_idx, 2)
        noisy, masked, t = mask_blocks(batch, b, self.model.mask_token_id, self.cfg.t_min, g)
        # the clean half of the dual stream is the plain causal forward (tests/test_masks.py)
        if self.model.gated:
            ar_logits, diff_logits = self.model.noisy_stream_logits(batch, noisy, b)
        else:
            ar_logits, diff_logits = self.model.dual_stream_logits(batch, noisy, b)
        l_ar = ar_loss(ar_logits, batch)
        l_diff = diffusion_loss(diff_logits, batch, masked, t)
        # unweighted masked-token cross-entropy: the easiest diffusion number to read
        ce = diffusion_loss(diff_logits, batch, masked, torch.ones_like(t))
        # fully masked blocks: how many drafts greedy verification would accept on the real text
        full = torch.full_like(batch, self.model.mask_token_id)
        if self.model.gated:
            _, full_logits = self.model.noisy_stream_logits(batch, full, b)
        else:
            _, full_logits = self.model.dual_stream_logits(batch, full, b)
        tau = teacher_forced_tau(full_logits, ar_logits, b, shifted=False)
        self.log_dict({"val/ar_loss": l_ar, "val/diff_loss": l_diff, "val/diff_ce": ce, "val/tau_tf": tau},
                      batch_size=n, prog_bar=True, sync_dist=self.sync)

    def on_validation_epoch_end(self) -> None:
        """Decode the held-out prompts with the objective's self-speculative decoder, greedy, at draft length /
        stride ``val_draft_length``, and log ``val/tau``: tokens per cycle (bonus token counted). NLD: linear
        self-speculation (two forwards per cycle); I-DLM: ISD (one forward per step, so ``val/tau`` is its TPF),
        plus ``val/isd_accept``, accepted over verified proposals pooled over the slots (Algorithm 1)."""
        if not self.val_prompts:
            return
        precision = "bf16" if "bf16" in str(self.cfg.precision) else "fp32"
        prompts = [p for p, _ in self.val_prompts]
        if self.cfg.objective == "idlm":
            from ..idlm.isd import isd_decode

            res = isd_decode(self.model, prompts, self.cfg.val_gen_len, self.cfg.val_draft_length, precision=precision)
            if res.acceptance_rate == res.acceptance_rate:           # pooled over slots; NaN: none verified
                self.log("val/isd_accept", res.acceptance_rate, batch_size=len(prompts))
        else:
            from ..speculative.linear import linear_self_speculation

            res = linear_self_speculation(self.model, prompts, self.cfg.val_gen_len, self.cfg.val_draft_length,
                                          precision=precision)
        cycles = sum(len(c) for c in res.committed_per_step)
        tokens = sum(len(t) for t in res.tokens)
        self.log("val/tau", tokens / max(1, cycles), prog_bar=True, batch_size=len(prompts))

    def configure_optimizers(self):
        decay = [p for n, p in self.model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in self.model.named_parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.cfg.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.cfg.lr, betas=(0.9, 0.95))
        return optimizer_config(opt, self.cfg.warmup_steps, self.cfg.max_steps, self.cfg.min_lr_ratio)


def teacher_forced_tau(draft_logits: torch.Tensor, ar_logits: torch.Tensor, block_length: int,
                       shifted: bool) -> torch.Tensor:
    """Teacher-forced acceptance length of fully masked blocks on real text (a cheap validation estimate).

    For each block, the drafts are the argmax of ``draft_logits`` ``(N, L, V)`` at its positions and the
    verifier's tokens the argmax of the clean stream's AR logits ``ar_logits`` ``(N, L, V)`` for the same
    targets: ``shifted=False`` (NLD, diffusion logits at ``i`` predict token ``i``, AR logits at ``i − 1``) or
    ``shifted=True`` (I-DLM, both predict token ``i + 1``). Greedy verification accepts the longest agreeing
    prefix ``a`` of the block; the estimate is the mean of ``a + 1`` (bonus token counted) over blocks, with
    the first block (no clean context) skipped. Returns a scalar tensor (tokens per cycle), at most
    ``block_length``: with ``shifted=True`` only the block's first ``block_length − 1`` predictions are drafts,
    as ISD at stride ``N = block_length`` proposes ``N − 1`` tokens (I-DLM Alg. 1: "N − 1 masks produce N
    tokens"), so the estimate compares with ``val/tau`` at ``val_draft_length = val_block_length``.
    """
    draft = draft_logits.argmax(-1)
    ver = ar_logits.argmax(-1)
    if not shifted:                                     # the verifier's token for position i comes from i - 1
        ver = torch.cat([torch.full_like(ver[:, :1], -1), ver[:, :-1]], dim=1)
    n, length = draft.shape
    blocks = length // block_length
    agree = (draft[:, : blocks * block_length] == ver[:, : blocks * block_length]).view(n, blocks, block_length)
    if shifted:
        agree = agree[..., : block_length - 1]
    accepted = accepted_prefix_length(agree)[:, 1:]                      # (N, blocks - 1)
    return (accepted.float() + 1).mean()


def draw_block_length(block_lengths: list[int], g: torch.Generator) -> int:
    """The block length of a training batch, uniform over ``block_lengths`` (one draw from ``g``), so that
    one checkpoint decodes at every B."""
    return block_lengths[int(torch.randint(len(block_lengths), (1,), generator=g))]


def unlikelihood_step(model: TriModeLM, batch: torch.Tensor, cfg: LMTrainConfig, g: torch.Generator,
                      whitespace: frozenset[int] = frozenset()) -> tuple[torch.Tensor, dict[str, float]]:
    """One sequence-level unlikelihood step (Welleck et al. 2020) on both streams of the dual forward.

    The first ``ul_prefix_len`` tokens of each window ``(N, seq_len)`` prompt an AR-greedy continuation of
    ``ul_gen_len`` tokens (no gradient, KV cache, under the caller's autocast). Generated tokens inside a
    repeated ``ul_ngram``-gram, except ``whitespace`` ids, are the candidates. One dual-stream forward over
    ``[prompt | continuation]`` (block length and noise drawn from ``g``) gives the AR logits, whose
    unlikelihood is taken at the candidates, and the diffusion logits, whose unlikelihood is taken at
    candidates that are masked; each is averaged over the continuation tokens it could score.

    Returns ``(loss, logs)`` with ``loss = ul_weight · (UL_AR + UL_diff)``.
    """
    from ..decoding.ar import ar_decode

    p, gl = cfg.ul_prefix_len, cfg.ul_gen_len
    prompts = batch[:, :p]
    # precision 'fp32' adds no autocast of its own: inside Lightning the run's autocast (bf16-mixed) applies
    gen = torch.tensor(ar_decode(model, prompts.tolist(), gl, precision="fp32").tokens, device=batch.device)
    seq = torch.cat([prompts, gen], dim=1)                                    # (N, p + gl)
    cont = torch.zeros_like(seq, dtype=torch.bool)
    cont[:, p:] = True                                                        # continuation positions
    cand = torch.zeros_like(cont)
    cand[:, p:] = repeated_ngram_mask(gen, cfg.ul_ngram, whitespace)
    b = draw_block_length(cfg.block_lengths, g)
    noisy, masked, _ = mask_blocks(seq, b, model.mask_token_id, cfg.t_min, g, per=cfg.noise_per)
    ar_logits, diff_logits = model.dual_stream_logits(seq, noisy, b)
    # AR logits at i score token i + 1
    ul_ar = unlikelihood_loss(ar_logits[:, :-1], seq[:, 1:], cand[:, 1:], cont[:, 1:])
    ul_diff = unlikelihood_loss(diff_logits, seq, cand & masked, cont & masked)
    logs = {"train/ul_ar": float(ul_ar.detach()), "train/ul_diff": float(ul_diff.detach()),
            "train/block_length": float(b), "train/ul_repeat_share": float(cand[:, p:].float().mean())}
    return cfg.ul_weight * (ul_ar + ul_diff), logs


#: Settings of a ``train lm`` run that a resume may change (the others are refused by name,
#: :mod:`workbench.run_folder`): how it runs, when it stops, validates and checkpoints.
LM_MAY_CHANGE = ("stop_at_step", "val_every", "checkpoint_every", "attention", *TRACKER_SETTINGS)
#: Settings a resume applies to the rest of the run (:class:`~workbench.resume.ResumeChanges`).
LM_APPLIED = ("lr",)
#: What a run folder written before ``noise_per`` existed drew: one noise level per block.
LM_LEGACY_DEFAULTS = {"noise_per": "block"}


def run_folder_args(cfg: LMTrainConfig) -> dict:
    """The keyword arguments of :func:`~workbench.run_folder.check_run` / ``open_run`` for ``cfg``'s run folder."""
    return training_run(cfg, "train lm", LM_MAY_CHANGE, LM_APPLIED, legacy_defaults=LM_LEGACY_DEFAULTS)


def build_model(cfg: LMTrainConfig):
    """The :class:`TriModeLM` and tokenizer a run starts from (fresh preset or ``init_from``), in train mode.

    ``load_checkpoint`` returns an inference model in eval mode; Lightning keeps module modes as given, so
    a continuation leg is switched back to train mode here.
    """
    if cfg.init_from and cfg.lora_rank:
        return build_gated_model(cfg)
    if cfg.init_from:
        model, tok, _ = load_model(cfg.init_from, add_mask_token=cfg.add_mask_token)
        return model.train(), tok
    from transformers import LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    return TriModeLM(LlamaForCausalLM(preset_config(cfg.preset)), MASK_ID), byte_tokenizer()


def build_gated_model(cfg: LMTrainConfig):
    """The pretrained ``init_from`` with a mask token added (if its tokenizer has none; the new embedding row is
    the mean row) and a fresh gated LoRA (seeded by ``cfg.seed``), in train mode. The base's weights
    fingerprint, taken before the mask row is added, is kept as ``model.base_fingerprint``."""
    from ..model.fingerprint import weights_fingerprint
    from ..model.gated_lora import attach_gated_lora
    from ..model.io import add_embedding_rows
    from ..tokenizer import require_mask_token

    base, tok, _ = load_model(cfg.init_from)
    fingerprint = weights_fingerprint(base)
    if cfg.lora_init:                       # a later leg: the adapter adds its own mask row and checks the base
        from ..model.load import attach_adapter

        model, tok = attach_adapter(base, tok, cfg.lora_init, trainable=True)
    else:
        mask_id = require_mask_token(tok, add=True)
        if mask_id >= base.backbone.get_input_embeddings().num_embeddings:
            add_embedding_rows(base.backbone, len(tok))
        model = TriModeLM(base.backbone, mask_id)
        torch.manual_seed(cfg.seed)
        attach_gated_lora(model, cfg.lora_rank, cfg.lora_alpha or 4.0 * cfg.lora_rank, tuple(cfg.lora_targets))
    model.base_fingerprint = fingerprint
    return model.train(), tok


def train_lm(cfg: LMTrainConfig) -> Path:
    """Run (or resume) a training run; returns the final model directory ``out_dir/model``.

    Raises ``ValueError`` for an inconsistent config, :class:`~workbench.utils.RunDirError` for an
    unwritable run directory, :class:`~workbench.corpus.CorpusError` for an empty corpus.
    """
    # everything that can be refused is checked before anything is written
    cfg.validate()
    check_accelerator(cfg.accelerator, cfg.devices, cfg.strategy)   # no GPU here: before the model is built
    check_run(**run_folder_args(cfg))           # another kind, changed settings, a store; rank 0 only
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    model, tok = build_model(cfg)
    set_attention_path(model, cfg.attention)
    ctx = int(getattr(model.backbone.config, "max_position_embeddings", 0) or 0)
    if ctx and cfg.seq_len > ctx:
        raise ValueError(f"seq_len {cfg.seq_len} exceeds the model context ({ctx} tokens); use --seq_len <= {ctx}")
    from .. import tokenizer as _t

    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=cfg.checkpoint_every,
                           save_top_k=0, save_on_train_epoch_end=False)
    stop = StopOnSignal(ckpt_dir / "last.ckpt")
    trackers = Trackers(cfg, out, "train lm", resuming=bool(cfg.resume) and (ckpt_dir / "last.ckpt").exists())
    # the trainer (devices, global-batch rule) is checked before the run directory is written
    trainer, plan = make_trainer(
        cfg, cfg.batch_size, max_steps=cfg.stop_at_step or cfg.max_steps, precision=cfg.precision,
        gradient_clip_val=cfg.grad_clip, val_check_steps=cfg.val_every, logger=trackers.loggers,
        callbacks=[ckpt, RngState(), stop, ResumeChanges(lr=cfg.lr), *trackers.callbacks],
        enable_progress_bar=cfg.progress_bar,
        log_every_n_steps=cfg.log_every_n_steps, max_time=cfg.max_time)
    if cfg.attention == "flex" and isinstance(trainer.accelerator, CPUAccelerator):
        raise ValueError("the flex attention path trains on GPUs only (PyTorch has no FlexAttention backward on "
                         "CPU); use --attention dense or sdpa_bool here")
    data = LMDataModule(cfg.corpus, cfg.seq_len, cfg.batch_size, train_windows=cfg.max_steps * cfg.batch_size,
                        val_windows=cfg.val_windows, seed=cfg.seed,
                        tokenizer=None if _t.is_byte_tokenizer(tok) else tok, train_data=cfg.train_data,
                        per_device_batch=plan.per_device)
    data.setup()                                # an empty corpus or split fails here, before the run directory
    last, resuming = resume_point(ckpt_dir, cfg.resume, plan)     # same accumulation, or a one-line refusal
    if resuming and model.gated:        # the module holds the model as .model
        check_resume_state(last, trainable_shapes(model, "model."))
    with open_run(**run_folder_args(cfg)) as folder:             # the run record first, the folder locked
        return _fit_and_save(cfg, folder, model, tok, trainer, plan, data, last if resuming else None, stop, trackers)


def _fit_and_save(cfg: LMTrainConfig, folder, model, tok, trainer, plan, data, last: Path | None, stop,
                  trackers: Trackers) -> Path:
    """Train in the open run ``folder`` (resuming from ``last``) and save the model, metrics and log (rank 0)."""
    out = write_run_config(folder.path, asdict(cfg))
    resuming = last is not None
    if not resuming:
        discard_stale_checkpoints(out / "checkpoints")
    whitespace = frozenset(whitespace_ids(tok, model.backbone.config.vocab_size)) if cfg.ul_prob > 0 else frozenset()
    module = TriModeLMModule(model, cfg, whitespace, validation_prompts(cfg, tok), plan)
    log_csv = out / "logs" / "version_0" / "metrics.csv"
    history = LogHistory(log_csv, last if resuming else None)      # the log survives any number of interruptions
    history.before_fit()
    trackers.start(trainer, asdict(cfg))
    t0 = time.time()
    try:
        with stop.armed("training"):              # Ctrl-C / SIGTERM: a checkpoint, one line, exit 130 / 143
            trainer.fit(module, datamodule=data, ckpt_path=str(last) if resuming else None)
    finally:
        trackers.finish()
    wall = time.time() - t0
    if not trainer.is_global_zero:                # rank 0 writes the model, metrics and log
        return out / "model"
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    meta = {"preset": cfg.preset if not cfg.init_from else None, "init_from": cfg.init_from,
            "block_lengths": list(cfg.block_lengths), "train_config": asdict(cfg), "objective": cfg.objective,
            "global_step": trainer.global_step, "final_metrics": metrics,
            "resumes": (read_record(folder.path) or {}).get("resumes", [])}
    history.after_fit()
    if model.gated:
        from ..model.gated_lora import save_gated_adapter

        save_gated_adapter(model, out / "model", {**meta, "base_fingerprint": model.base_fingerprint})
        if log_csv.exists():
            write_bytes(out / "model" / "training_log.csv", log_csv.read_bytes())
    else:
        with staged_dir(out / "model") as tmp:
            save_checkpoint(model, tok, tmp, meta)
            if log_csv.exists():
                shutil.copy(log_csv, tmp / "training_log.csv")
    write_json(out / "metrics.json", {"global_step": trainer.global_step, "wall_s_this_run": wall, **metrics})
    update_record(folder, finished=trainer.global_step >= (cfg.stop_at_step or cfg.max_steps))
    return out / "model"


def validation_prompts(cfg: LMTrainConfig, tok) -> list[tuple[list[int], list[int]]]:
    """``cfg.val_prompts`` held-out (prompt, real continuation) pairs from the validation split for the decoded
    validation acceptance (prompts of up to 128 tokens; :func:`~workbench.evaluation.prompts.make_prompts`)."""
    if not cfg.val_prompts:
        return []
    from ..corpus import by_split, load_corpus
    from ..evaluation.prompts import make_prompts

    docs = by_split(load_corpus(cfg.corpus), "validation")
    ps = make_prompts(docs, cfg.val_prompts, 128, cfg.val_gen_len, tok)
    return [(list(p.prompt), list(p.real)) for p in ps]


__all__ = ["LMTrainConfig", "TriModeLMModule", "train_lm", "build_model", "unlikelihood_step", "RunDirError"]


def main(argv: list[str]) -> int:
    """``workbench train lm --config <yaml> [--field value ...]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench train lm", LMTrainConfig, argv)
    print(f"model saved to {train_lm(cfg)}")
    return 0
