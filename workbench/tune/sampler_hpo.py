"""``workbench sweep sampler``: an Optuna study of sampler training hyper-parameters (learning rate,
width, depth), maximising validation AUC, with pruning of unpromising trials from the Lightning loop.

Optuna's own ``optuna_integration.PyTorchLightningPruningCallback`` imports ``lightning.pytorch``; this
project uses the ``pytorch_lightning`` package (the two must not be mixed), so :class:`PruningCallback`
does the same two calls (``trial.report`` + ``trial.should_prune``) as a ``pytorch_lightning`` callback.
"""
from __future__ import annotations

import json
from functools import partial
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import optuna
import pytorch_lightning as pl

from ..atomic import write_bytes, write_json
from .storage import StorageLost, check_existing_study, check_study_identity, make_storage, mark_worker, open_study
from .team import TEAM_MAY_CHANGE, TeamOptions, label_study, watch_study
from .workers import optimize_until, run_workers, worker_seed
from ..model.loading import ModelLoading


class PruningCallback(pl.Callback):
    """Report ``monitor`` to the trial after every validation and raise ``optuna.TrialPruned`` when the
    pruner says so (Optuna's Lightning pruning callback, for ``pytorch_lightning``)."""

    def __init__(self, trial: optuna.Trial, monitor: str = "val/auc"):
        self.trial, self.monitor = trial, monitor

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        step = trainer.global_step
        self.trial.report(float(trainer.callback_metrics[self.monitor]), step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step}")


@dataclass
class SamplerHPOConfig(TeamOptions, ModelLoading):
    """Optuna study over sampler training hyper-parameters (maximise validation AUC). The shared-study options (a
    lost database server, the dashboard) come from :class:`~workbench.tune.team.TeamOptions`."""

    store: str = "trajectories/tiny-serial.zarr"
    """Trajectory store to train on."""
    block_length: int = 32
    """Block length group of the store."""
    study: str = "sampler-hpo"
    """Study name; rerunning with the same name and storage resumes it."""
    storage: str | None = None
    """None → SQLite file in out_dir; an RDB URL; or a journal file path."""
    out_dir: str = "runs/sampler_hpo"
    """Run directory (one sub-folder per trial, best_params.json, trials.parquet)."""
    n_trials: int = 10
    """Total finished (complete or pruned) trials the study should reach."""
    lr_low: float = 1e-4
    """Learning-rate range (log-uniform)."""
    lr_high: float = 3e-3
    """Learning-rate range (log-uniform)."""
    widths: list[int] = field(default_factory=lambda: [64, 128, 256])
    """Candidate widths d."""
    depth_low: int = 1
    """Depth range."""
    depth_high: int = 4
    """Depth range."""
    max_epochs: int = 5
    """Epochs per trial."""
    val_every: int | None = 50
    """Validate (and report to the pruner) every this many steps."""
    batch_size: int = 256
    """Rows per step."""
    val_fraction: float = 0.1
    """Share of prompts (or documents or trajectories, see split_by) held out for the validation AUC."""
    split_by: str = "prompt"
    """Held-out unit of every trial: 'prompt', 'document' or 'traj' (``workbench train sampler``'s option)."""
    keep_trial_dirs: bool = False
    """Keep every trial's run directory (default: only the best trial's sampler is kept)."""
    seed: int | None = 0
    """Optuna sampler seed (a resumed study uses seed + its trial count; worker i of ``n_workers`` uses
    seed + 7919·i; machines sharing one storage need their own)."""
    n_workers: int = 1
    """Worker processes on this machine, all on the one study (``workbench.tune.workers``)."""


def run_sampler_hpo(cfg: SamplerHPOConfig) -> dict:
    """Create or resume the study and run it to ``n_trials`` finished trials; returns the best trial."""
    from ..interrupts import Interrupted
    from ..run_folder import check_run, open_run, run_settings, update_record

    if cfg.n_workers < 1:
        raise ValueError(f"--n_workers must be ≥ 1, got {cfg.n_workers}")
    cfg.validate_team()
    if not cfg.widths or min(cfg.widths) < 1:
        raise ValueError(f"--widths must be a non-empty list of positive widths, got {cfg.widths}")
    folder_args = dict(path=cfg.out_dir, kind="sweep sampler", settings=run_settings(cfg), may_change=HPO_MAY_CHANGE,
                       state="trials.parquet")
    check_run(**folder_args)
    ident = measurement_identity(cfg)
    if cfg.storage or (Path(cfg.out_dir) / "optuna.db").is_file():     # a foreign study: refused before any write
        check_existing_study(cfg.study, make_storage(cfg.storage, Path(cfg.out_dir)), ident)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with open_run(**folder_args) as folder:
        out = folder.path
        write_json(out / "config.json", asdict(cfg))
        study = _open(cfg, 0)
        check_study_identity(study, ident)
        label_study(study, ["val_auc"], decoder="sampler", block_length=cfg.block_length, store=cfg.store)
        t0 = time.time()
        try:
            if _finished(study) < cfg.n_trials:
                with watch_study(cfg.study, cfg.storage, out, cfg.dashboard):
                    run_workers(partial(_hpo_worker, asdict(cfg)), cfg.n_workers, study)
        except Interrupted as e:
            raise Interrupted(e.signum, f"interrupted after {_finished(study)} finished trials; rerun the same "
                                        "command to run the rest") from None
        summary = _export(cfg, study, out, t0)
        update_record(folder, finished=_finished(study) >= cfg.n_trials)
        return summary


