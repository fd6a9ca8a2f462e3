"""Held-out AUC of trained samplers on any store's rows: how well a sampler ranks "top-1 is the final token" on
states of another trajectory policy than the one it was trained on (NLD App. A collects two, serial and hybrid).

A serial store's states have exactly ``step`` positions committed at step ``step`` (one per forward), so its
``step / B`` and committed-fraction features are equal on every row; a parallel decoder's states are not. Scoring
a serial-trained sampler on the hybrid store's held-out prompts measures what that costs. Also splits the rows into
single-commit states (committed count = step) and multi-commit ones. Per block state it also counts what a
threshold on each score commits before its first wrong token (:func:`~workbench.sampler.ranking.safe_prefix`),
against the oracle's count of correct positions (:func:`~workbench.sampler.ranking.oracle_commits`), and how often
each score's top-ranked position is correct (the one position a step commits at a high threshold). The per-state
prefix assumes the best threshold for each state; one global threshold, as the decoders use, also needs scores that
compare across states (:func:`~workbench.sampler.ranking.threshold_commits`): ``global_commits`` gives the most
tokens a state commits at each per-token error rate in ``--error_levels`` (the offline counterpart of TPF at matched
agreement, NLD Fig. 8), the forced commit taken by the top-1 probability as the sampler policy does. For each sampler,
``global_commits_ratio`` is its ``global_commits`` ÷ the top-1 probability's at each level, with a 90 % interval
from ``--bootstrap`` resamples of the held-out prompts (all of a prompt's states together; both scores on the same
resample). Prints one JSON line per score (the top-1 probability first, then each sampler)::

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
from workbench.sampler.ranking import commits_at_error_rate, oracle_commits, safe_prefix, threshold_commits
from workbench.trajectories.features import STAT_NAMES
from workbench.trajectories.store import StoreReader, store_block_length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--samplers", nargs="*", default=[],
                    help="sampler directories (`workbench train sampler`); none: the top-1 probability alone")
    ap.add_argument("--block_length", type=int, default=None,
                    help="block length B of the store's rows (default: the one the store holds; NLD Fig. 8: 32)")
    ap.add_argument("--val_fraction", type=float, default=0.1, help="the held-out prompts (as training holds out)")
    ap.add_argument("--split_by", default="prompt", choices=["prompt", "document"],
                    help="held-out unit, as the samplers were trained (`train sampler --split_by`)")
    ap.add_argument("--error_levels", type=float, nargs="*", default=[0.001, 0.0025, 0.005, 0.01, 0.02, 0.05],
                    help="per-token error rates (wrong ÷ committed) at which to report the global-threshold commits")
    ap.add_argument("--n_thresholds", type=int, default=200, help="thresholds per score: quantiles of its values")
    ap.add_argument("--bootstrap", type=int, default=1000, help="prompt resamples for the ratios' intervals (0: none)")
    args = ap.parse_args()
    args.block_length = store_block_length(args.store, args.block_length)
    nets = {s: load_sampler(s)[0].eval() for s in args.samplers}
    spec = StoreReader(args.store, args.block_length).attrs["feature_spec"]
    dm = SamplerDataModule(args.store, args.block_length, batch_size=1024, feature_dim=spec["feature_dim"],
                           val_fraction=args.val_fraction, split_by=args.split_by)
    i_step = 3 * spec["pca_dim"] + STAT_NAMES.index("step_over_B")       # the step / B feature's column
    names = ["top1_prob", *nets]
    position_scores: dict[str, list] = {s: [] for s in names}             # per masked position
    prefix: dict[str, list] = {s: [] for s in names}                      # per block state with a masked position
    labels, multi, oracle = [], [], []
    states: dict[str, list] = {s: [] for s in (*names, "label", "masked")}    # per live block state, (n, B)
    state_rows = []                                                       # per live block state, its store row
    with torch.no_grad():
        for batch in dm.val_dataloader():
            m, y = batch["masked"], batch["label"]
            committed = (~m).sum(dim=1)                                   # (n,) positions committed so far
            step = torch.round(batch["features"][:, 0, i_step] * args.block_length).long()
            multi.append(np.repeat((committed != step).numpy(), m.sum(dim=1).numpy()))
            labels.append(y[m].numpy())
            live = m.any(dim=1)
            oracle.append(oracle_commits(y, m)[live].numpy())
            # sampler logits, not probabilities: a float32 sigmoid saturates to 1.0 and would tie the top positions
            scores = {"top1_prob": batch["top1_prob"], **{s: net(batch["features"]) for s, net in nets.items()}}
            for s, score in scores.items():
                position_scores[s].append(score[m].numpy())
                prefix[s].append(safe_prefix(score, y, m)[live].numpy())
                states[s].append(score[live].float())
            states["label"].append(y[live])
            states["masked"].append(m[live])
            state_rows.append(batch["row"][live].numpy())
    labels, multi, oracle = np.concatenate(labels), np.concatenate(multi), np.concatenate(oracle)
    st = {k: torch.cat(v) for k, v in states.items()}
    q = np.linspace(0.0, 1.0, args.n_thresholds)
    prompt_of_state = _prompt_of_rows(args.store, args.block_length, np.concatenate(state_rows))
    n_prompts = len(np.unique(prompt_of_state))
    resamples = _prompt_resamples(prompt_of_state, args.bootstrap)       # (n_boot, states) weights, drawn once
    conf_frontiers = None                      # confidence's on each resample: names[0], so computed first
    for s in names:
        p, pre = np.concatenate(position_scores[s]), np.concatenate(prefix[s])
        taus = np.unique(np.quantile(p, q))                           # thresholds in the score's own units
        commits, errors = threshold_commits(st[s], st["label"], st["masked"], taus, fallback=st["top1_prob"])
        frontiers = [commits_at_error_rate(commits, errors, args.error_levels, w) for w in [None, *resamples]]
        out = {"store": args.store, "block_length": args.block_length, "score": s, "positions": int(len(labels)),
               "label_rate": float(labels.mean()), "auc": auc(p, labels),
               "multi_commit_share": float(multi.mean()), "states": int(len(oracle)),
               "oracle_commits_mean": float(oracle.mean()), "safe_prefix_mean": float(pre.mean()),
               "top_rank_correct": float((pre > 0).mean()),
               "global_commits": dict(zip(map(str, args.error_levels), frontiers[0]))}
        for name, sel in (("single_commit", ~multi), ("multi_commit", multi)):
            if sel.any() and 0 < labels[sel].mean() < 1:
                out[f"auc_{name}"] = auc(p[sel], labels[sel])
        if s == "top1_prob":
            conf_frontiers = frontiers
        else:
            out["global_commits_ratio"] = _ratio_with_interval(frontiers, conf_frontiers, args.error_levels, n_prompts)
        print(json.dumps(out), flush=True)


def _prompt_of_rows(store: str, block_length: int, rows: np.ndarray) -> np.ndarray:
    """The prompt id of each global store row ``(n,)``, from the store's trajectory table."""
    df = StoreReader(store, block_length).trajectories().sort_values("row_start")
    start, end = df["row_start"].to_numpy(), df["row_end"].to_numpy()
    i = np.searchsorted(start, rows, side="right") - 1
    if (i < 0).any() or (rows >= end[i]).any():
        raise ValueError("a held-out row lies in no trajectory of the store")
    return df["prompt_id"].to_numpy()[i]


