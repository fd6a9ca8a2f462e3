"""NLD Fig. 8 on a collected store: train the 4-layer attention sampler and its MLP-only ablation (NLD App. A)
on a trajectory store, then compare the accuracy–TPF frontiers of the confidence and sampler policies on the same
held-out prompts (real-context mode), as the demo's sampler stage does on its small store.

Writes ``<out_dir>/sampler_attention``, ``sampler_mlp``, ``frontier_*.parquet`` / ``.png`` and ``summary.json``
(held-out AUCs against the top-1-probability baseline, the frontier comparison at matched agreement with the
serial target and with the real text, and the MLP ablation's frontier area). Example (issue 26 §3)::

    python scripts/sampler_frontier.py --store runs/smollm2_store/trajectories.zarr \\
        --model smollm2-135m-trimode --out_dir runs/smollm2_sampler
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.corpus import by_split, load_corpus
from workbench.demo.stages.sampler import frontier_stage, train_sampler_pair
from workbench.evaluation.harness import EvalConfig
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model
from workbench.sampler.policy import SAMPLER_FALLBACKS
from workbench.sampler.train import SamplerTrainConfig
from workbench.trajectories.store import store_block_length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--extra_stores", nargs="*", default=[],
                    help="more stores of the same model read with --store as one dataset (e.g. the hybrid "
                         "policy's, NLD App. A)")
    ap.add_argument("--model", required=True, help="the model the store was collected from")
    ap.add_argument("--out_dir", required=True)
    ap.add_argument("--block_length", type=int, default=None,
                    help="block length B of the store's rows (default: the one the store holds; NLD Fig. 8: 32)")
    ap.add_argument("--preset", default="default", help="sampler preset ('default': NLD App. A, d = 384)")
    ap.add_argument("--max_epochs", type=int, default=4)
    ap.add_argument("--max_steps", type=int, default=-1,
                    help="optimiser steps (-1: max_epochs decides): equal steps compare stores at fixed compute")
    ap.add_argument("--batch_size", type=int, default=256,
                    help="block states per optimiser step (at B = 32, 64 sees as many positions as 256 at B = 8)")
    ap.add_argument("--n_prompts", type=int, default=16, help="held-out (test split) prompts of the frontier")
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=64)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--fallback", default="confidence", choices=SAMPLER_FALLBACKS,
                    help="the sampler rule's one position when none reaches τ: the model's most confident "
                         "(serial decoding's choice) or the sampler's top one (the ablation)")
    args = ap.parse_args()
    args.block_length = store_block_length(args.store, args.block_length)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)

    base = SamplerTrainConfig(store=args.store, extra_stores=list(args.extra_stores), block_length=args.block_length,
                              preset=args.preset, batch_size=args.batch_size, lr=1e-3, warmup_steps=100,
                              max_epochs=args.max_epochs, max_steps=args.max_steps, patience=3, model=args.model,
                              num_workers=0, progress_bar=False, resume=True)
    samplers = train_sampler_pair(base, out)
    print(json.dumps(samplers), flush=True)

    model, tok, _ = load_model(args.model)
    model.eval()
    docs = by_split(load_corpus("stdlib"), "test")
    prompts = make_prompts(docs, args.n_prompts, args.prompt_len, args.gen_len, tok)
    ecfg = EvalConfig(model=args.model, n_prompts=args.n_prompts, prompt_len=args.prompt_len, gen_len=args.gen_len,
                      block_lengths=[args.block_length], modes=["real"], precision=args.precision,
                      batch_size=args.n_prompts, out_dir=str(out), progress_bar=False)
    fr = frontier_stage(model, tok, prompts, ecfg, samplers["attention"]["path"], args.block_length, out,
                        mlp_path=samplers["mlp"]["path"], fallback=args.fallback)
    summary = {"store": args.store, "extra_stores": args.extra_stores, "model": args.model, "fallback": args.fallback, "samplers": samplers,
               "frontier": {k: v for k, v in fr.items() if k != "summary"}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps(summary["frontier"], indent=2, default=str))


if __name__ == "__main__":
    main()