def _export(cfg: SamplerHPOConfig, study: optuna.Study, out: Path, t0: float) -> dict:
    """Write ``trials.parquet`` and ``best_params.json``, drop the other trials' folders (unless kept); returns the
    summary :func:`run_sampler_hpo` returns."""
    df = study.trials_dataframe()
    write_bytes(out / "trials.parquet", df.to_parquet(index=False))
    best = study.best_trial
    write_json(out / "best_params.json", {"number": best.number, "val_auc": best.value, **best.params})
    if not cfg.keep_trial_dirs:
        for p in out.glob("trial-*"):
            if p.name != f"trial-{best.number:03d}":
                shutil.rmtree(p, ignore_errors=True)
    states = df["state"].value_counts().to_dict() if len(df) else {}
    return {"study": cfg.study, "best": {"number": best.number, "val_auc": best.value, **best.params},
            "states": states, "wall_s": time.time() - t0, "out_dir": str(out)}


#: Settings of a ``sweep sampler`` out_dir that a rerun may change: the trial budget and workers, the search
#: space and how it is searched, which trial folders are kept. What a trial measures (the store, block length,
#: epochs, validation interval, batch) stays fixed, and so do the study's name and storage. How the store's model is
#: loaded to check its fingerprint (``attn_implementation``, ``strict_family``) changes no trial.
HPO_MAY_CHANGE = ("n_trials", "n_workers", "seed", "keep_trial_dirs", "lr_low", "lr_high", "widths", "depth_low",
                  "depth_high", "attn_implementation", "strict_family", *TEAM_MAY_CHANGE)


def measurement_identity(cfg: SamplerHPOConfig) -> dict:
    """What a trial of ``cfg`` measures (recorded in the study, :func:`~workbench.tune.storage.check_study_identity`):
    every setting outside :data:`HPO_MAY_CHANGE` and the out_dir and study name, and the store's content identity."""
    from ..trajectories.store import content_identity

    ident = {k: v for k, v in asdict(cfg).items() if k not in (*HPO_MAY_CHANGE, "out_dir", "study")}
    ident["store_identity"] = content_identity(cfg.store)
    return ident


FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def _finished(study: optuna.Study) -> int:
    return sum(t.state in FINISHED for t in study.trials)


def _open(cfg: SamplerHPOConfig, index: int) -> optuna.Study:
    return open_study(cfg.study, cfg.storage, Path(cfg.out_dir), "tpe", worker_seed(cfg.seed, index),
                      direction="maximize",
                      pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=cfg.val_every or 0))


def _hpo_worker(cfg: dict, index: int, ready=lambda: None) -> None:
    """Worker ``index`` of the study (:func:`~workbench.tune.workers.run_workers`): wait for the other workers
    (``ready``), then train samplers until the study has ``n_trials`` finished trials."""
    from ..sampler.train import SamplerTrainConfig, train_sampler

    cfg = SamplerHPOConfig(**cfg)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = Path(cfg.out_dir)
    study = _open(cfg, index)
    base = SamplerTrainConfig(store=cfg.store, block_length=cfg.block_length, max_epochs=cfg.max_epochs,
                              val_every=cfg.val_every, batch_size=cfg.batch_size, val_fraction=cfg.val_fraction,
                              split_by=cfg.split_by, progress_bar=False, resume=False)

    def objective(trial: optuna.Trial) -> float:
        mark_worker(trial)
        d = trial.suggest_categorical("d_model", cfg.widths)
        tcfg = replace(base, out_dir=str(out / f"trial-{trial.number:03d}"),
                       lr=trial.suggest_float("lr", cfg.lr_low, cfg.lr_high, log=True), d_model=d,
                       heads=max(1, d // 32), depth=trial.suggest_int("depth", cfg.depth_low, cfg.depth_high))
        train_sampler(tcfg, callbacks=[PruningCallback(trial)])
        metrics = json.loads((Path(tcfg.out_dir) / "metrics.json").read_text())
        return float(metrics["best_val_auc"])

    ready()                                 # all workers set up: start together
    optimize_until(study, objective, cfg.n_trials, FINISHED, cfg.reconnect_s, "workbench sweep sampler")


def main(argv: list[str]) -> int:
    """``workbench sweep sampler``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench sweep sampler", SamplerHPOConfig, argv)
    try:
        r = run_sampler_hpo(cfg)
    except StorageLost as e:                    # the database server went away for good: one line, exit 1
        return e.report()
    print(f"study {r['study']}: trial states {r['states']}; best {r['best']} ({r['wall_s']:.0f} s)")
    return 0
