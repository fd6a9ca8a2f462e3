"""Ship the sampler and the DEER drafter that a demo run trained as the shipped model's own artefacts.

``workbench leaderboard --model tiny`` (and every command that takes ``--sampler`` / ``--drafter``) uses
``workbench/assets/<model>-sampler`` and ``workbench/assets/<model>-deer-drafter`` when they are not given
(:func:`workbench.assets.shipped_artefact`). They are reproduced by rerunning the demo and this script::

    .venv/bin/workbench demo --model tiny --out_dir runs/demo_tiny
    .venv/bin/python scripts/ship_demo_artefacts.py --run runs/demo_tiny --model tiny

Each shipped folder gets ``shipped.json``: the demo run, its command, the artefact's training metrics. Nothing is
replaced unless both folders were staged completely.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[1] / "workbench" / "assets"


def ship(run: Path, model: str, assets: Path = ASSETS) -> dict[str, Path]:
    """Copy ``run/sampler_attention/sampler`` and ``run/deer/stage2/drafter`` to ``assets/<model>-sampler`` and
    ``assets/<model>-deer-drafter``; returns ``{kind: folder}``. Raises ``FileNotFoundError`` when the run lacks
    either artefact or its ``config.json``, ``ValueError`` when the run's model is not ``model``."""
    sources = {"sampler": (run / "sampler_attention" / "sampler", run / "sampler_attention" / "metrics.json"),
               "deer-drafter": (run / "deer" / "stage2" / "drafter", run / "deer" / "stage2" / "metrics.json")}
    cfg_path = run / "config.json"
    for p in [cfg_path, *(s for s, _ in sources.values())]:
        if not p.exists():
            raise FileNotFoundError(f"{p} is missing: --run must be a finished `workbench demo` run with the sampler "
                                    "and DEER stages")
    cfg = json.loads(cfg_path.read_text())
    if str(cfg.get("model")).removeprefix("builtin:") != model:
        raise ValueError(f"{run} is a demo of model {cfg.get('model')!r}, not {model!r}")
    staged = {}
    for kind, (src, metrics) in sources.items():
        stage = assets / f"{model}-{kind}.staging"
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(src, stage)
        record = {"from_run": str(run), "command": f"workbench demo --model {model}",
                  "demo_config": {k: cfg[k] for k in sorted(cfg) if k.startswith(("sampler", "deer", "collect"))},
                  "training_metrics": json.loads(metrics.read_text()) if metrics.exists() else None}
        (stage / "shipped.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        staged[kind] = stage
    out = {}
    for kind, stage in staged.items():
        final = assets / f"{model}-{kind}"
        shutil.rmtree(final, ignore_errors=True)
        stage.rename(final)
        out[kind] = final
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished `workbench demo` run directory")
    ap.add_argument("--model", required=True, help="the shipped model the run used (e.g. tiny)")
    a = ap.parse_args(argv)
    try:
        out = ship(a.run, a.model)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for kind, p in out.items():
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        print(f"{kind}: {p} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
