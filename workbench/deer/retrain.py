"""``workbench deer retrain``: reproduce a shipped DEER drafter from the legs recorded in its ``shipped.json``.

A shipped drafter (``workbench/assets/<model>-deer-drafter``, written by ``scripts/ship_deer_drafter.py``) records
the commands that made it (teacher answers, Stage I, Stage II, each with its YAML) and each stage's resolved
config and final metrics. Retraining runs those commands in order, in-process. Each is resumable: a teacher
keeps its finished chunks, a stage resumes from its ``last.ckpt``, so an interrupted retrain (hours on a CPU) is
continued by running the same command again, and a finished stage is only reloaded. At the end the retrained
stages' validation metrics are printed beside the shipped ones.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..assets import ASSETS
from ..model.loading import ModelLoading


@dataclass
class DeerRetrainConfig(ModelLoading):
    """Options of ``workbench deer retrain``."""

    asset: str = "smollm2-135m-deer-drafter"
    """Shipped drafter to reproduce: a folder name under ``workbench/assets`` or a path to one."""
    dry_run: bool = False
    """Print the recorded commands without running them."""


def recorded_commands(asset: Path) -> tuple[list[list[str]], dict]:
    """The recorded commands of ``asset`` (each as ``workbench`` argv, the program name dropped) and its
    ``shipped.json``. Raises ``FileNotFoundError`` (one line) for a folder without a record, ``ValueError`` for a
    record without commands or with a command that is not a ``workbench`` one."""
    record_file = asset / "shipped.json"
    if not asset.is_dir():
        raise FileNotFoundError(f"no shipped drafter {asset}: give a folder name under workbench/assets or a path")
    if not record_file.is_file():
        raise FileNotFoundError(f"{asset} has no shipped.json: it is not a shipped DEER drafter "
                                "(scripts/ship_deer_drafter.py writes one)")
    record = json.loads(record_file.read_text())
    commands = []
    for line in record.get("commands") or []:
        argv = shlex.split(line)
        if not argv or Path(argv[0]).name != "workbench":
            raise ValueError(f"{record_file}: recorded command {line!r} is not a workbench command")
        _command(argv[1:3])                     # every recorded command is checked before any runs
        commands.append(argv[1:])
    for name, stage in (record.get("stages") or {}).items():
        if not isinstance(stage, dict) or "run" not in stage or "metrics" not in stage:
            raise ValueError(f"{record_file}: stage {name!r} records no run folder and metrics")
    if not commands:
        raise ValueError(f"{record_file} records no commands to retrain from")
    return commands, record


def _command(name: list[str]):
    """The entry point of a recorded DEER command (``deer teacher`` or ``train deer``)."""
    from . import teacher, train

    commands = {("deer", "teacher"): teacher.main, ("train", "deer"): train.main}
    if tuple(name) not in commands:
        raise ValueError(f"recorded command `workbench {' '.join(name)}` is not a DEER step; valid: "
                         "deer teacher, train deer")
    return commands[tuple(name)]


def retrain_drafter(cfg: DeerRetrainConfig) -> list[dict]:
    """Run (or resume) the recorded commands of ``cfg.asset``; returns one row per recorded stage with the
    shipped and retrained validation τ (``val/tau``, k = the stage's ``val_draft_length``).

    Raises ``FileNotFoundError`` / ``ValueError`` (see :func:`recorded_commands`) and whatever the commands raise.
    """
    asset = Path(cfg.asset) if Path(cfg.asset).is_dir() else ASSETS / cfg.asset
    commands, record = recorded_commands(asset)
    if cfg.dry_run:
        for argv in commands:
            print("workbench " + shlex.join(argv))
        return []
    for argv in commands:
        print("workbench " + shlex.join(argv), flush=True)
        status = _command(argv[:2])(argv[2:])
        if status:
            raise RuntimeError(f"`workbench {shlex.join(argv)}` exited with status {status}")
    rows = []
    for name, stage in sorted((record.get("stages") or {}).items()):
        run = Path(stage["run"])
        metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").is_file() else {}
        rows.append({"stage": name, "run": str(run), "shipped_val_tau": stage["metrics"].get("val/tau"),
                     "retrained_val_tau": metrics.get("val/tau"), "shipped_steps": stage["metrics"].get("global_step"),
                     "retrained_steps": metrics.get("global_step")})
    return rows


def main(argv: list[str]) -> int:
    """``workbench deer retrain [--asset NAME] [--dry_run true]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench deer retrain", DeerRetrainConfig, argv)
    for r in retrain_drafter(cfg):
        print(f"{r['stage']}: val τ {r['retrained_val_tau']} after {r['retrained_steps']} steps "
              f"(shipped: {r['shipped_val_tau']} after {r['shipped_steps']}) in {r['run']}")
    return 0


__all__ = ["DeerRetrainConfig", "recorded_commands", "retrain_drafter", "main"]
