"""Runs behind ``workbench drafter eval`` and ``workbench drafter ablation`` (configs in
:mod:`workbench.drafter.cli`): load the models, evaluate, write Parquet / markdown outputs atomically."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .config import AblationConfig, DrafterEvalConfig, EvalOptions


def _prompts(cfg: EvalOptions, tokenizer):
    from ..corpus import by_split, load_corpus
    from ..evaluation.prompts import make_prompts

    docs = by_split(load_corpus(cfg.corpus), cfg.split)
    return make_prompts(docs, cfg.n_prompts, cfg.prompt_len, cfg.gen_len, tokenizer)


def evaluate_to(cfg: EvalOptions, model_spec: str, drafters: dict, run: Path) -> dict:
    """Evaluate ``drafters`` and write results / summary / gains Parquet files and ``report.md`` into ``run``."""
    import time

    from ..model.load import load_model, resolve_device
    from ..evaluation.report import markdown_table
    from .evaluate import GAIN_METRICS, evaluate_drafters, gain_table, linear_methods, summarize_drafters

    dev = resolve_device(cfg.device)
    _, tok, _ = load_model(model_spec, dev)
    prompts = _prompts(cfg, tok)
    t0 = time.time()
    df = evaluate_drafters(lambda: load_model(model_spec, dev)[0], drafters, tok, prompts,
                           linear_methods(cfg.draft_lengths, cfg.temperature, cfg.seed), cfg.modes, cfg.block_length,
                           cfg.batch_size, cfg.precision, cfg.progress_bar)
    summary = summarize_drafters(df)
    gains = gain_table(summary) if "base" in drafters else summary
    df.to_parquet(run / "results.parquet", index=False)
    summary.to_parquet(run / "summary.parquet", index=False)
    gains.to_parquet(run / "gains.parquet", index=False)
    overall = gains[gains["category"] == "all"]
    cols = ["drafter", "mode", "method", *[c for c in (*GAIN_METRICS, "tau_gain", "tpf_gain", "tpf_real_gain")
                                           if c in overall.columns]]
    cats = gains[(gains["category"] != "all")]
    cat_cols = ["drafter", "mode", "method", "category", "tau", "tpf", "tpf_real", "agree_ar"]
    (run / "report.md").write_text(
        f"# Linear self-speculation with / without LoRA drafter\n\nmodel: {model_spec}; {len(prompts)} prompts x "
        f"{cfg.gen_len} tokens; draft lengths {cfg.draft_lengths}; greedy = {cfg.temperature == 0}\n\n## Overall\n\n"
        + markdown_table(overall, cols) + "\n\n## Per category\n\n" + markdown_table(cats, cat_cols) + "\n")
    return {"results": df, "summary": summary, "gains": gains, "wall_s": time.time() - t0}


def run_eval(cfg: DrafterEvalConfig) -> dict:
    """``workbench drafter eval``: returns ``{"results", "summary", "gains", "out_dir", "wall_s"}``."""
    from ..utils import staged_dir

    cfg.validate()
    drafters = cfg.drafters()
    with staged_dir(cfg.out_dir, kind="drafter eval", settings=asdict(cfg)) as run:
        r = evaluate_to(cfg, cfg.model, drafters, run)
        (run / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return {**r, "out_dir": Path(cfg.out_dir)}


def run_ablation(cfg: AblationConfig) -> dict:
    """``workbench drafter ablation``: train the variants, evaluate them, write ``ablation.parquet`` /
    ``ablation.md``; returns ``{"table", "gains", "out_dir"}``."""
    from ..utils import prepare_run_dir, staged_dir
    from .ablation import ablation_markdown, ablation_table, train_variants

    cfg.validate()
    base_cfg = cfg.train_base()
    out = prepare_run_dir(cfg.out_dir)
    runs = train_variants(base_cfg, list(cfg.losses), out)
    drafters = ({"base": None} if cfg.include_base else {}) | {k: str(v / "adapter") for k, v in runs.items()}
    with staged_dir(out / "eval") as run:
        r = evaluate_to(cfg, base_cfg.init_from, drafters, run)
        table = ablation_table(r["gains"], runs)
        table.to_parquet(run / "ablation.parquet", index=False)
        (run / "ablation.md").write_text(ablation_markdown(table))
        (run / "config.json").write_text(json.dumps({**asdict(cfg), "train": asdict(base_cfg)}, indent=2) + "\n")
    return {"table": table, "gains": r["gains"], "out_dir": out / "eval"}


__all__ = ["evaluate_to", "run_eval", "run_ablation"]
