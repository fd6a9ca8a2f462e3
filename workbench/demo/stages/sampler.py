"""Demo stage: the sampler (NLD §3.2, §6.1, App. A): train the attention sampler and the MLP-only
ablation on the demo's trajectory store, the AUC table against the top-1-probability baseline, the
accuracy–TPF frontiers of the confidence and sampler policies on the same held-out prompts, and a short
Optuna threshold sweep."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ...evaluation.frontier import compare_frontiers, plot_frontiers
from ...evaluation.harness import EvalConfig, evaluate_model, summarize
from ...evaluation.report import fmt, markdown_table

from ..config import DemoConfig

#: The frontier's thresholds, four per policy over the same span (confidence's 0.7 and 0.9 are the evaluation
#: sweep's decodes, reused): each other one is a real-context decode of the held-out prompts.
CONF_THRESHOLDS = [0.5, 0.7, 0.9, 0.99]
SAMPLER_THRESHOLDS = [0.5, 0.9, 0.97, 0.998]


def train_demo_samplers(store: str, block_length: int, run: Path, model_spec: str, epochs: int, max_steps: int,
                        progress_bar: bool) -> dict:
    """Train the attention sampler and the MLP-only ablation (same width, depth and data), demo-sized."""
    from ...sampler.train import SamplerTrainConfig

    base = SamplerTrainConfig(store=store, block_length=block_length, preset="default", d_model=128, heads=4,
                              batch_size=256, lr=1e-3, warmup_steps=50, max_epochs=epochs, max_steps=max_steps,
                              patience=3, progress_bar=progress_bar, model=model_spec, num_workers=0, resume=False)
    return train_sampler_pair(base, run)


def train_sampler_pair(base, run: Path) -> dict:
    """Train ``base`` (a :class:`~workbench.sampler.train.SamplerTrainConfig`) as the attention sampler and as the
    MLP-only ablation (NLD App. A) in ``run/sampler_attention`` and ``run/sampler_mlp``. Returns per kind the
    sampler path, best held-out AUC, the top-1-probability AUC, row counts, steps, wall time and parameters."""
    from ...sampler.train import train_sampler

    out = {}
    for kind in ("attention", "mlp"):
        d = run / f"sampler_{kind}"
        path = train_sampler(replace(base, kind=kind, out_dir=str(d)))
        m = json.loads((d / "metrics.json").read_text())
        out[kind] = {"path": str(path), "best_val_auc": m["best_val_auc"], "auc_top1_prob": m.get("val/auc_top1_prob"),
                     "n_train_rows": m["n_train_rows"], "n_val_rows": m["n_val_rows"], "global_step": m["global_step"],
                     "wall_s": m["wall_s_this_run"],
                     "parameters": _n_params(path)}
    return out


def _n_params(path) -> int:
    from ...sampler.network import count_parameters, load_sampler

    return count_parameters(load_sampler(path)[0])


def frontier_stage(model, tok, prompts, ecfg: EvalConfig, sampler_path: str, block_length: int, run: Path,
                   decode_cache: dict | None = None, mlp_path: str | None = None, fallback: str = "confidence") -> dict:
    """Confidence vs sampler threshold sweeps at ``block_length`` (real-context mode) on ``prompts``; runs the
    main sweep already decoded are taken from ``decode_cache`` (see :func:`evaluate_model`). With ``mlp_path``
    the MLP-only ablation is decoded on the same prompts and thresholds and scored as NLD App. A does: by the
    area under its accuracy–TPF frontier against the attention sampler's (same TPF range). ``fallback`` is the
    sampler rule's one-position fallback (:data:`~workbench.sampler.policy.SAMPLER_FALLBACKS`)."""
    from ...evaluation.frontier import area_under_front, common_tpf_range, pareto_front
    from ...sampler.policy import LoadedSampler

    sampler = LoadedSampler.load(sampler_path, model.device)
    runs = [("real", "ar_greedy", block_length, None), ("real", "serial", block_length, None)]
    runs += [("real", "confidence", block_length, t) for t in CONF_THRESHOLDS]
    runs += [("real", "sampler", block_length, t) for t in SAMPLER_THRESHOLDS]
    cfg = replace(ecfg, block_lengths=[block_length], modes=["real"])
    df = evaluate_model(model, tok, prompts, cfg, runs=runs, policy_kwargs={"sampler": {"sampler": sampler, "fallback": fallback}},
                        decode_cache=decode_cache)
    df.to_parquet(run / "frontier_results.parquet", index=False)
    s = summarize(df)
    s.to_parquet(run / "frontier_summary.parquet", index=False)
    out = {}
    for acc in ("agree_serial", "token_acc"):
        pts = {p: s[s["policy"] == p].rename(columns={acc: "accuracy"})[["tpf", "accuracy", "threshold", "tpf_real"]]
               for p in ("confidence", "sampler")}
        plot_frontiers(pts["confidence"], pts["sampler"], run / f"frontier_{acc}.png", title=f"B = {block_length}, "
                       f"real-context, accuracy = {acc}")
        out[acc] = compare_frontiers(pts["confidence"], pts["sampler"])
    if mlp_path:
        mlp_runs = [r for r in runs if r[1] != "confidence"]
        dm = evaluate_model(model, tok, prompts, cfg, runs=mlp_runs,
                            policy_kwargs={"sampler": {"sampler": LoadedSampler.load(mlp_path, model.device),
                                                     "fallback": fallback}},
                            decode_cache=decode_cache)
        dm.to_parquet(run / "frontier_results_mlp.parquet", index=False)
        sm = summarize(dm)
        for acc in ("agree_serial", "token_acc"):
            fa = pareto_front(s[s["policy"] == "sampler"].rename(columns={acc: "accuracy"}))
            fm = pareto_front(sm[sm["policy"] == "sampler"].rename(columns={acc: "accuracy"}))
            lo, hi = common_tpf_range(fa, fm)
            out[acc]["area_attention"] = area_under_front(fa, lo, hi)
            out[acc]["area_mlp"] = area_under_front(fm, lo, hi)
            out[acc]["area_mlp_range"] = [lo, hi]
    samp = df[df["policy"] == "sampler"]
    out["sampler_s_per_step"] = float(samp["sampler_s_per_step"].mean())
    out["forward_s_per_step"] = float(samp["forward_s_per_step"].mean())
    out["summary"] = s.to_dict(orient="records")
    return out


