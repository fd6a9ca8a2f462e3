"""Run folders that know what they are: one module that every command uses to create, lock, identify and resume
its output folder.

A run folder holds a **run record**, ``run.json``, written before anything else::

    {"kind": "train sampler", "workbench": "0.1.0", "created": "...", "settings": {...}, "resumes": [...]}

* ``kind`` names the command that owns the folder (:data:`KINDS`); a command given a folder of another kind, a
  Zarr store, or a folder inside a store refuses before it writes anything, naming what it found.
* ``settings`` are the settings that define the run (paths made absolute). On a resume each one is compared with
  the command's: operational ones (``may_change``: progress bars, devices) may change; ``applied`` ones (a new
  learning rate) may change while the run is unfinished, and the command applies them; any other change is refused
  by name, with the recorded value, so a run never records one value and trains with another. Every resume and
  what it changed is logged in ``resumes``. A folder without its ``state`` (a training run's resume point) holds
  nothing that could mix, and takes new settings.
* One writer per folder: the process that opens a folder holds an exclusive ``flock`` on ``.lock`` (with its
  process id, host and command written inside) until it ends; a second process is refused in one line naming
  the holder. The kernel releases the lock when its holder dies, so a stale lock is taken over.

Folders written by a workbench before run records existed hold a ``config.yaml`` of the resolved settings; one
whose keys are this command's settings is adopted (its ``config.yaml`` is the record), any other is refused.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import folder_lock
from .atomic import write_json
from .folder_lock import LOCK
from .utils import (RUN_MARKER, RunDirError, check_run_dir, enclosing_store, folder_record, is_rank_zero,
                    owning_run)

#: The file that records a run folder's kind and settings.
RECORD = "run.json"
#: The ``state`` of a training run folder: its resume point (:func:`open_run`).
RESUME_POINT = "checkpoints/last.ckpt"
#: The kinds of folder the workbench writes (``kind`` of :func:`open_run`; a Zarr store is :data:`STORE_KIND`).
KINDS = ("train lm", "train sampler", "train lora", "train deer", "sweep", "sweep sampler", "deer teacher", "demo",
         "evaluate", "sol", "leaderboard", "drafter eval", "deer eval", "diffuspec", "simsd", "speculate")
#: What :func:`folder_kind` calls a Zarr store (a trajectory store).
STORE_KIND = "trajectory store"


#: Settings that never change a run's results, free to change on any rerun (where a command has them): how it
#: shows progress, which devices and how many data workers run it, its wall-clock limit, how often it logs.
OPERATIONAL = ("progress_bar", "resume", "accelerator", "devices", "num_nodes", "strategy", "micro_batch_size",
               "max_time", "log_every_n_steps", "num_workers", "strict_family", "attn_implementation")


#: Settings that name files or folders (where a command has them). The record keeps each as an absolute path when
#: it names an existing one, so a rerun from another working directory compares what the path points to, not the
#: string typed (names such as ``stdlib``, ``builtin:tiny`` or ``smollm2-135m`` are kept as they are).
PATH_SETTINGS = ("store", "extra_stores", "teacher", "train_data", "init_from", "lora_init", "drafter_init", "model",
                 "sampler", "corpus", "target", "prompts", "distill_cache", "storage")


def _absolute(value):
    if isinstance(value, list):
        return [_absolute(v) for v in value]
    if isinstance(value, str) and "://" not in value and os.path.exists(value):
        return str(Path(value).resolve())
    return value


def run_settings(cfg) -> dict:
    """The settings a run record keeps of the config dataclass ``cfg``: every field but ``out_dir`` (the folder
    itself), paths made absolute (:data:`PATH_SETTINGS`)."""
    from dataclasses import asdict

    return {k: _absolute(v) if k in PATH_SETTINGS else v for k, v in asdict(cfg).items() if k != "out_dir"}


def training_run(cfg, kind: str, may_change=(), applied=("lr",), **kw) -> dict:
    """The keyword arguments of :func:`check_run` / :func:`open_run` for the run folder of a ``train`` command's
    config ``cfg`` (a dataclass with ``out_dir`` and ``resume``): its settings (:func:`run_settings`), the
    :data:`OPERATIONAL` settings and ``may_change`` free to change, ``applied`` applied on resume (the learning
    rate, :class:`~workbench.resume.ResumeChanges`), and the resume point :data:`RESUME_POINT` as its state.
    ``kw``: more of their keywords (``legacy_defaults``)."""
    return dict(path=cfg.out_dir, kind=kind, settings=run_settings(cfg), may_change=(*OPERATIONAL, *may_change),
                applied=applied, resume=cfg.resume, state=RESUME_POINT, **kw)


class RunFolderError(RunDirError):
    """A run folder that this command may not use (another kind, changed settings, locked by another process)."""


def folder_kind(path: str | os.PathLike) -> str | None:
    """What the folder ``path`` is: its recorded kind (``run.json``, or a ``deer teacher`` folder's
    ``teacher.json``), :data:`STORE_KIND` for a Zarr store (``zarr.json``), or None (no record: absent, empty, an
    export, a user's folder, or written before run records)."""
    p = Path(path)
    if (p / "zarr.json").is_file():
        return STORE_KIND
    rec = read_record(p)
    if rec:
        return rec.get("kind")
    own = folder_record(p)
    return own[0] if own else None


def read_record(path: str | os.PathLike) -> dict | None:
    """The run record of folder ``path`` (None when it has none). Raises :class:`RunFolderError` for a damaged
    record."""
    f = Path(path) / RECORD
    if not f.is_file():
        return None
    try:
        rec = json.loads(f.read_text())
        if not isinstance(rec, dict) or not isinstance(rec.get("kind"), str):
            raise ValueError("no kind")
        return rec
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{f} is damaged ({e}); it is the record of what the run folder holds: restore it, or "
                             "choose another --out_dir") from None


