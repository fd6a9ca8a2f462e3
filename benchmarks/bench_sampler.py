"""Sampler training throughput vs the store's streaming read throughput (NLD App. A sampler).

Writes a synthetic store (default 200k rows at B = 32, 32k vocabulary; rows from ``bench_store.synthetic_item``),
then measures, in this one run:

- ``read_rows_per_s``: block states (store rows) per second out of ``SamplerDataModule.train_dataloader()``
  alone (contiguous reads, split filter, shuffle buffer, 144-dim features);
- ``train_rows_per_s``: block states per second through the Lightning training loop (same loader, forward,
  masked BCE, backward, AdamW), timed after ``--warmup`` steps;

and prints one JSON line with both and ``read_over_train`` (> 1: training is not input-bound).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import synthetic_item  # noqa: E402

from workbench.sampler import SamplerNet, count_parameters, sampler_preset  # noqa: E402
from workbench.sampler.data import SamplerDataModule  # noqa: E402
from workbench.sampler.module import SamplerModule  # noqa: E402
from workbench.trajectories import ShardWriter, create_store  # noqa: E402
from workbench.trajectories.features import feature_spec  # noqa: E402


def write_store(path: Path, rows: int, B: int, vocab: int = 32000) -> int:
    attrs = {"model_fingerprint": "bench", "tokenizer_hash": "bench", "policy": "serial",
             "feature_spec": feature_spec(144), "categories": [str(i) for i in range(8)]}
    rng = np.random.default_rng(0)
    create_store(path, attrs, [B], token_pca=rng.standard_normal((vocab, 44)))
    n, item = 0, 0
    with ShardWriter(path, B) as w:
        while n < rows:
            r, t = synthetic_item(rng, B)
            w.append(item, r, t)
            n, item = n + len(r["traj"]), item + 1
    return n


class _Timer(pl.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.t0, self.rows = warmup, None, 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == self.warmup:
            self.t0, self.rows = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.t0 is not None:
            self.rows += len(batch["features"])
            self.t1 = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--block_length", type=int, default=32)
    ap.add_argument("--preset", default="micro")
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--read_batches", type=int, default=200, help="batches read in the read-only measurement")
    ap.add_argument("--num_workers", type=int, default=0)
    ap.add_argument("--accelerator", default="auto")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_sampler_"))
    try:
        t = time.perf_counter()
        n = write_store(tmp / "s.zarr", a.rows, a.block_length)
        write_s = time.perf_counter() - t
        dm = SamplerDataModule(tmp / "s.zarr", a.block_length, a.batch_size, num_workers=a.num_workers)
        loader, got, t = dm.train_dataloader(), 0, time.perf_counter()
        for i, b in enumerate(loader):
            got += len(b["features"])
            if i + 1 >= a.read_batches:
                break
        read = got / (time.perf_counter() - t)
        pl.seed_everything(0, verbose=False)
        net = SamplerNet(sampler_preset(a.preset))
        timer = _Timer(a.warmup)
        trainer = pl.Trainer(max_steps=a.warmup + a.steps, accelerator=a.accelerator, devices=1, logger=False,
                             callbacks=[timer], enable_checkpointing=False, enable_progress_bar=False,
                             limit_val_batches=0, enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(SamplerModule(net, total_steps=a.warmup + a.steps), datamodule=dm)
        train = timer.rows / (timer.t1 - timer.t0)
        print(json.dumps({"bench": "sampler_train_vs_read", "preset": a.preset, "params": count_parameters(net),
                          "block_length": a.block_length, "store_rows": n, "batch_size": a.batch_size,
                          "num_workers": a.num_workers, "torch_threads": torch.get_num_threads(),
                          "device": str(trainer.strategy.root_device), "store_write_s": round(write_s, 2),
                          "read_rows_per_s": round(read, 1), "train_rows_per_s": round(train, 1),
                          "read_over_train": round(read / train, 2)}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
