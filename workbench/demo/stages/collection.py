"""Demo stage: collect a trajectory store from the model (NLD App. A) and report it."""
from __future__ import annotations

from pathlib import Path

from ...evaluation.report import fmt
from ..config import DemoConfig, collect_config


def run(cfg: DemoConfig, model_spec: str, run: Path) -> dict:
    """Collect the demo's trajectory store (NLD App. A) and return its numbers for the report."""
    from ...trajectories.collect import run_collect
    from ...trajectories.store import store_info

    out = cfg.store or str(run / "trajectories.zarr")
    r = run_collect(collect_config(cfg, model_spec, out))
    return {"store": out, "policy": cfg.collect_policy, "run": r, "info": store_info(out)}


def section(c: dict) -> list[str]:
    r, info = c["run"], c["info"]
    lines = ["## Trajectory store (sampler training data, NLD App. A)", "",
             f"`workbench collect` wrote `{c['store']}` with the **{c['policy']}** policy: every intermediate step of "
             "every block trajectory (top-3 ids and probabilities, entropy, masked, label = 1[top-1 = final id]).", "",
             "| B | trajectories | rows (block-steps) | bytes on disk | bytes per row | label balance (masked positions) |",
             "|---|---|---|---|---|---|"]
    for b, v in sorted(info.get("block_lengths", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {b} | {v.get('trajectories')} | {v.get('rows')} | {v.get('bytes_on_disk', 0):,} | "
                     f"{fmt(v.get('bytes_per_row'), 1)} | {fmt(v.get('label_balance'))} |")
    rows = r["rows_written_total_this_run"]
    lines += ["", f"This run wrote {rows} rows in {r['wall_s']:.1f} s ({rows / max(r['wall_s'], 1e-9):.0f} rows/s, "
              f"{r['write_s']:.1f} s of it in store writes). A rerun resumes: already committed items are skipped.", ""]
    return lines
