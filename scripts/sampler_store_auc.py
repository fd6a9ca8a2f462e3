"""Held-out AUC of trained samplers on any store's rows: how well a sampler ranks "top-1 is the final token" on
states of another trajectory policy than the one it was trained on (NLD App. A collects two, serial and hybrid).

A serial store's states have exactly ``step`` positions committed at step ``step`` (one per forward), so its
``step / B`` and committed-fraction features are equal on every row; a parallel decoder's states are not. Scoring
a serial-trained sampler on the hybrid store's held-out prompts measures what that costs. Also splits the rows into
single-commit states (committed count = step) and multi-commit ones. Prints one JSON line per sampler::

    python scripts/sampler_store_auc.py --store runs/smollm2_store_hybrid/trajectories.zarr \\
        --samplers runs/smollm2_sampler_serial/sampler_attention/sampler runs/smollm2_sampler_mixed/sampler_attention/sampler
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from workbench.sampler.data import SamplerDataModule
from workbench.sampler.module import auc
from workbench.sampler.network import load_sampler
from workbench.trajectories.features import STAT_NAMES
from workbench.trajectories.store import StoreReader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--samplers", nargs="+", required=True, help="sampler directories (`workbench train sampler`)")
    ap.add_argument("--block_length", type=int, default=8)
    ap.add_argument("--val_fraction", type=float, default=0.1, help="the held-out prompts (as training holds out)")
    args = ap.parse_args()
    nets = {s: load_sampler(s)[0].eval() for s in args.samplers}
    spec = StoreReader(args.store, args.block_length).attrs["feature_spec"]
    dm = SamplerDataModule(args.store, args.block_length, batch_size=1024, feature_dim=spec["feature_dim"],
                           val_fraction=args.val_fraction)
    i_step = 3 * spec["pca_dim"] + STAT_NAMES.index("step_over_B")       # the step / B feature's column
    probs: dict[str, list] = {s: [] for s in nets}
    top1, labels, multi = [], [], []
    with torch.no_grad():
        for batch in dm.val_dataloader():
            m = batch["masked"]
            committed = (~m).sum(dim=1)                                   # (n,) positions committed so far
            step = torch.round(batch["features"][:, 0, i_step] * args.block_length).long()
            multi.append(np.repeat((committed != step).numpy(), m.sum(dim=1).numpy()))
            top1.append(batch["top1_prob"][m].numpy())
            labels.append(batch["label"][m].numpy())
            for s, net in nets.items():
                probs[s].append(torch.sigmoid(net(batch["features"]))[m].numpy())
    top1, labels, multi = np.concatenate(top1), np.concatenate(labels), np.concatenate(multi)
    for s in nets:
        p = np.concatenate(probs[s])
        out = {"store": args.store, "sampler": s, "positions": int(len(labels)), "label_rate": float(labels.mean()),
               "auc_sampler": auc(p, labels), "auc_top1_prob": auc(top1, labels),
               "multi_commit_share": float(multi.mean())}
        for name, sel in (("single_commit", ~multi), ("multi_commit", multi)):
            if sel.any() and 0 < labels[sel].mean() < 1:
                out[f"auc_sampler_{name}"] = auc(p[sel], labels[sel])
                out[f"auc_top1_prob_{name}"] = auc(top1[sel], labels[sel])
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
