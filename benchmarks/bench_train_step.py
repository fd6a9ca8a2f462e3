"""Lightning training step time vs a plain PyTorch loop on the same model and batches.

Both run the stage-2 dual-stream step (NLD Fig. 3 forward, L_AR + 0.3 L_diff, AdamW, grad clip,
bf16 autocast) on identical batches; the timed window excludes the first ``--warmup`` steps.
Target (issue 2): Lightning / plain ≤ 1.10. Prints one JSON line with both times and the ratio.
"""
from __future__ import annotations

import argparse
import json
import time

import pytorch_lightning as pl
import torch
from transformers import LlamaForCausalLM

from workbench.model.losses import ar_loss, diffusion_loss, joint_loss
from workbench.model.noise import mask_blocks
from workbench.model.presets import preset_config
from workbench.model.trimode import TriModeLM
from workbench.tokenizer import MASK_ID
from workbench.train.lm import LMTrainConfig, TriModeLMModule


class _Timer(pl.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.t0, self.t1 = warmup, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.t1 = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (a.batch, a.seq), generator=g) for _ in range(a.steps)]
    cfg = LMTrainConfig(preset=a.preset, seq_len=a.seq, batch_size=a.batch, stage1_steps=0, max_steps=a.steps,
                        block_lengths=[16], warmup_steps=1)

    def fresh():
        torch.manual_seed(0)
        return TriModeLM(LlamaForCausalLM(preset_config(a.preset)), MASK_ID)

    # plain PyTorch loop: the same module's optimiser + schedule, the same noise generators
    model = fresh()
    module = TriModeLMModule(model, cfg)
    opt_cfg = module.configure_optimizers()
    opt, sched = opt_cfg["optimizer"], opt_cfg["lr_scheduler"]["scheduler"]
    from workbench.train.lm import draw_block_length
    from workbench.utils import step_generator

    for i, x in enumerate(batches):
        if i == a.warmup:
            t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            gen = step_generator(cfg.seed, i, 1)             # the draws TriModeLMModule.training_step makes
            b = draw_block_length(cfg.block_lengths, gen)
            noisy, masked, t = mask_blocks(x, b, MASK_ID, cfg.t_min, gen)
            ar_l, d_l = model.dual_stream_logits(x, noisy, b)
            loss = joint_loss(ar_loss(ar_l, x), diffusion_loss(d_l, x, masked, t), cfg.alpha)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    plain = (time.perf_counter() - t0) / (a.steps - a.warmup)

    timer = _Timer(a.warmup)
    module = TriModeLMModule(fresh(), cfg)
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, precision="bf16-mixed", gradient_clip_val=cfg.grad_clip,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[timer], num_sanity_val_steps=0, limit_val_batches=0)
    # training items are (windows, stream indices) pairs (workbench.data.LMDataModule)
    items = [(x, torch.arange(i * a.batch, (i + 1) * a.batch)) for i, x in enumerate(batches)]
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(items, batch_size=None))
    light = (timer.t1 - timer.t0) / (a.steps - a.warmup)
    print(json.dumps({"benchmark": "train_step", "preset": a.preset, "batch": a.batch, "seq_len": a.seq,
                      "threads": torch.get_num_threads(), "plain_s_per_step": round(plain, 4),
                      "lightning_s_per_step": round(light, 4), "ratio_lightning_over_plain": round(light / plain, 3),
                      "target": "<= 1.10"}))


if __name__ == "__main__":
    main()
