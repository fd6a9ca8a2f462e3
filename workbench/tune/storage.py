"""Optuna storage and sampler choice shared by every study."""
from __future__ import annotations

from pathlib import Path

import optuna

OPTUNA_SAMPLERS = ("tpe", "nsga2")


def make_storage(storage: str | None, out_dir: Path):
    """``None`` → SQLite file ``out_dir/optuna.db``; an RDB URL (``sqlite:///``, ``postgresql://``, ...) →
    :class:`optuna.storages.RDBStorage`; any other string is a journal file path (many workers on many
    machines sharing a file system) → :class:`optuna.storages.JournalStorage`."""
    if storage is None:
        return f"sqlite:///{(out_dir / 'optuna.db').resolve()}"
    if "://" in storage:
        return storage
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(storage)))


def make_sampler(name: str, seed: int | None):
    """Optuna sampler by name (Optuna 5's multi-objective default is TPE; NSGA-II on request)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise ValueError(f"unknown Optuna sampler {name!r}; valid: {', '.join(OPTUNA_SAMPLERS)}")
