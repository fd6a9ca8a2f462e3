"""``workbench demo``: the main job, its stages run in order.

On a fresh machine with no arguments it prepares the standard-library corpus, loads the shipped ``tiny`` model,
measures its held-out loss against the unigram baseline, evaluates AR mode and diffusion mode at several
thresholds and block lengths in both context modes, then runs the stages of :mod:`.stages` (trajectory
collection, sampler, LoRA drafter, SOL, DEER) and writes a run directory with the resolved config, metrics,
Parquet results, plots and a ``report.md``. ``--retrain`` first reproduces the shipped model (:mod:`workbench.demo.retrain`).
"""
from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd
import torch

from ..corpus import by_split, load_corpus
from ..data import encode_documents
from ..decoding.base import resolve_precision
from ..evaluation.harness import EvalConfig, check_sweep_fits, evaluate_model, summarize
from ..evaluation.heldout import heldout_losses, unigram_cross_entropy
from ..evaluation.metrics import known_words
from ..evaluation.prompts import make_prompts
from ..evaluation.report import fmt, plot_accuracy_vs_tpf, plot_training_curves
from ..model.load import load_model, resolve_device
from ..tokenizer import is_byte_tokenizer
from ..utils import staged_dir
from .config import TARGETS, DemoConfig, check_stage_options, resolve_headline_block_length
from .report import degeneration, headline, report
from .retrain import retrain
from .stages import collection, deer, leaderboard, lora, sampler, sol, task


