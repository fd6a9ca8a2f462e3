"""``workbench sol``: SOL analysis over held-out prompts and block lengths (NLD §4, Table 4, Fig. 7).

Writes to the run directory:

* ``blocks.parquet``: one row per (prompt, B, block): forwards of serial / greedy / SOL / confidence,
  greedy success, budget hits, forced commits, simulation forwards, wall time;
* ``summary.parquet`` (category × B) and ``summary_overall.parquet`` (per B): SOL acceptance
  (B ÷ SOL forwards, aggregated as total tokens ÷ total forwards), SOL real TPF (+1 KV-commit forward
  per block), greedy acceptance and success rate, confidence TPF, and the serial-target output's
  accuracy metrics (token accuracy vs the real continuation, first-line exact match, repetition);
* ``linear_ss.parquet``: linear self-speculation (NLD §3.3, greedy, draft length k = B), free-running from the
  same prompts over the same gen_len tokens (its output is the AR-greedy continuation, as SOL's is the serial
  target: each method is scored on its own output, NLD §4 "Diffusion SOL vs. linear self-speculation"):
  per prompt, tokens, cycles and forwards, without and (``adapter``) with a LoRA drafter; the summaries gain
  ``linear_ss_acceptance`` (τ, tokens per cycle) and ``linear_ss_real_tpf`` (two forwards per cycle), and
  ``linear_ss_lora_*`` with an adapter (the NLD Fig. 7 comparison). Free-running, not reset every B tokens:
  a reset would cut the draft+verify cycle at each block boundary and still charge it two forwards, which
  lowered τ by 6 % (B = 32) to 25 % (B = 4) on identical token streams;
* ``sol_by_category.png`` (Fig. 7 analogue) and ``sol_vs_B.png``; ``config.json``, ``summary.json``.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..decoding.base import DecodeError, check_threshold
from ..utils import check_out_dir, staged_dir, writes_out_dir
from .runner import run_sol
from ..model.loading import ModelLoading


@dataclass
class SolConfig(ModelLoading):
    """Speed-of-light analysis of diffusion decoding."""

    model: str = "builtin:tiny"
    """Checkpoint directory or 'builtin:tiny'."""
    add_mask_token: bool = False
    """Add a [MASK] token (embedding row = the mean of the others, deterministic) when the checkpoint's tokenizer
    has none, e.g. a plain Hugging Face AR model such as smollm2-135m."""
    corpus: str = "stdlib"
    """Corpus of the held-out prompts."""
    split: str = "test"
    """Corpus split of the prompts."""
    n_prompts: int = 24
    """Prompts (at most one per file, spread over categories)."""
    prompt_len: int = 192
    """Maximum prompt length (tokens)."""
    gen_len: int = 64
    """Tokens reproduced per prompt (a multiple of every block length)."""
    block_lengths: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    """Block lengths B."""
    depth: int = 1
    """Compaction depth (1: safety checked by greedy, NLD default)."""
    budget: int = 5000
    """Simulation forwards per block for safety checks (over budget = unsafe)."""
    threshold: float = 0.9
    """Confidence policy threshold measured on the same blocks (the gap to SOL)."""
    max_rows: int = 256
    """Block states per batched forward (1 = one at a time)."""
    precision: str = "fp32"
    """'fp32' or 'bf16'."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    linear_ss: bool = True
    """Also measure linear self-speculation (draft length = B), free-running from the same prompts."""
    adapter: str | None = None
    """Optional peft LoRA drafter directory: adds the linear SS with-adapter columns."""
    out_dir: str = "runs/sol"
    """Run directory."""
    progress_bar: bool = True
    """Show a progress bar."""

    def validate(self) -> None:
        if not self.block_lengths:
            raise ValueError("--block_lengths is empty: the SOL search runs per block length; give at least one, "
                             "e.g. [4, 8]")
        for b in self.block_lengths:
            if b <= 0 or self.gen_len % b:
                raise DecodeError(f"block length {b} must be positive and divide gen_len {self.gen_len}")
        check_threshold(self.threshold)
        if self.depth < 1 or self.budget < 0 or self.max_rows < 1:
            raise ValueError("need depth ≥ 1, budget ≥ 0 and max_rows ≥ 1")
        if self.adapter:
            from ..speculative.adapter import check_adapter_dir

            check_adapter_dir(self.adapter)


