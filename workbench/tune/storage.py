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

    _check_journal(Path(storage))
    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(storage)))


def _check_journal(path: Path) -> None:
    """A journal path must be absent, empty, or an Optuna journal (JSON lines with an ``op_code``): Optuna
    would append to any other file. Raises ``ValueError``."""
    import json

    if path.is_dir():
        raise ValueError(f"--storage {path} is a directory; give a journal file path or an RDB URL")
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        first = f.readline()
    try:
        ok = "op_code" in json.loads(first)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"--storage {path} exists and is not an Optuna journal, so it is left untouched; give a "
                         "new file path, an existing journal, or an RDB URL such as sqlite:///study.db")


def make_sampler(name: str, seed: int | None):
    """Optuna sampler by name (Optuna 5's multi-objective default is TPE; NSGA-II on request)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise ValueError(f"unknown Optuna sampler {name!r}; valid: {', '.join(OPTUNA_SAMPLERS)}")


def open_study(name: str, storage: str | None, out_dir: Path, sampler: str = "tpe", seed: int | None = 0,
               **kwargs) -> optuna.Study:
    """Create the study ``name`` in ``make_storage(storage, out_dir)`` or resume it (``load_if_exists``).

    The sampler's seed is ``seed + n``, where n is the number of trials already in the study. With a fixed
    seed alone, a resumed study would redraw the first trials' parameters (TPE's start-up trials are random
    draws from that seed) and add duplicate points to the front. ``seed = None`` draws from the OS. Workers
    started together on one storage should each get their own seed (or ``None``): they see the same ``n``.
    ``kwargs`` go to :func:`optuna.create_study` (``directions``, ``direction``, ``pruner``)."""
    study = optuna.create_study(study_name=name, storage=make_storage(storage, out_dir), load_if_exists=True, **kwargs)
    study.sampler = make_sampler(sampler, None if seed is None else seed + len(study.trials))
    return study