def check_not_in_store(path: str | os.PathLike, option: str = "--out_dir") -> None:
    """Refuse (one line) a run folder ``path`` that is a Zarr store or lies inside one: a run would write its
    checkpoints and logs among the store's arrays."""
    store = enclosing_store(path)
    if store is not None:
        where = "is" if store == Path(path).absolute() else "lies inside"
        raise RunFolderError(f"{option} {path} {where} the trajectory store {store}: a run folder must not mix with "
                             f"a store's arrays; choose another {option}")


@dataclass
class RunFolder:
    """An open run folder (see the module docstring): ``path``, ``kind`` and the ``settings`` of this start. Holds
    the folder's lock until :meth:`close` (or the end of a ``with`` block, or the process)."""

    path: Path
    kind: str
    settings: dict
    _lock_fd: int | None = None

    def close(self) -> None:
        """Release the folder's lock."""
        if self._lock_fd is not None:
            folder_lock.release(self.path, unlink=False)
            self._lock_fd = None

    def __enter__(self) -> "RunFolder":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.close()
        _name_full_disk(exc, self.path)


def _name_full_disk(exc: BaseException | None, path: Path) -> None:
    """Raise the one-line :class:`~workbench.atomic.DiskFullError` naming ``path`` (or the file ``exc`` names) in
    place of ``exc``, a full-disk error of a library's own writer (Lightning's CSV log) that names no path."""
    from .atomic import DiskFullError, disk_full_error, is_disk_full

    if exc is not None and not isinstance(exc, DiskFullError) and is_disk_full(exc):
        raise disk_full_error(getattr(exc, "filename", None) or path) from None


def _jsonable(v):
    return json.loads(json.dumps(v, default=str))


def _legacy_settings(p: Path, kind: str, settings: dict) -> dict | None:
    """The settings of a folder written before run records (its ``config.yaml``, or a sweep's ``config.json``) if
    its keys are ``settings``' keys (the same command), else None."""
    import yaml

    f = next((p / n for n in ("config.yaml", "config.json") if (p / n).is_file()), None)
    if f is None:
        return None
    try:
        old = yaml.safe_load(f.read_text())     # JSON is YAML
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    if not isinstance(old, dict):
        return None
    old.pop("out_dir", None)
    if not set(old) <= set(settings) or len(old) < 0.9 * len(settings):
        return None
    return {k: _absolute(v) if k in PATH_SETTINGS else v for k, v in old.items()}


def check_not_in_built_folder(path: str | os.PathLike, option: str = "--out_dir") -> None:
    """Refuse (one line) a run folder ``path`` that is, or lies inside, a folder a workbench command built whole
    (it holds ``.workbench-run``: a training run's export, a result folder) unless this process is building it:
    the rerun that owns that folder replaces it whole, and would delete the run."""
    p = Path(path).absolute()
    for q in (p, *p.parents):
        if (q / RUN_MARKER).is_file() and not folder_lock.holds(q):
            owner = owning_run(q)
            rec = folder_record(q)
            what = (f"the results of `workbench {rec[0]}`" if rec else
                    f"an export of the `workbench {owner[1]}` run {owner[0]}" if owner else
                    "the export of a workbench command")
            where = "is" if q == p else f"lies inside {q}, which is"
            raise RunFolderError(f"{option} {path} {where} {what}: a rerun of the command that built it replaces it "
                                 f"whole, with everything inside; choose another {option}")


def _check_foreign(p: Path, kind: str, option: str) -> None:
    """Refuse a folder that holds something other than a ``kind`` run (or is not a folder)."""
    if p.exists() and not p.is_dir():
        raise RunFolderError(f"{option} {p} exists and is not a directory; choose another {option}")
    check_not_in_store(p, option)
    found = folder_kind(p)
    if found is not None and found != kind:
        rec = (folder_record(p) or (found, RECORD))[1]
        raise RunFolderError(f"{option} {p} holds a `workbench {found}` run ({rec}); `workbench {kind}` will not "
                             f"write into it: choose another {option}")
    check_not_in_built_folder(p, option)


