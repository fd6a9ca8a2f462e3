"""Experiment trackers of every ``workbench train`` command: Lightning's own loggers, chosen with ``--logger``.

* ``csv`` (always on): ``logs/version_0/metrics.csv``, one log across resumes (:class:`~workbench.resume.LogHistory`).
* ``tensorboard``: ``tb/version_0/`` (``tensorboard --logdir <out_dir>/tb``).
* ``mlflow``: a local tracking store in the run folder, ``sqlite:///<out_dir>/mlflow.db`` (artifacts in
  ``<out_dir>/mlartifacts``; ``mlflow ui --backend-store-uri sqlite:///<out_dir>/mlflow.db``), or ``--mlflow_uri``.
  The experiment is named after the command (``workbench train lm``), the run after the run folder.
* ``wandb``: offline files under ``<out_dir>/wandb`` (``wandb sync`` uploads them) unless W&B is configured
  (``WANDB_API_KEY``, ``wandb login``, or ``WANDB_MODE=online``), then online; project ``--wandb_project``.

Every tracker receives the same metrics from Lightning's logger connector (losses, ``lr``, the validation AUC or
τ, and ``train/tokens_per_s`` from :class:`TokenThroughput`) and the resolved config as hyper-parameters. A resumed
run continues the same tracker runs: their ids are kept in ``<out_dir>/trackers.json`` (MLflow run id, W&B run id)
and handed back to the loggers, so a resume never opens a second run. (MLflow parameters are write-once: a value a
resume changes, such as a new learning rate, stays recorded in the run folder's ``run.json``, not in MLflow.)

Trackers are optional dependencies: a missing one is refused in one line naming the pip extra that installs it,
before anything is written.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl

#: Trackers ``--logger`` accepts (``csv`` is always on).
TRACKERS = ("csv", "tensorboard", "mlflow", "wandb")
#: The module each optional tracker needs and the pip extra that installs it.
TRACKER_PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
#: The file of a run folder that keeps its tracker runs' ids (read on resume).
RECORD = "trackers.json"
#: Settings of :class:`TrackerConfig`, free to change on a resume (they decide where a run is recorded, not what
#: it trains).
TRACKER_SETTINGS = ("logger", "mlflow_uri", "wandb_project")


@dataclass
class TrackerConfig:
    """The tracker options of every ``train`` command (a mixin of their config dataclasses)."""

    logger: str | list[str] = "csv"
    """Experiment trackers: csv (always on), tensorboard, mlflow, wandb; a list or comma-separated
    (--logger csv,tensorboard,mlflow). A missing package is named with the pip extra that installs it."""
    mlflow_uri: str | None = None
    """MLflow tracking URI (None: a local store in the run folder, sqlite:///<out_dir>/mlflow.db)."""
    wandb_project: str = "workbench"
    """W&B project. Runs are offline (files in <out_dir>/wandb; wandb sync uploads them) unless W&B is configured
    (WANDB_API_KEY, wandb login, or WANDB_MODE=online)."""

    def trackers(self) -> list[str]:
        """The chosen trackers, ``csv`` first, each once; raises ``ValueError`` (one line) for an unknown name or a
        tracker whose package is missing (:func:`check_trackers`)."""
        return check_trackers(self.logger)


def check_trackers(logger: str | list[str] | None) -> list[str]:
    """``logger`` (``--logger``: a list, or names separated by commas) as a list of tracker names with ``csv`` first.
    Raises ``ValueError`` for a name not in :data:`TRACKERS` (listing them) or a tracker whose package is not
    installed (naming its pip extra)."""
    import importlib.util

    items = logger if isinstance(logger, (list, tuple)) else [logger or "csv"]
    names = [n.strip().lower() for item in items for n in str(item).split(",") if n.strip()]
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"unknown --logger {unknown[0]!r}; valid: {', '.join(TRACKERS)} (several: "
                         "--logger csv,tensorboard,mlflow)")
    chosen = ["csv", *dict.fromkeys(n for n in names if n != "csv")]
    for name in chosen:
        if name in TRACKER_PACKAGES:
            module, extra = TRACKER_PACKAGES[name]
            if importlib.util.find_spec(module) is None:
                raise ValueError(f"--logger {name} needs the {module} package, which is not installed: pip install "
                                 f"'workbench[{extra}]'")
    return chosen


