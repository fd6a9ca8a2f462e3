"""``workbench evaluate``: the corpus sweep (:func:`.harness.run_evaluate`) or, with ``--task``, the task's
(:func:`.task.run_task_evaluate`)."""
from __future__ import annotations

from .harness import EvalConfig, run_evaluate
from .task import run_task_evaluate


def evaluate(cfg: EvalConfig, model=None, tokenizer=None):
    """Run ``cfg``'s evaluation: the task's problems when ``cfg.task`` is set, else the corpus prompts. Returns
    (per-prompt rows, summary, run dir)."""
    return (run_task_evaluate if cfg.task else run_evaluate)(cfg, model, tokenizer)


def main(argv: list[str]) -> int:
    """``workbench evaluate``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench evaluate", EvalConfig, argv)
    _, summary, out = evaluate(cfg)
    print(summary.to_string(index=False))
    print(f"results: {out / 'results.parquet'}" + (f"; samples: {out / 'samples.jsonl'}" if cfg.task else ""))
    return 0


__all__ = ["evaluate", "main"]