def _check_unlocked(p: Path, option: str) -> None:
    """Refuse (one line naming the holder) a folder whose lock another process (or another run of this one)
    holds; creates nothing."""
    if folder_lock.holds(p) or folder_lock.locked_by_another(p):
        raise _in_use(p, option)


def _in_use(p: Path, option: str) -> RunFolderError:
    return RunFolderError(f"{option} {p} is in use by {folder_lock.holder(p)}; wait for it to finish (or stop it), "
                          f"or choose another {option}")


def _lock(p: Path, kind: str, option: str) -> int:
    """Take the folder's lock (non-blocking; :mod:`workbench.folder_lock`) and return its descriptor;
    :class:`RunFolderError` naming the holder if another process has it."""
    if folder_lock.holds(p) or not folder_lock.acquire(p, f"`workbench {kind}`"):
        raise _in_use(p, option)
    return folder_lock.held_fd(p)


def _compare(p: Path, recorded: dict, settings: dict, may_change, source: str) -> dict:
    """``{name: (recorded, now)}`` of the settings that changed; refuses (one line) any that may not."""
    changed = {k: (recorded[k], v) for k, v in settings.items() if k in recorded and recorded[k] != v}
    fixed = [k for k in changed if k not in may_change]
    if fixed:
        was = ", ".join(f"{k} {changed[k][0]!r} (now {changed[k][1]!r})" for k in fixed)
        fix = " ".join(f"--{k} {_cli_value(changed[k][0])}" for k in fixed)
        raise RunFolderError(f"{p} holds a run started with {was} ({source}); these cannot change on resume: rerun "
                             f"with {fix}, or choose a new --out_dir")
    return changed


def _cli_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, (list, dict)):
        return "'" + json.dumps(v) + "'"
    return str(v).lower() if isinstance(v, bool) else str(v)


def _recorded(p: Path, kind: str, settings: dict, option: str, resume: bool, legacy_defaults: dict | None,
              held: bool = False, state: str | None = None) -> tuple[dict | None, dict | None, str]:
    """``(record, recorded settings, where they come from)`` of folder ``p`` after refusing a foreign or (unless
    this process ``held`` its lock) a locked one; a new folder, or a ``kind`` folder without its ``state`` file
    (nothing a resume would continue), gives ``(None, None, "")``."""
    _check_foreign(p, kind, option)
    if p.is_dir() and not held:
        _check_unlocked(p, option)
    rec = read_record(p) if p.is_dir() else None
    if rec is not None:
        old, source = rec.get("settings", {}), RECORD
    elif p.is_dir() and any(q.name != LOCK for q in p.iterdir()):
        old, source = _legacy_settings(p, kind, settings), "config.yaml"
        if old is None:
            raise RunFolderError(f"{option} {p} holds files that are not a `workbench {kind}` run (no {RECORD}); "
                                 f"choose another {option}")
        old = {**(legacy_defaults or {}), **old}
    else:
        return None, None, ""
    if state is not None and not (p / state).exists():
        return None, None, ""                   # no state: the settings may change, the run starts afresh
    if not resume:
        raise RunFolderError(f"{p} already holds a `workbench {kind}` run and --resume is false: starting over would "
                             f"overwrite it; resume it (--resume true), or choose a new {option}")
    return rec, old, source


def check_run(path: str | os.PathLike, kind: str, settings: dict, may_change=(), option: str = "--out_dir",
              resume: bool = True, legacy_defaults: dict | None = None, applied=(), state: str | None = None,
              _held: bool = False) -> dict:
    """Every check of :func:`open_run` without writing anything (call it before minutes of set-up, so that a
    refusal leaves no trace). Returns the changes ``{name: (recorded, now)}`` a resume would apply."""
    if kind not in KINDS:
        raise ValueError(f"unknown run kind {kind!r}; valid: {', '.join(KINDS)}")
    p = Path(path)
    if not is_rank_zero():
        return {}
    settings = _jsonable(settings)
    rec, old, source = _recorded(p, kind, settings, option, resume, legacy_defaults, _held, state)
    check_run_dir(p)
    if old is None:
        return {}
    changes = _compare(p, old, settings, set(may_change) | set(applied), source)
    late = sorted(k for k in applied if k in changes) if rec is not None and rec.get("finished") else []
    if late:
        raise RunFolderError(f"{p} holds a finished `workbench {kind}` run; {', '.join(late)} cannot change now that "
                             f"no step is left to apply it to: rerun with its recorded "
                             f"{' '.join(f'--{k} {_cli_value(old[k])}' for k in late)} to export it again, or choose "
                             f"a new {option}")
    return changes