def sweep_stage(model_spec: str, sampler_path: str, run: Path, corpus: str, block_length: int, n_trials: int,
                precision: str) -> dict:
    """A short Optuna threshold sweep of the sampler policy (SQLite storage in the run directory)."""
    from ...tune.sweep import SweepConfig, run_sweep

    cfg = SweepConfig(model=model_spec, policy="sampler", sampler=sampler_path, out_dir=str(run / "sweep"),
                      n_trials=n_trials, threshold_low=0.05, threshold_high=0.99, block_lengths=[block_length],
                      corpus=corpus, n_prompts=8, gen_len=64, precision=precision, study="demo-sampler-threshold")
    return run_sweep(cfg)


def section(st: dict, block_length: int) -> list[str]:
    """Markdown for the report."""
    s, fr = st["samplers"], st["frontier"]
    a, m = s["attention"], s["mlp"]
    lines = ["## Confidence sampler (NLD App. A)", "",
             f"Trained on the demo store (B = {block_length}, {a['n_train_rows']} training and {a['n_val_rows']} "
             "held-out block-steps; held-out = whole prompts): BCE on masked positions, early stopping on "
             "held-out AUC.", "",
             "| classifier of 'top-1 is the final token' (masked positions) | held-out AUC |", "|---|---|",
             f"| attention sampler (4 layers, d = 128, {fmt(a.get('parameters'))} parameters) | {fmt(a['best_val_auc'])} |",
             f"| MLP-only ablation (same width and depth, no attention) | {fmt(m['best_val_auc'])} |",
             f"| top-1 probability (the confidence policy's score) | {fmt(a['auc_top1_prob'])} |", ""]
    beats = a["best_val_auc"] is not None and a["best_val_auc"] > max(m["best_val_auc"] or 0, a["auc_top1_prob"] or 0)
    lines += [f"The attention sampler {'beats' if beats else 'does NOT beat'} both on this classifier AUC.", ""]
    if "area_mlp" in fr.get("agree_serial", {}):
        lines += ["MLP-only ablation scored as NLD App. A does: area under the accuracy–TPF frontier (mean accuracy "
                  "over the common TPF range, same prompts and thresholds; NLD reports the MLP 10 points lower):", "",
                  "| accuracy | TPF range | attention sampler | MLP-only | difference |", "|---|---|---|---|---|"]
        for acc in ("agree_serial", "token_acc"):
            c = fr[acc]
            lines.append(f"| {acc} | [1, {c['area_mlp_range'][1]:.2f}] | {fmt(c['area_attention'])} | "
                         f"{fmt(c['area_mlp'])} | {fmt(c['area_attention'] - c['area_mlp'])} |")
        lines.append("")
    else:
        lines += ["The MLP-only ablation's frontier (NLD App. A scores it by the area under that frontier) was not "
                  "decoded in this run, only its AUC above: `--sampler_mlp_frontier true` adds it.", ""]
    for acc in ("agree_serial", "token_acc"):
        c = fr[acc]
        lines += [f"### Frontier: {acc.replace('_', ' ')} vs TPF (B = {block_length}, real-context)", "",
                  f"![frontier](frontier_{acc}.png)", "",
                  "| confidence τ | accuracy | tpf confidence | tpf sampler at that accuracy | ratio |", "|---|---|---|---|---|"]
        for r in c["matched_accuracy"]:
            lines.append(f"| {fmt(r['threshold_confidence'], 2)} | {fmt(r['accuracy'])} | {fmt(r['tpf_confidence'])} | "
                         f"{fmt(r['tpf_sampler'])} | {fmt(r['tpf_ratio'])} |")
        lines += ["", f"Median TPF ratio sampler / confidence at matched accuracy: **{fmt(c['median_tpf_ratio'])}** "
                  f"(NLD's anchor: 1.3×). Area under the frontier (mean accuracy over TPF ∈ [1, {c['area_range'][1]:.2f}]): "
                  f"confidence {fmt(c['area_confidence'])}, sampler {fmt(c['area_sampler'])}.", ""]
    lines += [f"Sampler cost per decoding step (features + sampler forward): {fr['sampler_s_per_step'] * 1e3:.2f} ms "
              f"vs {fr['forward_s_per_step'] * 1e3:.2f} ms per backbone forward "
              f"({fr['sampler_s_per_step'] / max(fr['forward_s_per_step'], 1e-12):.1%}).", ""]
    if st.get("sweep"):
        sw = st["sweep"]
        lines += ["### Optuna threshold sweep (sampler policy)", "",
                  f"Study `{sw['study']}` ({sw['trials_after']} trials, TPE, SQLite storage `sweep/optuna.db`; rerun to resume):", "",
                  "![pareto](sweep/pareto.png)", "",
                  markdown_table(pd.DataFrame(sw["pareto"]), ["threshold", "tpf", "agree_serial"]), ""]
    return lines


__all__ = ["train_demo_samplers", "train_sampler_pair", "frontier_stage", "sweep_stage", "section", "run"]


def run(cfg: DemoConfig, model_spec, model, tok, prompts, ecfg, run: Path, decode_cache: dict) -> dict:
    store = str(run / "trajectories.zarr") if cfg.store is None else cfg.store
    b = cfg.sampler_block_length
    samplers = train_demo_samplers(store, b, run, str(model_spec), cfg.sampler_epochs, cfg.sampler_max_steps,
                                   cfg.progress_bar)
    fr = frontier_stage(model, tok, prompts, ecfg, samplers["attention"]["path"], b, run, decode_cache,
                        samplers["mlp"]["path"] if cfg.sampler_mlp_frontier else None)
    sw = sweep_stage(str(model_spec), samplers["attention"]["path"], run, cfg.corpus, b, cfg.sweep_trials,
                     cfg.precision) if cfg.sweep_trials > 0 else None
    return {"samplers": samplers, "frontier": fr, "sweep": sw}
