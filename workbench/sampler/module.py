"""Lightning module of sampler training (NLD App. A): BCE on masked positions, AdamW + warm-up + cosine,
and the early-stopping metric, validation AUC over masked positions of the held-out trajectory split.

The network is a plain :class:`~workbench.sampler.network.SamplerNet`; this module owns only the loss,
optimiser, metrics and logging. Logged: ``train/bce``, ``lr``, ``val/bce`` (mean over masked positions),
``val/auc`` (ROC AUC of the sampler probability vs the label) and ``val/auc_top1_prob`` (ROC AUC of the
top-1 probability alone on the same positions: the confidence-thresholding baseline), ``val/label_rate``.
"""
from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import torch

from ..schedule import optimizer_config
from .loss import masked_bce
from .network import SamplerNet


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """scikit-learn ROC AUC of ``scores`` (n,) against bool ``labels`` (n,); 0.5 when only one class is present."""
    from sklearn.metrics import roc_auc_score

    if len(labels) == 0 or labels.all() or not labels.any():
        return 0.5
    return float(roc_auc_score(labels, scores))


class SamplerModule(pl.LightningModule):
    """Trains ``net`` on batches of :class:`~workbench.sampler.data.SamplerDataModule`.

    Args:
        net: the sampler network.
        lr: peak AdamW learning rate; weight_decay: AdamW decay of matrices (not of biases / norms / embeddings).
        warmup_steps: linear warm-up; total_steps: cosine horizon (decays to ``min_lr_ratio · lr``).
    """

    def __init__(self, net: SamplerNet, lr: float = 1e-3, weight_decay: float = 0.01, warmup_steps: int = 100,
                 total_steps: int = 10_000, min_lr_ratio: float = 0.1):
        super().__init__()
        self.net = net
        self.lr, self.weight_decay, self.min_lr_ratio = lr, weight_decay, min_lr_ratio
        self.warmup_steps, self.total_steps = max(0, int(warmup_steps)), max(1, int(total_steps))
        self._val: list[tuple[np.ndarray, np.ndarray, np.ndarray, float, int]] = []
        #: Whether a validation saw labels of one class only (its val/auc is 0.5 by definition); the command reports
        #: it once, in one line, after the export (``metrics.json``'s ``single_class_validation``).
        self.single_class_validation = False

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = masked_bce(self.net(batch["features"]), batch["label"], batch["masked"])
        n = batch["features"].shape[0]
        self.log("train/bce", loss, prog_bar=True, batch_size=n)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self.net(batch["features"]).float()
        m = batch["masked"]
        n_masked = int(m.sum())
        bce = float(masked_bce(logits, batch["label"], m)) * n_masked
        self._val.append((torch.sigmoid(logits[m]).cpu().numpy(), batch["top1_prob"][m].float().cpu().numpy(),
                          batch["label"][m].cpu().numpy(), bce, n_masked))

    def on_validation_epoch_start(self) -> None:
        self._val = []

    def on_validation_epoch_end(self) -> None:
        parts = self._val
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, parts)
            parts = [p for g in gathered for p in g]
        self._val = []
        if not parts:
            return
        probs, top1, labels = (np.concatenate([p[i] for p in parts]) for i in range(3))
        n = sum(p[4] for p in parts)
        if n and (labels.all() or not labels.any()):
            self.single_class_validation = True
        self.log_dict({"val/auc": auc(probs, labels), "val/auc_top1_prob": auc(top1, labels),
                       "val/bce": sum(p[3] for p in parts) / max(1, n),
                       "val/label_rate": float(labels.mean()) if n else 0.0}, prog_bar=True, sync_dist=False)

    def configure_optimizers(self):
        decay = [p for p in self.net.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.net.parameters() if p.dim() < 2]
        pos = {id(self.net.pos.weight)}
        opt = torch.optim.AdamW([{"params": [p for p in decay if id(p) not in pos], "weight_decay": self.weight_decay},
                                 {"params": no_decay + [self.net.pos.weight], "weight_decay": 0.0}], lr=self.lr)
        return optimizer_config(opt, self.warmup_steps, self.total_steps, self.min_lr_ratio)
