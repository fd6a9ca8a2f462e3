"""Lightning module of LoRA drafter alignment (NLD §3.3, Eq. 6–9, Fig. 11).

The network is a plain :class:`~workbench.model.trimode.TriModeLM` whose backbone carries a peft LoRA
adapter (:func:`~workbench.drafter.lora.add_lora`); this module owns only the loss, the metrics, the
optimiser and logging. One training step = one draft–verify cycle per row (:func:`~workbench.drafter.draft.draft_and_verify`)
after a prefix cut from the row's window, then the selected loss variant on the active positions.

Validation metrics (greedy drafts, adapter on; verifier with the adapter off):

* ``val/accepted_greedy``: mean number of draft tokens accepted by greedy verification (0..k);
* ``val/tau_greedy`` = accepted + 1: the acceptance length τ of one linear self-speculation cycle
  (tokens emitted per cycle, DEER/EAGLE convention) — the checkpoint selection metric;
* ``val/tau_expected`` = ``1 + Σ_{j=1..k} Π_{i≤j} α_i`` with ``α_i = Σ_v min(p_i(v), q_i(v))`` at
  temperature 1 on the full vocabulary, ``p_i``, ``q_i`` computed on the greedy draft's context: the
  expected emitted tokens per cycle under the speculative-sampling rule at ``T = 1`` (approximation:
  contexts are the greedy draft's);
* ``val/alpha``: mean ``α_j`` of the training loss's support and temperature over the active positions.
"""
from __future__ import annotations

import pytorch_lightning as pl
import torch

from ..speculative import greedy_accept
from ..schedule import optimizer_config
from ..distributed import forward_index
from ..resume import check_trainable_state, trainable_shapes
from ..utils import step_generator
from .draft import draft_and_verify, left_pad_prefixes
from .losses import active_mask, block_mean, combine, expected_accepted, position_terms