def summarize_blocks(blocks: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Aggregate block rows: acceptance = Σ B ÷ Σ forwards (tokens per forward) for each method."""
    blocks = blocks.assign(sol_real_forwards=blocks["sol_forwards"] + 1)
    g = blocks.groupby(by)
    out = pd.DataFrame({
        "blocks": g.size(),
        "sol_acceptance": g["block_length"].sum() / g["sol_forwards"].sum(),
        "sol_real_tpf": g["block_length"].sum() / g["sol_real_forwards"].sum(),
        "greedy_success_rate": g["greedy_success"].mean(),
        "greedy_exact_rate": g["greedy_exact"].mean(),
        "greedy_acceptance": g["block_length"].sum() / g["greedy_forwards"].sum(),     # every block (NLD §4.1)
        "confidence_tpf": g["block_length"].sum() / g["confidence_forwards"].sum(),
        "confidence_equals_target": g["confidence_equals_target"].mean(),
        "forced_commits_per_block": g["forced_commits"].mean(),
        "budget_hits_per_block": g["budget_hits"].mean(),
        "sim_forwards_per_block": g["sim_forwards"].mean(),
        "wall_s_per_block": g["wall_s"].mean(),
    }).reset_index()
    out["sol_over_confidence"] = out["sol_acceptance"] / out["confidence_tpf"]
    return out


def linear_ss_free_running(model, prompts: list[list[int]], gen_len: int, draft_length: int, pad: int,
                           precision: str) -> list[dict]:
    """Greedy linear self-speculation (NLD §3.3) with draft length ``draft_length``, free-running for ``gen_len``
    tokens after each prompt (the output is the AR-greedy continuation). One dict per prompt: ``tokens``,
    ``cycles`` (draft+verify cycles), ``forwards`` (draft) and ``extra_forwards`` (verify)."""
    from ..speculative.linear import linear_self_speculation

    res = linear_self_speculation(model, prompts, gen_len, draft_length=draft_length, precision=precision, pad_id=pad)
    return [{"tokens": len(res.tokens[i]), "cycles": len(res.committed_per_step[i]), "forwards": res.forwards[i],
             "extra_forwards": res.extra_forwards[i]} for i in range(len(prompts))]


def summarize_linear_ss(ss: pd.DataFrame, by: list[str], prefix: str) -> pd.DataFrame:
    """τ = Σ tokens ÷ Σ cycles and real TPF = Σ tokens ÷ Σ (draft + verify forwards), per group."""
    g = ss.groupby(by)
    return pd.DataFrame({f"{prefix}_acceptance": g["tokens"].sum() / g["cycles"].sum(),
                         f"{prefix}_real_tpf": g["tokens"].sum() / (g["forwards"].sum() + g["extra_forwards"].sum()),
                         }).reset_index()


@writes_out_dir("sol")
def run_sol_eval(cfg: SolConfig, model=None, tokenizer=None, cache: dict | None = None) -> dict:
    """Run the analysis and write the run directory; returns the overall summary as records. ``cache``: SOL
    searches shared with later callers on the same model (:func:`~workbench.sol.runner.run_sol`)."""
    from ..corpus import by_split, load_corpus
    from ..evaluation.harness import check_sweep_fits
    from ..model.load import load_model, resolve_device
    from ..evaluation.metrics import first_line, repetition_rate
    from ..evaluation.prompts import make_prompts

    cfg.validate()
    check_out_dir(cfg.out_dir, "sol")          # before the search, without creating anything
    meta = None                                 # a model passed in has no workbench.json to check against
    if model is None:
        model, tokenizer, meta = load_model(cfg.model, resolve_device(cfg.device), cfg.add_mask_token)
    check_sweep_fits(model, cfg.block_lengths, cfg.prompt_len, cfg.gen_len, meta)
    prompts = make_prompts(by_split(load_corpus(cfg.corpus), cfg.split), cfg.n_prompts, cfg.prompt_len, cfg.gen_len,
                           tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows, outputs, ss_rows = [], [], []
    t0 = time.time()
    total = len(prompts) * sum(cfg.gen_len // b for b in cfg.block_lengths)
    bar = tqdm(total=total, desc="sol blocks", disable=not cfg.progress_bar)
    done_before = 0
    for b in cfg.block_lengths:
        n_blocks = cfg.gen_len // b
        recs = run_sol(model, [list(p.prompt) for p in prompts], b, n_blocks, pad, cfg.depth, cfg.budget,
                       cfg.threshold, cfg.max_rows, cfg.precision,
                       progress=lambda k: bar.update(done_before + k - bar.n), cache=cache)
        done_before += len(recs)
        for r in recs:
            p = prompts[r["prompt_index"]]
            rows.append({"prompt_id": p.prompt_id, "path": p.path, "category": p.category,
                         **{k: v for k, v in r.items() if k not in ("target", "sol_path", "prompt_index")},
                         "sol_iterations": len(r["sol_path"]),
                         "max_commit_per_iteration": max(len(c) for c, _ in r["sol_path"])})
        targets = [[tok for r in recs if r["prompt_index"] == i for tok in r["target"].tolist()]
                   for i in range(len(prompts))]
        if cfg.linear_ss and "ar" in getattr(model, "modes", ("ar",)):   # self-speculation needs an AR mode
            ss_rows += _linear_ss_rows(cfg, model, prompts, b, pad)
        for i, p in enumerate(prompts):
            target = targets[i]
            text, real_text = tokenizer.decode(target), tokenizer.decode(list(p.real))
            outputs.append({"prompt_id": p.prompt_id, "category": p.category, "block_length": b,
                            "token_acc": float(np.mean(np.asarray(target) == np.asarray(p.real))),
                            "first_line_exact": float(first_line(text) == first_line(real_text)),
                            "repetition": repetition_rate(target), "real_repetition": repetition_rate(list(p.real)),
                            "text": text})
    bar.close()
    blocks = pd.DataFrame(rows)
    targets = pd.DataFrame(outputs)
    acc_cat = targets.groupby(["category", "block_length"])[["token_acc", "first_line_exact", "repetition"]].mean().reset_index()
    acc_all = targets.groupby(["block_length"])[["token_acc", "first_line_exact", "repetition"]].mean().reset_index()
    summary = summarize_blocks(blocks, ["category", "block_length"]).merge(acc_cat, on=["category", "block_length"])
    overall = summarize_blocks(blocks, ["block_length"]).merge(acc_all, on=["block_length"])
    ss = pd.DataFrame(ss_rows)
    if ss_rows:
        for drafter, g in ss.groupby("drafter"):
            prefix = "linear_ss" if drafter == "base" else "linear_ss_lora"
            summary = summary.merge(summarize_linear_ss(g, ["category", "block_length"], prefix),
                                    on=["category", "block_length"], how="left")
            overall = overall.merge(summarize_linear_ss(g, ["block_length"], prefix), on=["block_length"], how="left")
    with staged_dir(cfg.out_dir, kind="sol", settings=asdict(cfg)) as out:
        if ss_rows:
            ss.to_parquet(out / "linear_ss.parquet", index=False)
        blocks.to_parquet(out / "blocks.parquet", index=False)
        targets.to_parquet(out / "serial_targets.parquet", index=False)
        summary.to_parquet(out / "summary.parquet", index=False)
        overall.to_parquet(out / "summary_overall.parquet", index=False)
        (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        (out / "summary.json").write_text(json.dumps({"wall_s": time.time() - t0, "n_prompts": len(prompts),
                                                      "overall": overall.to_dict(orient="records")}, indent=2) + "\n")
        plot_sol(summary, overall, out)
    return {"overall": overall, "summary": summary, "out_dir": Path(cfg.out_dir), "wall_s": time.time() - t0}


def _linear_ss_rows(cfg: SolConfig, model, prompts, b: int, pad: int) -> list[dict]:
    """Linear SS rows for block length ``b``: the base model, then (``cfg.adapter``) the LoRA drafter."""
    from ..speculative.cli import attach_adapter

    ids = [list(p.prompt) for p in prompts]
    drafters = [("base", None)] + ([("lora", cfg.adapter)] if cfg.adapter else [])
    out = []
    for name, adapter in drafters:
        if adapter:
            attach_adapter(model, adapter)
        try:
            recs = linear_ss_free_running(model, ids, cfg.gen_len, b, pad, cfg.precision)
        finally:
            if adapter:
                model.backbone = model.backbone.unload()     # drop the LoRA layers again
        out += [{"prompt_id": p.prompt_id, "category": p.category, "block_length": b, "drafter": name, **r}
                for p, r in zip(prompts, recs)]
    return out


def plot_sol(summary: pd.DataFrame, overall: pd.DataFrame, out: Path) -> None:
    """``sol_vs_B.png`` (acceptance vs block length) and ``sol_by_category.png`` (Fig. 7 analogue at the largest B)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for col, label in [("sol_acceptance", "SOL (compaction)"), ("sol_real_tpf", "SOL real TPF"),
                       ("greedy_acceptance", "greedy acceptance (NLD §4.1)"), ("confidence_tpf", "confidence τ"),
                       ("linear_ss_acceptance", "linear SS τ"), ("linear_ss_real_tpf", "linear SS real TPF"),
                       ("linear_ss_lora_acceptance", "linear SS + LoRA τ")]:
        if col in overall:
            ax.plot(overall["block_length"], overall[col], "-o", label=label)
    ax.set_xlabel("block length B")
    ax.set_ylabel("tokens per forward")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "sol_vs_B.png", dpi=120)
    plt.close(fig)
    b = int(summary["block_length"].max())
    s = summary[summary["block_length"] == b].sort_values("sol_acceptance")
    x = np.arange(len(s))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(s) + 2), 4))
    bars = [(c, lbl) for c, lbl in [("sol_acceptance", "SOL acceptance"), ("sol_real_tpf", "SOL real TPF"),
                                    ("greedy_acceptance", "greedy"), ("confidence_tpf", "confidence"),
                                    ("linear_ss_acceptance", "linear SS τ"), ("linear_ss_lora_acceptance", "linear SS + LoRA τ")]
            if c in s]
    w = 0.8 / len(bars)
    for i, (col, label) in enumerate(bars):
        ax.bar(x + (i - (len(bars) - 1) / 2) * w, s[col], width=w, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels(s["category"], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("tokens per forward")
    ax.set_title(f"per category, B = {b}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "sol_by_category.png", dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> int:
    """``workbench sol``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench sol", SolConfig, argv)
    r = run_sol_eval(cfg)
    cols = ["block_length", "sol_acceptance", "sol_real_tpf", "greedy_acceptance", "greedy_exact_rate",
            "confidence_tpf", "linear_ss_acceptance", "linear_ss_real_tpf", "linear_ss_lora_acceptance", "token_acc"]
    print(r["overall"][[c for c in cols if c in r["overall"]]].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {r['out_dir']}/blocks.parquet ({r['wall_s']:.0f} s)")
    return 0