def wandb_mode() -> str:
    """'online' where the user has configured W&B (``WANDB_MODE=online``, ``WANDB_API_KEY``, or an api.wandb.ai
    entry in ``~/.netrc`` from ``wandb login``), else 'offline' (``WANDB_MODE=offline`` or ``disabled`` are kept)."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("online", "offline", "disabled"):
        return mode
    if mode in ("run",):
        return "online"
    if mode in ("dryrun",):
        return "offline"
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        import netrc

        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


def batch_tokens(batch) -> int:
    """The tokens a training batch holds: ``(windows (batch, seq_len), stream indices (batch,))`` (``train lm``);
    ``{"ids": (batch, L)}`` (``train lora``); ``{"features": (rows, block_length, F)}``, one position a token
    (``train sampler``); ``{"prompt": [...], "answer": [...]}`` ragged token lists (``train deer``); a token tensor.
    0 for anything else."""
    import torch

    if isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
        batch = batch[0]
    if torch.is_tensor(batch):
        return int(batch.numel())
    if isinstance(batch, dict):
        if torch.is_tensor(batch.get("ids")):
            return int(batch["ids"].numel())
        if torch.is_tensor(batch.get("features")):
            return int(batch["features"].shape[:-1].numel())
        if "answer" in batch:
            return int(sum(len(x) for key in ("prompt", "answer") for x in batch.get(key, [])))
    return 0


class TokenThroughput(pl.Callback):
    """Logs ``train/tokens_per_s``: the tokens of an optimiser step's batches over all ranks (:func:`batch_tokens`
    times the world size) divided by the wall time since the previous step ended (the first step of a run: since
    training started), to every tracker with the step's other metrics."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t, self._tokens = time.perf_counter(), 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        self._tokens += batch_tokens(batch)
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return                                   # inside an accumulation: the step is not over
        now = time.perf_counter()
        rate = self._tokens * trainer.world_size / max(now - self._t, 1e-9)
        self._t, self._tokens = now, 0
        pl_module.log("train/tokens_per_s", rate, on_step=True, on_epoch=False, batch_size=1)