class LoraDrafterModule(pl.LightningModule):
    """Loss, metrics and optimiser of LoRA drafter training.

    Args:
        model: TriModeLM with a peft LoRA backbone (only the LoRA matrices require grad).
        cfg: a :class:`~workbench.drafter.train.LoraTrainConfig` (loss name and hyper-parameters, draft
            length ``k``, sampling share, optimiser settings).
        pad_id: token id used for left padding.
        adapter_kind: 'new' (a peft LoRA added for the run) or 'gated' (the model's own gated adapter); saved
            in every checkpoint with a new LoRA's rank and target modules, so that a resume with another
            adapter setup is refused before anything is written
            (:func:`~workbench.drafter.train.check_resume_adapter`).

    Checkpoints hold only the trainable (LoRA) tensors; the frozen base weights come from ``init_from``.
    """

    def __init__(self, model, cfg, pad_id: int = 0, adapter_kind: str = "new"):
        super().__init__()
        self.model, self.cfg, self.pad_id, self.adapter_kind = model, cfg, pad_id, adapter_kind
        self.strict_loading = False
        self.validations: list[dict] = []
        """Metrics of every validation during fit: ``{"step": global_step, "val/...": value}`` (kept in checkpoints)."""

    # ------------------------------------------------------------------ helpers
    def _loss_hparams(self) -> dict:
        c = self.cfg
        return dict(tau=c.tau, top_k=c.top_k, eta=c.eta, ce_tau=c.ce_tau)

    def _prefixes(self, batch: dict, g: torch.Generator | None):
        ids, lo, hi = batch["ids"], batch["lo"], batch["hi"]
        if g is None:
            lengths = lo
        else:
            u = torch.rand(ids.shape[0], generator=g).to(ids.device)
            lengths = lo + (u * (hi - lo + 1).to(u.dtype)).long().clamp_max(hi - lo)
        return left_pad_prefixes(ids, lengths, self.pad_id)

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        c = self.cfg
        g = step_generator(c.seed, self.global_step, 1, forward_index(self, batch_idx))
        prefix, valid = self._prefixes(batch, g)
        sample_rows = (torch.rand(prefix.shape[0], generator=g) < c.sample_fraction).to(prefix.device)
        cyc = draft_and_verify(self.model, prefix, valid, c.draft_length, sample_rows, c.draft_temperature, g)
        active = active_mask(cyc.draft, cyc.verifier_logits)
        terms = position_terms(cyc.draft_logits, cyc.verifier_logits[:, :-1], **self._loss_hparams())
        loss = combine(c.loss, terms, active, lambda_kl=c.lambda_kl, lambda_ce=c.lambda_ce)
        n = prefix.shape[0]
        self.log_dict({"train/loss": loss, "train/alpha": block_mean(terms.alpha.detach(), active),
                       "train/kl": block_mean(terms.kl.detach(), active),
                       "train/active": active.float().sum(-1).mean()}, prog_bar=True, batch_size=n)
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=n)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        c = self.cfg
        prefix, valid = self._prefixes(batch, None)
        cyc = draft_and_verify(self.model, prefix, valid, c.draft_length, grad=False)
        accepted = greedy_accept(cyc.draft, cyc.verifier_logits).accepted.float()
        vlog = cyc.verifier_logits[:, :-1]
        active = active_mask(cyc.draft, cyc.verifier_logits)
        terms = position_terms(cyc.draft_logits, vlog, **self._loss_hparams())
        full = position_terms(cyc.draft_logits, vlog, tau=1.0, top_k=vlog.shape[-1])
        n = prefix.shape[0]
        metrics = {"val/accepted_greedy": accepted.mean(), "val/tau_greedy": accepted.mean() + 1.0,
                   "val/tau_expected": expected_accepted(full.alpha).mean() + 1.0,
                   "val/alpha": block_mean(terms.alpha, active),
                   "val/loss": combine(c.loss, terms, active, lambda_kl=c.lambda_kl, lambda_ce=c.lambda_ce)}
        self.log_dict(metrics, prog_bar=True, batch_size=n, sync_dist=True)   # sharded validation: mean over ranks
        for k, v in metrics.items():                 # batch-size-weighted sums for the history (over ranks at the end)
            self._val_sums[k] = self._val_sums.get(k, 0.0) + float(v) * n
        self._val_rows += n

    def on_validation_epoch_start(self) -> None:
        self._val_sums, self._val_rows = {}, 0

    def on_validation_epoch_end(self) -> None:
        from pytorch_lightning.trainer.states import TrainerFn

        if self.trainer.state.fn != TrainerFn.FITTING or self.trainer.sanity_checking:
            return
        keys = sorted(self._val_sums)
        sums = torch.tensor([self._val_sums[k] for k in keys] + [float(self._val_rows)], dtype=torch.float64)
        if self.trainer.world_size > 1:             # sharded validation: the sums over every rank's rows
            sums = self.trainer.strategy.reduce(sums.to(self.device), reduce_op="sum").cpu()
        if sums[-1] > 0:
            self.validations.append({"step": int(self.global_step),
                                     **{k: float(v / sums[-1]) for k, v in zip(keys, sums[:-1])}})

    # ------------------------------------------------------------------ optimiser and checkpoints
    def configure_optimizers(self):
        c = self.cfg
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=c.weight_decay, betas=(0.9, 0.99))
        return optimizer_config(opt, c.warmup_steps, c.max_steps, c.min_lr_ratio)

    def trainable_state_dict(self) -> dict:
        """The LoRA tensors only (module state-dict names)."""
        keep = trainable_shapes(self.model, "model.")
        return {k: v for k, v in self.state_dict().items() if k in keep}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["state_dict"] = self.trainable_state_dict()
        checkpoint["drafter_validations"] = list(self.validations)
        checkpoint["drafter_adapter"] = self.adapter_kind
        if self.adapter_kind == "new":
            checkpoint["drafter_lora"] = {"rank": self.cfg.rank, "target_modules": list(self.cfg.target_modules)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # loaded non-strictly (the frozen base comes from init_from): a checkpoint of another adapter setup
        # would load nothing, so its tensor names must be this run's
        check_trainable_state(checkpoint.get("state_dict"), trainable_shapes(self.model, "model."),
                              getattr(self._trainer, "ckpt_path", None))
        self.validations = list(checkpoint.get("drafter_validations", []))
