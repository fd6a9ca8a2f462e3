"""Ship a trained shared-base DEER drafter (``workbench train deer`` with ``shared_layers``) as
``workbench/assets/<model>-deer-drafter``, which ``deer eval``, ``decode --policy deer`` and the leaderboard use
by default for that model (:func:`workbench.assets.shipped_artefact`).

Reproduce with ``workbench deer retrain --asset <model>-deer-drafter`` (it runs the commands recorded in the shipped
``shipped.json``; rerunning resumes), then ship again; by hand::

    .venv/bin/workbench deer teacher --config workbench/configs/smollm2_deer_teacher.yaml
    .venv/bin/workbench train deer --config workbench/configs/smollm2_deer_stage1.yaml
    .venv/bin/workbench train deer --config workbench/configs/smollm2_deer_stage2.yaml
    .venv/bin/python scripts/ship_deer_drafter.py --stage1 runs/smollm2_deer/stage1 \\
        --stage2 runs/smollm2_deer/stage2 --model smollm2-135m

The folder holds the Stage I + II drafter (``drafter.safetensors``, bf16, without the shared embedding and head),
its ``workbench.json`` and each stage's CSV log (the Stage I drafter stays in its run: one 14 MB drafter per asset).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "workbench" / "assets"
MAX_BYTES = 20 * 1024 * 1024


def _leg(run: Path) -> dict:
    import yaml

    metrics = json.loads((run / "metrics.json").read_text())
    return {"run": str(run), "config": yaml.safe_load((run / "config.yaml").read_text()), "metrics": metrics}


def ship(stage1: Path, stage2: Path, model: str, assets: Path = ASSETS) -> Path:
    """Stage and move the drafter folder into place; returns it. Raises ``FileNotFoundError`` for a run without
    a shared-base drafter and ``ValueError`` for a drafter file over 20 MB."""
    from workbench.deer.shared import is_shared_drafter

    for run in (stage1, stage2):
        if not is_shared_drafter(run / "drafter"):
            raise FileNotFoundError(f"{run}/drafter is not a shared-base DEER drafter (train with shared_layers)")
    stage = assets / f"{model}-deer-drafter.staging"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(stage2 / "drafter", stage)
    for name, run in (("stage1", stage1), ("stage2", stage2)):
        log = run / "logs" / "version_0" / "metrics.csv"
        if log.exists():
            shutil.copy(log, stage / f"{name}_log.csv")
    for f in [*stage.rglob("*")]:
        if f.name == ".workbench-run":
            f.unlink()
        elif f.is_file() and f.stat().st_size > MAX_BYTES:
            shutil.rmtree(stage)
            raise ValueError(f"{f.name} is {f.stat().st_size / 2**20:.1f} MB, over the 20 MB asset limit")
    record = {"stages": {"stage1": _leg(stage1), "stage2": _leg(stage2)},
              "commands": ["workbench deer teacher --config workbench/configs/smollm2_deer_teacher.yaml",
                           "workbench train deer --config workbench/configs/smollm2_deer_stage1.yaml",
                           "workbench train deer --config workbench/configs/smollm2_deer_stage2.yaml"]}
    (stage / "shipped.json").write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    final = assets / f"{model}-deer-drafter"
    shutil.rmtree(final, ignore_errors=True)
    stage.rename(final)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage1", type=Path, required=True, help="the Stage I run directory")
    ap.add_argument("--stage2", type=Path, required=True, help="the Stage II run directory")
    ap.add_argument("--model", required=True, help="the named base model (e.g. smollm2-135m)")
    args = ap.parse_args(argv)
    try:
        out = ship(args.stage1, args.stage2, args.model)
    except (FileNotFoundError, ValueError) as e:
        print(f"ship_deer_drafter: error: {e}", file=sys.stderr)
        return 2
    print(f"shipped {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
