"""Lightning module of DEER alignment (arXiv:2512.15176 §3.1): Stage I or Stage II loss, metrics and logging.

The network is a plain :class:`~workbench.model.trimode.TriModeLM` (the drafter); this module draws spans
and noise (generators seeded by the global step, so a resumed run draws the same ones), builds the
``[context, SEP, x_t]`` inputs, and computes :func:`~workbench.deer.losses.deer_loss`.

Logged: ``train/loss``, ``train/masked_ce`` (unweighted CE on masked tokens), ``lr``; validation (same
fixed spans for both stages, so runs are comparable): ``val/loss`` (the stage's own loss),
``val/ce_block`` (CE over a fully masked block of ``val_draft_length`` tokens after a random cut) and
``val/accept_len``: the greedy acceptance ``a`` a one-step draft of that block would get against the teacher
answer at a uniformly drawn cut (exact per cut for greedy teacher data, whose answers *are* the target's
greedy continuation; capped by the answer's end); ``val/tau``: the τ of greedy decoding estimated as the
mean of ``a + 1`` (:func:`~workbench.deer.losses.greedy_tau_estimate`, exact when the drafter's errors are
memoryless along the answer).
"""
from __future__ import annotations

import pytorch_lightning as pl
import torch

from ..model.trimode import TriModeLM
from ..schedule import optimizer_config
from ..distributed import forward_index
from ..utils import step_generator
from .attention import draft_block_logits
from .batches import build_span_batch
from .losses import deer_loss, greedy_tau_estimate, leading_matches
from .masking import WEIGHTS, get_noise, get_spans, mask_span, stage1_spans


class DeerModule(pl.LightningModule):
    """Stage ``stage`` (1 or 2) training of ``drafter``.

    Args:
        drafter: the diffusion drafter.
        stage: 1 (Eq. 1–2) or 2 (Eq. 3–4). alpha: Stage II weight base (Eq. 3). r_max: Stage II max span.
        noise: 'uniform' (t ~ U(t_min, 1]) or 'full' (t = 1). t_min: lower end of t.
        sep_id, pad_id: separator and padding ids. max_context: context tokens kept (None: all).
        val_draft_length: block length of the simulated acceptance. lr, weight_decay, warmup_steps,
        max_steps, min_lr_ratio: AdamW with linear warm-up and cosine decay. seed: noise seed.
    """

    def __init__(self, drafter: TriModeLM, stage: int, sep_id: int, pad_id: int, alpha: float = 1.01,
                 r_max: int = 96, noise: str = "uniform", t_min: float = 1e-3, max_context: int | None = None,
                 val_draft_length: int = 16, lr: float = 1e-3, weight_decay: float = 0.01, warmup_steps: int = 50,
                 max_steps: int = 1000, min_lr_ratio: float = 0.1, seed: int = 0):
        super().__init__()
        self.drafter = drafter
        self.stage, self.alpha, self.r_max = stage, alpha, r_max
        self.spans, self.weights, self.noise = get_spans(stage), WEIGHTS[stage], get_noise(noise)
        self.t_min, self.sep_id, self.pad_id, self.max_context = t_min, sep_id, pad_id, max_context
        self.val_draft_length = val_draft_length
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.max_steps, self.min_lr_ratio, self.seed = max_steps, min_lr_ratio, seed

    def _span_logits(self, batch: dict, cut: torch.Tensor, end: torch.Tensor, masked_fn):
        sb = build_span_batch(batch["prompt"], batch["answer"], cut, end, self.pad_id, self.max_context)
        masked, weights = masked_fn(sb.span_valid)
        sb = sb.to(self.device)
        masked, weights = masked.to(self.device), weights.to(self.device)
        block, kv = sb.block_inputs(masked, self.sep_id, self.drafter.mask_token_id)
        logits = draft_block_logits(self.drafter, sb.context, block, kv)[:, 1:]
        return sb, logits, masked, weights

    def stage_loss(self, batch: dict, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The stage's loss on ``batch`` with spans and noise from ``g``: ``(loss, unweighted masked CE)``."""
        lens = torch.tensor([len(a) for a in batch["answer"]], dtype=torch.long)
        cut, end = self.spans(lens, g, self.r_max)
        t = self.noise(len(lens), self.t_min, g)

        def masked_fn(span_valid):
            return mask_span(span_valid, t, g), self.weights(t, span_valid, self.alpha)

        sb, logits, masked, weights = self._span_logits(batch, cut, end, masked_fn)
        loss = deer_loss(logits, sb.span, masked, weights, sb.span_valid)
        ce = deer_loss(logits, sb.span, masked, masked.float(), masked)
        return loss, ce

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        g = step_generator(self.seed, self.global_step, self.stage, forward_index(self, batch_idx))
        loss, ce = self.stage_loss(batch, g)
        n = len(batch["answer"])
        self.log_dict({"train/loss": loss, "train/masked_ce": ce}, prog_bar=True, batch_size=n)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        n = len(batch["answer"])
        loss, _ = self.stage_loss(batch, step_generator(self.seed, 10**9 + batch_idx, self.stage))
        lens = torch.tensor([len(a) for a in batch["answer"]], dtype=torch.long)
        cut, _ = stage1_spans(lens, step_generator(self.seed, 10**9 + batch_idx, 99))
        end = torch.minimum(cut + self.val_draft_length, lens)
        sb, logits, masked, _ = self._span_logits(batch, cut, end, lambda v: (v.clone(), v.float()))
        ce = deer_loss(logits, sb.span, masked, masked.float(), masked)
        acc = leading_matches(logits.argmax(-1), sb.span, sb.span_valid).float()
        # sync_dist: on several devices the validation rows are sharded; the logged values are the mean over ranks
        self.log_dict({"val/loss": loss, "val/ce_block": ce, "val/accept_len": acc.mean()}, batch_size=n,
                      sync_dist=True)
        self.log("val/tau", greedy_tau_estimate(acc), prog_bar=True, batch_size=n, sync_dist=True)

    def configure_optimizers(self):
        params = [p for p in self.drafter.parameters() if p.requires_grad]   # shared embedding/head are frozen
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=self.lr, betas=(0.9, 0.95))
        return optimizer_config(opt, self.warmup_steps, self.max_steps, self.min_lr_ratio)