def run_demo(cfg: DemoConfig) -> Path:
    """Run the demo; returns the run directory. Raises the workbench's one-line user errors on bad input."""
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # 'auto': bf16 autocast where the device has native bf16 matmuls, fp32 where it would emulate them (slower);
    # the run's config.json and report record the precision used
    device = resolve_device(cfg.device)
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, device))
    ecfg = EvalConfig(model=cfg.model, corpus=cfg.corpus, n_prompts=cfg.n_prompts, prompt_len=cfg.prompt_len,
                      gen_len=cfg.gen_len, block_lengths=cfg.block_lengths, thresholds=cfg.thresholds,
                      modes=cfg.modes, sample_temperatures=cfg.sample_temperatures, batch_size=cfg.batch_size,
                      precision=cfg.precision, device=cfg.device, out_dir=cfg.out_dir, progress_bar=cfg.progress_bar)
    ecfg.validate()
    check_stage_options(cfg)
    # build everything in a staging folder and move it into place at the end: no half-written run dir
    with staged_dir(cfg.out_dir, relocate=True, kind="demo", settings=asdict(cfg)) as run:
        model_spec = retrain(cfg) if cfg.retrain else cfg.model
        model, tok, meta = load_model(model_spec, device, cfg.add_mask_token)
        context_warning = check_sweep_fits(model, cfg.block_lengths, cfg.prompt_len, cfg.gen_len, meta)
        byte_tok = is_byte_tokenizer(tok)
        cfg = replace(cfg, headline_block_length=resolve_headline_block_length(cfg, byte_tok))
        n_params = sum(p.numel() for p in model.backbone.parameters())

        # 1. corpus
        t0 = time.time()
        docs = load_corpus(cfg.corpus)
        enc = None if byte_tok else tok
        split_stats = {s: {"files": len(d), "bytes": sum(len(x.text.encode()) for x in d)}
                       for s in ("train", "validation", "test") for d in [by_split(docs, s)]}
        train_tokens = encode_documents(by_split(docs, "train"), enc)
        val_tokens = encode_documents(by_split(docs, "validation"), enc)
        t_corpus = time.time() - t0

        # 2. held-out loss vs unigram
        t0 = time.time()
        vocab = model.backbone.config.vocab_size
        held = heldout_losses(model, val_tokens, 256, cfg.heldout_windows, 16, cfg.batch_size, cfg.precision)
        held["unigram_nats_per_token"] = unigram_cross_entropy(train_tokens, val_tokens, vocab)
        t_held = time.time() - t0

        # 3. decoding sweep
        t0 = time.time()
        prompts = make_prompts(by_split(docs, "test"), cfg.n_prompts, cfg.prompt_len, cfg.gen_len, enc)
        # the sampler frontier and the leaderboard reuse this sweep's runs on the same prompts and settings
        decode_cache: dict = {}
        sol_cache: dict = {}                    # the leaderboard's SOL(serial) ceiling reuses the SOL stage's search
        df = evaluate_model(model, tok, prompts, ecfg, known=known_words(d.text for d in by_split(docs, "train")),
                            decode_cache=decode_cache)
        summary = summarize(df)
        cat_summary = summarize(df, by=("mode", "policy", "block_length", "threshold", "temperature", "category"))
        t_eval = time.time() - t0

        df.to_parquet(run / "results.parquet", index=False)
        summary.to_parquet(run / "summary.parquet", index=False)
        cat_summary.to_parquet(run / "summary_by_category.parquet", index=False)
        plot_accuracy_vs_tpf(summary, run / "accuracy_vs_tpf.png", "agree_serial")
        plot_accuracy_vs_tpf(summary, run / "token_acc_vs_tpf.png", "token_acc")
        from ..model.named import resolve

        base_dir, adapter_dir = resolve(str(model_spec), fetch_missing=False)
        has_curves = plot_training_curves(Path(adapter_dir or base_dir) / "training_log.csv", run / "training_curves.png")

        stage_s: dict[str, float] = {}          # wall seconds of each later stage, for the report

        def timed(name: str, stage, *args):
            t = time.time()
            out = stage(*args)
            stage_s[name] = time.time() - t
            return out

        collection_st = timed("collection", collection.run, cfg, model_spec, run) if cfg.collect else None
        sampler_st = timed("sampler", sampler.run, cfg, model_spec, model, tok, prompts, ecfg, run, decode_cache) \
            if cfg.collect and cfg.sampler else None     # its block length is collected: check_stage_options
        lora_st = timed("lora", lora.run, cfg, model_spec, run) if cfg.lora else None
        adapter = lora_st["adapter"] if lora_st else None
        sol_st = timed("sol", sol.run, cfg, model, tok, run, adapter, sol_cache) if cfg.sol else None
        deer_st = timed("deer", deer.run, cfg, model_spec, run, adapter) if cfg.deer else None
        board = timed("leaderboard", leaderboard.run, cfg, model_spec, model, tok, run, adapter,
                      sampler_st["samplers"]["attention"]["path"] if sampler_st else None,
                      deer_st["drafter"] if deer_st else None, decode_cache, sol_cache) if cfg.leaderboard else None
        task_st = timed("task", task.run, cfg, model_spec, model, tok, run, adapter,
                        sampler_st["samplers"]["attention"]["path"] if sampler_st else None,
                        deer_st["drafter"] if deer_st else None) if cfg.task else None
        headline_numbers = headline(summary, cfg.headline_block_length)
        metrics = {"model": str(model_spec), "parameters": n_params, "heldout": held, "splits": split_stats,
                   "n_prompts": len(prompts), "context_warning": context_warning, "headline": headline_numbers,
                   "free_running": degeneration(summary, cfg.headline_block_length),
                   "targets": TARGETS, "collection": collection_st, "sampler": sampler_st, "sol": sol_st,
                   "lora": lora_st, "deer": deer_st, "leaderboard": board, "task": task_st,
                   "timing_s": {"corpus": t_corpus, "heldout": t_held, "evaluation": t_eval, **stage_s,
                                "total": time.time() - t_start},
                   "device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                   "machine": platform.machine()}
        (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        (run / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float) + "\n")
        (run / "report.md").write_text(report(cfg, metrics, meta, summary, cat_summary, df, prompts, tok, has_curves))
    print_summary(summary, metrics)
    return Path(cfg.out_dir)


def print_summary(summary: pd.DataFrame, metrics: dict) -> None:
    """Print the held-out losses and the decoding summary table to the console."""
    from rich.console import Console
    from rich.table import Table

    held = metrics["heldout"]
    con = Console()
    if not con.is_terminal:  # a log file or CI: rich would squeeze the table into 80 columns
        con = Console(width=160)
    con.print(f"[bold]held-out AR loss[/] {held['ar_nats_per_token']:.3f} nats/token "
              f"(unigram {held['unigram_nats_per_token']:.3f}); diffusion CE@B16 {held['diff_ce']:.3f}")
    tab = Table(title="workbench demo: decoding summary")
    for c in ["mode", "policy", "B", "τ", "tpf", "tpf_real", "agree_serial", "agree_ar", "token_acc", "repetition", "tok/s"]:
        tab.add_column(c, justify="right")
    for _, r in summary.sort_values(["mode", "policy", "block_length", "threshold"]).iterrows():
        policy = r["policy"] if pd.isna(r.get("temperature")) else f"{r['policy']} T={r['temperature']:g}"
        tab.add_row(r["mode"], policy, str(r["block_length"] or "–"), fmt(r["threshold"], 2), fmt(r["tpf"]),
                    fmt(r["tpf_real"]), fmt(r["agree_serial"]), fmt(r["agree_ar"]), fmt(r["token_acc"]),
                    fmt(r["repetition"]), fmt(r["tokens_per_s"], 0))
    con.print(tab)
    con.print(f"total {metrics['timing_s']['total']:.0f} s")


def main(argv: list[str]) -> int:
    """``workbench demo``: run every stage and write the report; returns the exit code."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench demo", DemoConfig, argv)
    out = run_demo(cfg)
    print(f"report: {out / 'report.md'}")
    return 0
