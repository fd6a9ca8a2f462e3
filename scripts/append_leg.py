"""Ship a continuation run as the next training leg of a shipped model (e.g. ``workbench/assets/tiny``) or of a
shipped gated-LoRA adapter (``workbench/assets/smollm2-135m-trimode``).

A leg is a ``workbench train lm --init_from <shipped model>`` run, or for an adapter a ``workbench train lm
--lora_init <shipped adapter>`` run on the same base weights. This copies the run's final weights over the shipped
ones and extends the records so the model stays reproducible and its history readable:

- ``workbench.json``: ``global_step`` becomes the total over all legs, ``final_metrics`` the new leg's, and
  ``legs`` gains ``{"leg", "config", "steps", "train_tokens", "train_config", "log"}`` of the new leg (the first
  leg keeps the top-level ``preset`` / ``train_config``; ``train_tokens`` = steps × batch size × sequence length);
- ``training_log.csv``: the new leg's training log (``run/model/training_log.csv``, which ``train_lm`` copies from
  its Lightning CSV log) is appended with its steps offset by the steps
  already shipped, so one curve covers the whole training.

Usage::

    .venv/bin/python scripts/append_leg.py --shipped workbench/assets/tiny --run runs/leg3 \\
        --config configs/tiny_leg3.yaml

Nothing is changed unless the whole new directory was written (staged next to ``--shipped``, then swapped).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pandas as pd

WEIGHT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json", "adapter_config.json", "adapter_model.safetensors")


def leg_record(n: int, config: str, leg: dict, log_name: str, run: Path, device: str | None = None) -> dict:
    """The ``legs`` entry of leg ``n``: its config, steps, training tokens (steps × batch size × sequence length),
    log file, final validation acceptance, the wall time of its last (re)start (``run/metrics.json``) and, when
    given, the ``device`` it ran on."""
    tc, fm = leg["train_config"], leg["final_metrics"]
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    return {"leg": n, "config": config, "steps": leg["global_step"], "train_config": tc,
            "train_tokens": leg["global_step"] * tc["batch_size"] * tc["seq_len"]
            if {"batch_size", "seq_len"} <= tc.keys() else None, "log": log_name,
            "val_tau": fm.get("val/tau"), "val_tau_tf": fm.get("val/tau_tf"), "wall_s": metrics.get("wall_s_this_run"),
            **({"device": device} if device else {})}


def first_leg(shipped: Path, run: Path, config: str, device: str) -> dict:
    """Ship the finished run ``run`` as leg 1 of a new adapter or model folder ``shipped`` (which must not exist);
    returns its ``workbench.json``. Raises ``FileNotFoundError`` / ``FileExistsError``."""
    model = run / "model"
    for p in (model / "workbench.json", model / "training_log.csv"):
        if not p.exists():
            raise FileNotFoundError(f"{p} is missing: --run must be a finished `workbench train lm` run directory")
    if shipped.exists():
        raise FileExistsError(f"{shipped} exists: append to it without --first")
    meta = json.loads((model / "workbench.json").read_text())
    meta["legs"] = [leg_record(1, config, meta, "training_log.csv", run, device)]
    stage = shipped.with_name(shipped.name + ".staging")
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(model, stage)
    (stage / "workbench.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str) + "\n")
    stage.rename(shipped)
    return meta


def append_leg(shipped: Path, run: Path, config: str, device: str | None = None) -> dict:
    """Write ``shipped`` + the leg in ``run``; returns the new ``workbench.json``.

    Raises ``FileNotFoundError`` when ``run/model`` or a shipped record is missing, ``ValueError`` when the
    run did not start from a model with the shipped vocabulary / mask token.
    """
    model = run / "model"
    adapter = (shipped / "adapter_model.safetensors").exists()
    weights = "adapter_model.safetensors" if adapter else "model.safetensors"
    for p in (shipped / "workbench.json", shipped / "training_log.csv", model / "workbench.json",
              model / weights, model / "training_log.csv"):
        if not p.exists():
            raise FileNotFoundError(f"{p} is missing: --shipped must be a shipped model or adapter and --run a "
                                    "finished `workbench train lm` run directory")
    old = json.loads((shipped / "workbench.json").read_text())
    leg = json.loads((model / "workbench.json").read_text())
    if leg.get("mask_token_id") != old.get("mask_token_id") or not leg.get("init_from"):
        raise ValueError(f"{run} is not a continuation of {shipped} (no init_from or a different mask token)")
    if adapter and leg.get("base_fingerprint") != old.get("base_fingerprint"):
        raise ValueError(f"{run} trained an adapter for base weights {leg.get('base_fingerprint')}, {shipped} is for "
                         f"{old.get('base_fingerprint')}")
    legs = old.get("legs") or [{"leg": 1, "config": "(first leg)", "steps": old["global_step"],
                                "train_config": old.get("train_config")}]
    n = len(legs) + 1
    log_name = "training_log.csv" if not adapter else f"training_log_leg{n}.csv"
    legs = legs + [leg_record(n, config, leg, log_name, run, device)]
    new = {**old, "final_metrics": leg["final_metrics"], "global_step": old["global_step"] + leg["global_step"],
           "legs": legs}

    # a model keeps one log with steps counted over all legs; an adapter one log per leg (legs[i]["log"]), since
    # its legs differ in tokens per step
    log_new = pd.read_csv(model / "training_log.csv")
    if not adapter:
        log_new["step"] = log_new["step"] + old["global_step"]
        log_new = pd.concat([pd.read_csv(shipped / "training_log.csv"), log_new], ignore_index=True)

    stage = shipped.with_name(shipped.name + ".staging")
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(shipped, stage)
    for name in WEIGHT_FILES:
        if (model / name).exists():
            shutil.copy(model / name, stage / name)
    (stage / "workbench.json").write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    log_new.to_csv(stage / log_name, index=False)
    backup = shipped.with_name(shipped.name + ".old")
    shutil.rmtree(backup, ignore_errors=True)
    shipped.rename(backup)
    stage.rename(shipped)
    shutil.rmtree(backup)
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shipped", type=Path, required=True, help="shipped model directory to extend")
    ap.add_argument("--run", type=Path, required=True, help="finished continuation run (has model/)")
    ap.add_argument("--config", required=True, help="the leg's config, as recorded (e.g. configs/tiny_leg3.yaml)")
    ap.add_argument("--first", action="store_true", help="ship the run as leg 1 of a new folder --shipped")
    ap.add_argument("--device", default=None, help="where the leg ran, as recorded (with --first: default '2-core CPU')")
    a = ap.parse_args(argv)
    try:
        new = (first_leg(a.shipped, a.run, a.config, a.device or "2-core CPU") if a.first
               else append_leg(a.shipped, a.run, a.config, a.device))
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fm = new["final_metrics"]
    vals = "; ".join(f"{k} {fm[k]:.4f}" for k in ("val/ar_loss", "val/tau") if fm.get(k) is not None)
    print(f"{a.shipped}: {new['global_step']} steps in {len(new['legs'])} leg(s); {vals}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