def _prompt_resamples(prompts: np.ndarray, n_boot: int, seed: int = 0) -> list[torch.Tensor]:
    """``n_boot`` bootstrap resamples of the prompts (with replacement), as per-state weights ``(states,)``: each
    state counts as often as its prompt was drawn, so all of a prompt's states move together."""
    ids, inverse = np.unique(prompts, return_inverse=True)
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)))[inverse].astype(np.float64))
            for _ in range(n_boot)]


def _ratio_with_interval(sampler: list, confidence: list, levels: list[float], n_prompts: int) -> dict[str, dict]:
    """Per error level: the sampler's global-threshold commits ÷ confidence's on all held-out states (the first
    frontier of each list), and the 5th / 50th / 95th percentiles of that ratio over the resamples (the others,
    the same resamples for both scores)."""
    ratios = np.array([[x / y if x is not None and y else np.nan for x, y in zip(a, b)]
                       for a, b in zip(sampler, confidence)]).reshape(len(sampler), len(levels))
    out = {}
    for j, level in enumerate(levels):
        boot = ratios[1:, j]
        lo, mid, hi = np.nanpercentile(boot, [5, 50, 95]) if np.isfinite(boot).any() else (None, None, None)
        out[str(level)] = {"ratio": ratios[0, j], "p05": lo, "p50": mid, "p95": hi, "prompts": n_prompts}
    return out


if __name__ == "__main__":
    main()
