"""The demo's drafter stages: a short LoRA drafter run for linear self-speculation (NLD §3.3) with the
with / without adapter table, and a short DEER alignment (deer.txt §3) with its acceptance table."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .report import fmt, markdown_table

LORA_CONFIG = Path(__file__).parent / "configs" / "lora_tiny.yaml"


def lora_stage(model_spec: str, corpus: str, run: Path, steps: int, n_prompts: int, prompt_len: int, gen_len: int,
               segment: int, progress_bar: bool) -> dict:
    """Train a LoRA drafter (``configs/lora_tiny.yaml`` shortened to ``steps``) on ``model_spec`` and evaluate
    greedy linear (k = 8) and quadratic (k = 4) self-speculation with and without it on held-out prompts,
    real-context (context reset to the real text every ``segment`` tokens) and free-running. Writes ``run/lora/`` (training run, ``adapter/``) and ``run/lora_eval/``."""
    from .cli_args import parse_dataclass
    from .drafter.cli import EvalOptions
    from .drafter.commands import evaluate_to
    from .drafter.train import LoraTrainConfig, train_lora

    tcfg = parse_dataclass("lora", LoraTrainConfig, [
        "--config", str(LORA_CONFIG), "--init_from", str(model_spec), "--corpus", corpus,
        "--out_dir", str(run / "lora"), "--max_steps", str(steps), "--val_every", str(max(1, steps // 2)),
        "--val_windows", "64", "--progress_bar", str(progress_bar).lower()])
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


def lora_section(st: dict) -> list[str]:
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


DEER_CONFIGS = Path(__file__).parent / "configs"


def deer_stage(model_spec: str, corpus: str, run: Path, n_answers: int, stage1_steps: int, stage2_steps: int,
               n_prompts: int, prompt_len: int, gen_len: int, adapter: str | None, progress_bar: bool) -> dict:
    """A short DEER alignment (deer.txt §3): teacher answers of ``model_spec`` (AR greedy) on train-split
    prompts, Stage I then Stage II of a drafter made of the target's first 2 layers, then DEER decoding
    (k = 8, greedy, batch 1) vs AR, Stage I vs I+II, and linear self-speculation (with ``adapter`` if given)
    on held-out prompts. Writes ``run/deer/{teacher,stage1,stage2,eval}``."""
    from .cli_args import parse_dataclass
    from .deer.evaluate import DeerEvalConfig, run_deer_eval
    from .deer.teacher import TeacherConfig, generate_teacher
    from .deer.train import DeerTrainConfig, train_deer

    root = run / "deer"
    bar = str(progress_bar).lower()
    teacher = root / "teacher"
    generate_teacher(parse_dataclass("teacher", TeacherConfig, [
        "--config", str(DEER_CONFIGS / "deer_teacher.yaml"), "--target", str(model_spec), "--corpus", corpus,
        "--n_answers", str(n_answers), "--out_dir", str(teacher)]))
    common = ["--teacher", str(teacher), "--progress_bar", bar, "--warmup_steps", "10"]
    s1 = train_deer(parse_dataclass("deer", DeerTrainConfig, [
        "--config", str(DEER_CONFIGS / "deer_stage1.yaml"), *common, "--drafter_init", str(model_spec),
        "--init_layers", "2", "--out_dir", str(root / "stage1"), "--max_steps", str(stage1_steps),
        "--val_every", str(max(1, stage1_steps // 2)), "--lr", "1e-3"]))
    s2 = train_deer(parse_dataclass("deer", DeerTrainConfig, [
        "--config", str(DEER_CONFIGS / "deer_stage2.yaml"), *common, "--drafter_init", str(s1),
        "--out_dir", str(root / "stage2"), "--max_steps", str(stage2_steps),
        "--val_every", str(max(1, stage2_steps // 2))]))
    out = run_deer_eval(DeerEvalConfig(target=str(model_spec), drafter=str(s2), stage1_drafter=str(s1),
                                       compare_linear=True, adapter=adapter, corpus=corpus, n_prompts=n_prompts,
                                       prompt_len=prompt_len, gen_len=gen_len, draft_length=8, batch_size=1,
                                       device="cpu", out_dir=str(root / "eval"), progress_bar=progress_bar))
    table = pd.read_parquet(out / "by_category.parquet")
    return {"overall": table[table["category"] == "all"].to_dict(orient="records"), "n_answers": n_answers,
            "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "n_prompts": n_prompts, "gen_len": gen_len,
            "linear_adapter": adapter is not None}


def deer_section(st: dict) -> list[str]:
    """Report section: DEER acceptance (τ) table, Stage I vs Stage I+II, vs linear self-speculation."""
    cols = ["method", "tau", "max_accepted", "share_accept_ge8", "tpf_real", "tpf_cost", "speedup", "tokens_per_s",
            "agree_ar"]
    names = {"ar": "AR greedy (target)", "deer_stage1": "DEER, Stage I", "deer": "DEER, Stage I + II",
             "linear_ss": "linear SS" + (" + LoRA" if st["linear_adapter"] else "")}
    df = pd.DataFrame(st["overall"]).assign(method=lambda d: d["method"].map(lambda m: names.get(m, m)))
    return ["## DEER: diffusion drafter aligned to the AR target (deer.txt §3)", "",
            f"Teacher: {st['n_answers']} greedy answers of the target on train-split prompts. Drafter: the target's "
            f"first 2 layers as a block-diffusion LM, Stage I (continuation distillation, Eq. 1–2) for "
            f"{st['stage1_steps']} steps, then Stage II (scribe refinement, last R ~ U(1, 96) tokens, w_i = 1.01^(R−i), "
            f"Eq. 3–4) for {st['stage2_steps']} steps. DEER decoding (Alg. 1): one drafter forward drafts k = 8 tokens, "
            f"one target forward verifies them (greedy: output = AR greedy, `agree_ar` = 1); batch 1 on "
            f"{st['n_prompts']} held-out prompts × {st['gen_len']} tokens. τ = tokens per cycle; real TPF = tokens ÷ "
            "(drafter + target forwards); `tpf_cost` weighs drafter forwards by their parameter share; speedup = AR "
            "wall time ÷ wall time on the same prompts. Results in `deer/eval/`.", "", markdown_table(df, cols), ""]
