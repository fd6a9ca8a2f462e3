"""Demo stage: a short LoRA drafter run for linear self-speculation (NLD §3.3) and its with / without adapter
table."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...evaluation.report import fmt, markdown_table

from ..config import DemoConfig

LORA_CONFIG = Path(__file__).parents[2] / "configs" / "lora_tiny.yaml"


def lora_stage(model_spec: str, corpus: str, run: Path, steps: int, n_prompts: int, prompt_len: int, gen_len: int,
               segment: int, progress_bar: bool) -> dict:
    """Train a LoRA drafter (``configs/lora_tiny.yaml`` shortened to ``steps``) on ``model_spec`` and evaluate
    greedy linear (k = 8) and quadratic (k = 4) self-speculation with and without it on held-out prompts,
    real-context (context reset to the real text every ``segment`` tokens) and free-running. Writes ``run/lora/`` (training run, ``adapter/``) and ``run/lora_eval/``."""
    from ...cli_args import parse_dataclass
    from ...drafter.config import EvalOptions
    from ...drafter.commands import evaluate_to
    from ...drafter.train import LoraTrainConfig, train_lora

    tcfg = parse_dataclass("lora", LoraTrainConfig, [
        "--config", str(LORA_CONFIG), "--init_from", str(model_spec), "--corpus", corpus,
        "--out_dir", str(run / "lora"), "--max_steps", str(steps), "--val_every", str(max(1, steps // 2)),
        "--val_windows", "64", "--progress_bar", str(progress_bar).lower(),
        "--drafter_adapter", "new"])           # a new o_proj LoRA, evaluated stacked on the model below
    adapter = train_lora(tcfg)
    ev = run / "lora_eval"
    ev.mkdir(parents=True, exist_ok=True)
    opts = EvalOptions(corpus=corpus, n_prompts=n_prompts, prompt_len=prompt_len, gen_len=gen_len, draft_lengths=[8],
                       # fp32: in bf16 the (k + 1)-token verify forward rounds differently from one-token AR steps
                       block_length=segment, precision="fp32", progress_bar=progress_bar,
                       device="cpu")
    r = evaluate_to(opts, str(model_spec), {"base": None, "lora": str(adapter)}, ev)
    train = json.loads((run / "lora" / "metrics.json").read_text())
    baseline = run / "lora" / "baseline.json"
    train["baseline_val_tau_greedy"] = json.loads(baseline.read_text()).get("val/tau_greedy") if baseline.exists() else None
    overall = r["gains"][r["gains"]["category"] == "all"]
    return {"adapter": str(adapter), "steps": steps, "train": train, "overall": overall.to_dict(orient="records"),
            "wall_s": r["wall_s"], "n_prompts": n_prompts, "gen_len": gen_len}


def section(st: dict) -> list[str]:
    """Report section: linear self-speculation with / without the LoRA drafter."""
    cols = ["drafter", "mode", "method", "tau", "tpf_real", "max_accepted", "share_accept_ge8", "agree_ar",
            "tokens_per_s", "tau_gain", "tpf_real_gain"]
    df = pd.DataFrame(st["overall"]).sort_values(["mode", "method", "drafter"])
    tr = st["train"]
    best, before = tr.get("best_val_tau_greedy"), tr.get("baseline_val_tau_greedy")
    return ["## Linear self-speculation with a LoRA drafter (NLD §3.3)", "",
            f"A LoRA adapter (r = 16, α = 64, on `o_proj`, draft pathway only) trained for {st['steps']} steps with the "
            "LK-hybrid + CE loss (NLD Eq. 6–9) on the accepted prefix + first rejection of each draft block "
            f"(validation greedy τ {fmt(before)} before training, {fmt(best)} at the best checkpoint). Greedy linear self-speculation (k = 8: one draft forward + one "
            "verify forward per cycle) on "
            f"{st['n_prompts']} held-out prompts × {st['gen_len']} tokens; τ = tokens per cycle, real TPF = τ / 2. "
            "`agree_ar` = 1: the output is AR greedy's whatever the drafter. Results in `lora_eval/`, the adapter "
            "(peft format) in `lora/adapter/`.", "", markdown_table(df, cols), ""]


def run(cfg: DemoConfig, model_spec, run: Path) -> dict:
    segment = max(b for b in cfg.block_lengths if cfg.gen_len % b == 0)    # validated by EvalConfig
    return lora_stage(str(model_spec), cfg.corpus, run, cfg.lora_steps, cfg.lora_prompts, cfg.prompt_len, cfg.gen_len,
                      segment, cfg.progress_bar)
