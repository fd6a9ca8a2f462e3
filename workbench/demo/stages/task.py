"""Demo stage: task accuracy (``workbench leaderboard --task humaneval``): the leaderboard's decoders on HumanEval
problems, their pass@1 and AUP beside TPF, and the accuracy-vs-TPF plot in the report. Off unless ``--task`` is
given (with ``--confirm_run_unsafe_code``: the answers run as programs)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ...evaluation.report import markdown_table
from ..config import DemoConfig, task_config

#: Columns of the report's task table.
TASK_COLUMNS = ["decoder", "block_length", "threshold", "tpf", "pass@1", "aup", "agree_ar", "lossless"]


def run(cfg: DemoConfig, model_spec, model, tok, run_dir: Path, adapter: str | None, sampler: str | None,
        drafter: str | None) -> dict:
    """Run the task leaderboard into ``run_dir/task`` (:func:`~workbench.demo.config.task_config`)."""
    from ...leaderboard.run import run_leaderboard

    df, _ = run_leaderboard(task_config(cfg, model_spec, str(run_dir / "task"), sampler, drafter, adapter), model, tok)
    return {"rows": df.to_dict(orient="records"), "task": cfg.task, "problems": cfg.task_problems,
            "gen_len": cfg.task_gen_len}


def section(st: dict) -> list[str]:
    """The report's task section: the decoded rows with their pass@1 and AUP, and the plot."""
    df = pd.DataFrame(st["rows"])
    ok = df[df["status"] == "ok"].sort_values(["decoder", "block_length", "threshold"])
    return [f"## Task accuracy: {st['task']} pass@1 next to speed", "",
            f"Problems {st['problems'] or 'all'}, up to {st['gen_len']} tokens each, free-running; pass@1 = share of "
            "problems whose program passes its tests (run in the sandbox); aup = accuracy under parallelism (d3LLM). "
            "Samples: [`task/samples.jsonl`](task/samples.jsonl).", "",
            markdown_table(ok, [c for c in TASK_COLUMNS if c in ok]), "",
            "![pass@1 against tokens per forward](task/pass_at_1.png)", ""]