def open_run(path: str | os.PathLike, kind: str, settings: dict, may_change=(), option: str = "--out_dir",
             resume: bool = True, legacy_defaults: dict | None = None, applied=(), state: str | None = None
             ) -> RunFolder:
    """Create or reopen the ``kind`` run folder ``path`` for ``settings`` (see the module docstring).

    Every check runs before anything is written (:func:`check_run`): ``path`` must not be a file, a store, inside
    a store, or a folder of another kind or of a user's files; its recorded settings must equal ``settings`` except
    the names in ``may_change`` (a finished run's may not change at all); no other process may hold it. With
    ``resume=False`` a folder that already holds a run is refused (starting over would overwrite it).
    ``may_change``: settings that do not change results (progress bars, devices), free to change on any rerun;
    ``applied``: settings whose new value the command applies to the rest of the run (a new learning rate), which
    may change on the resume of an unfinished run only (a finished run has no step left to apply them to).
    ``legacy_defaults``: values of settings that a folder written before run records lacks in its ``config.yaml``.
    ``state``: the file (relative to the folder) whose presence means the run holds state that a resume continues
    (``checkpoints/last.ckpt``); a folder of this kind without it (a run that failed on bad input before its first
    checkpoint) starts afresh with the new settings. Then the folder is created, locked and its record written (the first file of a new folder). On other ranks
    than global rank 0 nothing is checked, locked or written.

    Returns the open :class:`RunFolder` (its lock held). Raises :class:`RunFolderError` (one line) or
    :class:`~workbench.utils.RunDirError` (an unwritable place).
    """
    p = Path(path)
    settings = _jsonable(settings)
    if not is_rank_zero():
        return RunFolder(p, kind, settings)
    check_run(p, kind, settings, may_change, option, resume, legacy_defaults, applied, state)
    fd = _lock(p, kind, option)                  # creates the folder (and its parents) if absent
    try:                                        # again under the lock: another process may have just written it
        changes = check_run(p, kind, settings, may_change, option, True, legacy_defaults, applied, state, _held=True)
        rec = read_record(p)
        if rec is not None and state is not None and not (p / state).exists():
            rec = None                          # nothing to resume: a fresh record for the new settings
        resumed = rec is not None or any((p / n).is_file() for n in ("config.yaml", "config.json"))
        now = time.strftime("%Y-%m-%dT%H:%M:%S")
        if rec is None:
            rec = {"kind": kind, "workbench": _version(), "created": now, "settings": settings, "resumes": []}
        rec["settings"] = {**rec.get("settings", {}), **settings}
        rec["finished"] = False                 # until the command says so (update_record)
        if resumed:
            rec["resumes"] = [*rec.get("resumes", []), {"at": now, "changes": {k: list(v) for k, v in changes.items()}}]
        write_json(p / RECORD, rec, ensure_ascii=False)
    except BaseException as e:
        folder_lock.release(p)                  # a folder this call created goes again (a full disk: no record)
        _name_full_disk(e, p)
        raise
    return RunFolder(p, kind, settings, fd)


@contextmanager
def locked_folder(path: str | os.PathLike, kind: str, option: str = "--out_dir") -> Iterator[Path]:
    """Hold the lock of folder ``path`` (created if absent) for the block: the one-writer rule of :func:`open_run`
    for a command whose folder keeps its own record (``deer teacher``'s ``teacher.json``). A folder that is a
    store or lies inside one, or that another process holds, is refused (one line) before anything is written."""
    p = Path(path)
    check_not_in_store(p, option)
    check_not_in_built_folder(p, option)
    if p.is_dir():
        _check_unlocked(p, option)
    p.mkdir(parents=True, exist_ok=True)
    _lock(p, kind, option)
    try:
        yield p
    except BaseException as e:
        _name_full_disk(e, p)
        raise
    finally:
        folder_lock.release(p, unlink=False)


def update_record(folder: RunFolder, **fields) -> None:
    """Set ``fields`` in the run record of the open ``folder`` (e.g. ``finished=True`` once the run's outputs are
    written). Rank 0 only (other ranks hold no lock)."""
    if folder._lock_fd is None:
        return
    rec = read_record(folder.path) or {}
    rec.update(_jsonable(fields))
    write_json(folder.path / RECORD, rec, ensure_ascii=False)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("workbench")
    except Exception:  # noqa: BLE001 - not installed as a package
        return "unknown"


__all__ = ["KINDS", "LOCK", "OPERATIONAL", "RESUME_POINT", "training_run", "run_settings", "RECORD", "STORE_KIND", "RunFolder", "RunFolderError", "check_not_in_built_folder", "check_not_in_store", "check_run",
           "enclosing_store", "folder_kind", "locked_folder", "open_run", "read_record", "update_record"]
