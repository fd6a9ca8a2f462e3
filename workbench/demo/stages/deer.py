"""Demo stage: a short DEER alignment (teacher data, Stage I, Stage II; arXiv:2512.15176 §3) and its acceptance table."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...evaluation.report import markdown_table
from ..config import DemoConfig

DEER_CONFIGS = Path(__file__).parents[2] / "configs"


def deer_stage(model_spec: str, corpus: str, run: Path, n_answers: int, stage1_steps: int, stage2_steps: int,
               n_prompts: int, prompt_len: int, gen_len: int, adapter: str | None, progress_bar: bool) -> dict:
    """A short DEER alignment (arXiv:2512.15176 §3): teacher answers of ``model_spec`` (AR greedy) on train-split
    prompts, Stage I then Stage II of a drafter made of the target's first 2 layers, then DEER decoding
    (k = 8, greedy, batch 1) vs AR, Stage I vs I+II, and linear self-speculation (with ``adapter`` if given)
    on held-out prompts. Writes ``run/deer/{teacher,stage1,stage2,eval}``."""
    from ...cli_args import parse_dataclass
    from ...deer.evaluate import DeerEvalConfig, run_deer_eval
    from ...deer.teacher import TeacherConfig, generate_teacher
    from ...deer.train import DeerTrainConfig, train_deer

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
            "drafter": str(s2), "stage1_drafter": str(s1),
            "stage1_steps": stage1_steps, "stage2_steps": stage2_steps, "n_prompts": n_prompts, "gen_len": gen_len,
            "linear_adapter": adapter is not None}


def section(st: dict) -> list[str]:
    """Report section: DEER acceptance (τ) table, Stage I vs Stage I+II, vs linear self-speculation."""
    cols = ["method", "tau", "max_accepted", "share_accept_ge8", "tpf_real", "tpf_cost", "speedup", "tokens_per_s",
            "agree_ar"]
    names = {"ar": "AR greedy (target)", "deer_stage1": "DEER, Stage I", "deer": "DEER, Stage I + II",
             "linear_ss": "linear SS" + (" + LoRA" if st["linear_adapter"] else "")}
    df = pd.DataFrame(st["overall"]).assign(method=lambda d: d["method"].map(lambda m: names.get(m, m)))
    return ["## DEER: diffusion drafter aligned to the AR target (arXiv:2512.15176 §3)", "",
            f"Teacher: {st['n_answers']} greedy answers of the target on train-split prompts. Drafter: the target's "
            f"first 2 layers as a block-diffusion LM, Stage I (continuation distillation, Eq. 1–2) for "
            f"{st['stage1_steps']} steps, then Stage II (scribe refinement, last R ~ U(1, 96) tokens, w_i = 1.01^(R−i), "
            f"Eq. 3–4) for {st['stage2_steps']} steps. DEER decoding (Alg. 1): one drafter forward drafts k = 8 tokens, "
            f"one target forward verifies them (greedy: output = AR greedy, `agree_ar` = 1); batch 1 on "
            f"{st['n_prompts']} held-out prompts × {st['gen_len']} tokens. τ = tokens per cycle; real TPF = tokens ÷ "
            "(drafter + target forwards); `tpf_cost` weighs drafter forwards by their parameter share; speedup = AR "
            "wall time ÷ wall time on the same prompts. Results in `deer/eval/`.", "", markdown_table(df, cols), ""]


def run(cfg: DemoConfig, model_spec, run: Path, adapter: str | None) -> dict:
    return deer_stage(str(model_spec), cfg.corpus, run, cfg.deer_answers, cfg.deer_stage1_steps, cfg.deer_stage2_steps,
                      cfg.deer_prompts, cfg.prompt_len, cfg.gen_len, adapter, cfg.progress_bar)