class Trackers:
    """The Lightning loggers of one training run in ``out_dir`` (see the module docstring) and the callbacks they
    need. Build it before the run folder is opened (it writes nothing), pass :attr:`loggers` (CSV, TensorBoard:
    they write lazily) and :attr:`callbacks` to the trainer, call :meth:`start` in the open folder before
    ``trainer.fit`` (it adds the MLflow and W&B loggers, whose stores are created when the logger is) and
    :meth:`finish` after it (also when it fails).

    ``kind``: the command (``"train lm"``), the MLflow experiment's name; ``resuming``: the run continues from a
    checkpoint, so the tracker runs recorded in ``trackers.json`` are continued. Raises ``ValueError`` (one line)
    for an unknown tracker or a missing package."""

    def __init__(self, cfg: TrackerConfig, out_dir: str | Path, kind: str, resuming: bool):
        from pytorch_lightning.loggers import CSVLogger

        self.names = cfg.trackers()
        self.cfg, self.out = cfg, Path(out_dir)
        self.kind, self.resuming = kind, resuming
        self.record: dict = {}
        self.loggers: list = [CSVLogger(self.out, name="logs", version=0)]
        if "tensorboard" in self.names:
            from pytorch_lightning.loggers import TensorBoardLogger

            self.loggers.append(TensorBoardLogger(self.out, name="tb", version=0, default_hp_metric=False))
        self.callbacks = [TokenThroughput()]

    # --------------------------------------------------------------------------------------------- the loggers
    def _mlflow(self, cfg: TrackerConfig, old: dict):
        import logging

        import mlflow  # noqa: F401 - configures its loggers on import: quieted just below
        from pytorch_lightning.loggers import MLFlowLogger

        for name in ("mlflow", "alembic", "pytorch_lightning.loggers.mlflow", "lightning.pytorch.loggers.mlflow"):
            logging.getLogger(name).setLevel(logging.ERROR)     # no table-creation or "creating experiment" lines
        uri = cfg.mlflow_uri or f"sqlite:///{self.out.resolve() / 'mlflow.db'}"
        run_id = old.get("run_id") if old.get("mlflow_uri") == cfg.mlflow_uri else None
        self.record["mlflow"] = {"mlflow_uri": cfg.mlflow_uri, "tracking_uri": uri, "run_id": run_id}
        artifacts = None if cfg.mlflow_uri else (self.out.resolve() / "mlartifacts").as_uri()
        return MLFlowLogger(experiment_name=f"workbench {self.kind}", run_name=self.out.resolve().name,
                            tracking_uri=uri, artifact_location=artifacts, run_id=run_id)

    def _wandb(self, cfg: TrackerConfig, old: dict):
        import wandb
        from pytorch_lightning.loggers import WandbLogger

        run_id = old.get("id") if old.get("project") == cfg.wandb_project else None
        run_id = run_id or secrets.token_hex(4)              # chosen here, so that a resume can name it
        mode = wandb_mode()
        self.record["wandb"] = {"id": run_id, "project": cfg.wandb_project, "mode": mode}
        settings = wandb.Settings(silent=True, console="off", disable_git=True, save_code=False,
                                  x_disable_stats=True, x_save_requirements=False)
        lg = WandbLogger(project=cfg.wandb_project, name=self.out.resolve().name, save_dir=str(self.out),
                         id=run_id, mode=mode, settings=settings)
        lg._wandb_init.pop("anonymous", None)    # Lightning passes anonymous=None, which W&B warns about
        return lg

    # --------------------------------------------------------------------------------------------- a run's life
    def start(self, trainer: pl.Trainer, config: dict) -> None:
        """In the open run folder, on global rank 0 (other ranks do nothing): add the MLflow and W&B loggers to
        ``trainer`` (their runs continue those of ``trackers.json`` on a resume), open the tracker runs (an MLflow
        run of a resume is set back to RUNNING), record their ids in ``trackers.json`` and log ``config`` as
        hyper-parameters to every tracker."""
        from .atomic import write_json
        from .utils import is_rank_zero

        if not is_rank_zero():                       # Lightning's loggers record on global rank 0 only; an MLflow
            return                                   # client on every rank would race to create the store
        record = _read_record(self.out) if self.resuming else {}
        if "mlflow" in self.names:
            self.loggers.append(self._mlflow(self.cfg, record.get("mlflow", {})))
        if "wandb" in self.names:
            self.loggers.append(self._wandb(self.cfg, record.get("wandb", {})))
        trainer.loggers = list(self.loggers)
        for lg in self.loggers:
            name = type(lg).__name__
            if name == "MLFlowLogger":
                client = lg.experiment                       # creates the run (or finds the resumed one)
                self.record["mlflow"]["run_id"] = lg.run_id
                if self.resuming:
                    client.update_run(lg.run_id, status="RUNNING")
            elif name == "WandbLogger":
                _ = lg.experiment
        if self.record:                              # a tracker this start does not use keeps its run for later
            write_json(self.out / RECORD, {**record, **self.record}, sort_keys=True)
        for lg in self.loggers:
            lg.log_hyperparams(self._params_for(lg, config))
            lg.save()

    def _params_for(self, lg, config: dict) -> dict:
        """``config`` as ``lg`` may take it: MLflow refuses to change a parameter it has, so a resumed run logs only
        the parameters its MLflow run lacks."""
        if type(lg).__name__ != "MLFlowLogger" or not self.resuming:
            return config
        from lightning_fabric.utilities.logger import _convert_params, _flatten_dict

        have = lg.experiment.get_run(lg.run_id).data.params
        return {k: v for k, v in _flatten_dict(_convert_params(dict(config))).items() if k not in have}

    def finish(self) -> None:
        """End the W&B run (Lightning leaves it open until the process exits: its files would be incomplete, and
        a second run in the same process would reuse it). Lightning finalizes the other trackers itself."""
        from .utils import is_rank_zero

        if not is_rank_zero():
            return
        for lg in self.loggers:
            if type(lg).__name__ == "WandbLogger" and lg._experiment is not None:
                lg._experiment.finish()
                lg._experiment = None


def _read_record(out: Path) -> dict:
    try:
        rec = json.loads((out / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


__all__ = ["TrackerConfig", "Trackers", "TokenThroughput", "TRACKERS", "TRACKER_SETTINGS", "check_trackers",
           "batch_tokens", "wandb_mode"]
