"""Small shared helpers: run directories, threads, timing."""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


class RunDirError(OSError):
    """Raised when a run directory cannot be created or written."""


def _not_writable(path, reason: str, option: str = "--out_dir") -> RunDirError:
    return RunDirError(f"run directory {path} is not writable ({reason}); choose another {option}")


def _probe_writable(base: Path, path, option: str = "--out_dir") -> None:
    """Make and remove a temporary directory in ``base``; :class:`RunDirError` naming ``path`` if that fails, or
    :class:`~workbench.atomic.DiskFullError` if the device is full (a rerun works once space is freed).
    A real write, because ``os.access`` answers yes for root on read-only or virtual file systems (``/proc``)."""
    from .atomic import disk_full_error, is_disk_full

    try:
        with tempfile.TemporaryDirectory(dir=base, prefix=".write-test-"):
            pass
    except OSError as e:
        if is_disk_full(e):
            raise disk_full_error(path) from None
        raise _not_writable(path, f"cannot create entries in {base}: {e.strerror or e}", option) from None


def prepare_run_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) and check it is writable; raise :class:`RunDirError` otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _not_writable(p, e.strerror or str(e)) from None
    _probe_writable(p, p)
    return p


def is_rank_zero() -> bool:
    """Whether this process is global rank 0, known before ``trainer.fit`` (Lightning reads the rank that its
    launcher or SLURM put in the environment). Files that one process writes (run folders, logs kept across
    resumes, the final model) are written by rank 0 only."""
    from pytorch_lightning.utilities import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def write_run_config(path: str | os.PathLike, config: dict) -> Path:
    """Create the training run directory ``path`` and write its resolved ``config.yaml`` (:func:`prepare_run_dir`),
    on global rank 0 only: the other ranks of a multi-device run write nothing. Returns the directory.
    Raises :class:`RunDirError`."""
    p = Path(path)
    if is_rank_zero():
        from .atomic import write_yaml

        p = prepare_run_dir(p)
        write_yaml(p / "config.yaml", config)
    return p


def check_run_dir(path: str | os.PathLike, option: str = "--out_dir") -> None:
    """Fail early, leaving nothing behind: ``path`` must be a writable directory or creatable under its
    nearest existing ancestor (probed with a real write there). ``option``: the command's option that named
    ``path``, for the message's fix (``--out`` for ``workbench collect``). Raises :class:`RunDirError` (same
    message as :func:`prepare_run_dir`)."""
    base = Path(path).absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise _not_writable(path, "not a directory", option)
    _probe_writable(base, path, option)


_TEXT_SUFFIXES = (".json", ".yaml", ".yml", ".md", ".csv")
#: An empty file in every directory :func:`staged_dir` builds: a rerun may replace such a directory.
RUN_MARKER = ".workbench-run"
#: The record of a run folder: the command that owns it (``kind``) and its settings (``workbench.run_folder``).
RUN_RECORD = "run.json"
#: Folders that keep a record of their own instead of :data:`RUN_RECORD`: record file → the command that writes it.
OWN_RECORDS = {"teacher.json": "deer teacher"}
#: Commands whose folder holds the runs of other commands as its own parts (the demo's stages).
NESTING_KINDS = ("demo",)


def folder_record(p: str | os.PathLike) -> tuple[str, str] | None:
    """``(kind, record file)`` of folder ``p``: the command its :data:`RUN_RECORD` names, or the command of a record
    of :data:`OWN_RECORDS` (a ``deer teacher`` folder's ``teacher.json``); None when it has neither (an export, a
    user's folder, an absent path)."""
    p = Path(p)
    kind = _recorded_kind(p)
    if kind is not None:
        return kind, RUN_RECORD
    for name, owner in OWN_RECORDS.items():
        if (p / name).is_file():
            return owner, name
    return None


def owning_run(path: str | os.PathLike) -> tuple[Path, str, str] | None:
    """The run folder that ``path`` lies inside: ``(folder, kind, record file)`` of its nearest ancestor (``path``
    itself excluded) that holds a run record (:func:`folder_record`); None if none does. A training run's exports
    (``model/``, ``sampler/``, ``adapter/``, ``drafter/``) and everything else inside a run folder belong to it."""
    for q in Path(path).absolute().parents:
        rec = folder_record(q)
        if rec is not None:
            return q, *rec
    return None


def _is_empty(p: Path) -> bool:
    """Whether directory ``p`` holds nothing but a lock file (:data:`~workbench.folder_lock.LOCK`)."""
    from .folder_lock import LOCK

    return all(q.name == LOCK for q in p.iterdir())


def _nested_run(p: Path) -> tuple[Path, str] | None:
    """A run folder or trajectory store inside ``p`` (``p`` itself excluded): ``(its path, what it is)``."""
    for d, dirs, files in os.walk(p):
        here = Path(d)
        if here == p:
            continue
        if "zarr.json" in files:
            return here, "the trajectory store"
        rec = folder_record(here)
        if rec is not None:
            return here, f"the `workbench {rec[0]}` run folder"
    return None


def check_replaceable(path: str | os.PathLike, kind: str | None = None) -> None:
    """``path`` may be replaced by a new output directory of the command ``kind`` (None: an export, such as a
    training run's ``model/``), without deleting anything another run wrote:

    * it is not a store nor inside one, and it does not lie inside the folder of another run (:func:`owning_run`)
      unless this process holds that folder's lock (a training run re-exporting its ``sampler/``, the demo writing
      its stages): an export belongs to the run that made it;
    * it is absent or an empty directory; or it holds the record of a ``kind`` run (the same command's results);
      or, for an export, it is an earlier export (it holds :data:`RUN_MARKER` and no record). A result command
      never replaces an export, nor a record of another command;
    * nothing inside it is another run folder or a store (only the demo's folder holds its stages' runs).

    Anything else raises :class:`RunDirError`, naming what the folder holds, so that ``--out_dir .`` or
    ``--out_dir runs`` cannot delete a directory of other files, nor one command's outputs replace another's."""
    from . import folder_lock

    p = Path(path)
    store = enclosing_store(p)
    if store is not None:
        raise RunDirError(f"{p} {'is' if store == p.absolute() else 'lies inside'} the trajectory store {store}: "
                          "results must not mix with a store's arrays; choose another --out_dir")
    owner = owning_run(p)
    if owner is not None and not folder_lock.holds(owner[0]):
        q, okind, rec = owner
        if p.is_dir() and (p / RUN_MARKER).exists() and folder_record(p) is None:
            raise RunDirError(f"{p} is an export of the `workbench {okind}` run {q} ({rec}): only a rerun of that "
                              "run replaces it; choose another --out_dir")
        raise RunDirError(f"{p} lies inside the `workbench {okind}` run folder {q} ({rec}): an output must not mix "
                          "with another run's files; choose another --out_dir")
    if not p.exists():
        return
    if not p.is_dir():
        raise RunDirError(f"{p} exists and is not a directory; choose another --out_dir")
    found = folder_record(p)
    if found is not None:
        fkind, rec = found
        held = "results" if rec == RUN_RECORD else "data"
        if kind is None:
            raise RunDirError(f"{p} holds the {held} of `workbench {fkind}` ({rec}); an export will not replace "
                              "them: choose another --out_dir")
        if fkind != kind:
            raise RunDirError(f"{p} holds the {held} of `workbench {fkind}` ({rec}); `workbench {kind}` will not "
                              "replace them: choose another --out_dir")
    elif _is_empty(p):
        return
    elif not (p / RUN_MARKER).exists():
        raise RunDirError(f"{p} exists and was not written by a workbench command (no {RUN_MARKER} in it), so it "
                          "will not be replaced; choose another --out_dir or remove it")
    elif kind is not None:
        raise RunDirError(f"{p} holds files that a workbench command exported ({RUN_MARKER}, no {RUN_RECORD}), not "
                          f"the results of `workbench {kind}`, so it will not be replaced; choose another --out_dir")
    if kind not in NESTING_KINDS:
        nested = _nested_run(p)
        if nested is not None:
            raise RunDirError(f"{p} holds {nested[1]} {nested[0]}, which replacing {p} would delete; choose another "
                              "--out_dir")


def enclosing_store(path: str | os.PathLike) -> Path | None:
    """The Zarr store that ``path`` is, or lies inside: the root of the nearest run of ancestors holding
    ``zarr.json`` (a store's groups hold one too, so ``st.zarr/B8`` gives ``st.zarr``); None if none."""
    p = Path(path).absolute()
    found = None
    for q in (p, *p.parents):
        if (q / "zarr.json").is_file():
            found = q
        elif found is not None:
            break
    return found


def _recorded_kind(p: Path) -> str | None:
    """The ``kind`` recorded in ``p/run.json`` (None if there is none or it cannot be read)."""
    import json

    try:
        rec = json.loads((p / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    kind = rec.get("kind") if isinstance(rec, dict) else None
    return kind if isinstance(kind, str) else None


def check_out_dir(path: str | os.PathLike, kind: str | None = None) -> None:
    """Fail before any work, leaving nothing behind, if ``path`` cannot become a result directory: it must be
    replaceable (:func:`check_replaceable`) and writable (:func:`check_run_dir`). Raises :class:`RunDirError`."""
    check_replaceable(path, kind)
    check_run_dir(path)


def in_use_error(path: str | os.PathLike, option: str = "--out_dir", locked: str | os.PathLike | None = None
                 ) -> RunDirError:
    """The one-line refusal of a folder whose lock another process holds, naming the holder (of the folder
    ``locked``, when that is not ``path`` itself: its staging folder)."""
    from .folder_lock import holder

    return RunDirError(f"{option} {path} is in use by {holder(locked or path)}; wait for it to finish (or stop it), "
                       f"or choose another {option}")


def _full_disk_here(e: BaseException, path: Path) -> BaseException | None:
    """The one-line :class:`~workbench.atomic.DiskFullError` naming ``path`` (or the file the error names) for a
    full-disk error ``e`` that does not name its path yet (a library's own writer); None for any other error."""
    from .atomic import DiskFullError, disk_full_error, is_disk_full

    if isinstance(e, DiskFullError) or not is_disk_full(e):
        return None
    return disk_full_error(getattr(e, "filename", None) or path)


@contextmanager
def holding(path: str | os.PathLike, kind: str | None = None) -> Iterator[Path]:
    """Hold the lock of the output folder ``path`` for the block: one process writes a folder at a time (the
    architecture's one-writer rule, as :func:`~workbench.run_folder.open_run` gives training runs). First
    :func:`check_replaceable` (for the command ``kind``) and :func:`check_run_dir`, creating nothing if they refuse;
    then ``path`` is created if absent and locked (``path/.lock`` names this process); the folder is checked again
    under the lock. A folder another process holds is refused in one line naming it; the lock of a dead process
    is taken over. On exit the lock file goes, and ``path`` too if this call created it and nothing was written.
    A folder this process already holds is simply held again.

    A full disk inside the block is reported naming ``path`` (:class:`~workbench.atomic.DiskFullError`).
    Raises :class:`RunDirError`."""
    from . import folder_lock

    p = Path(path)
    what = f"`workbench {kind}`" if kind else "an export"
    if not folder_lock.holds(p):
        check_replaceable(p, kind)
        check_run_dir(p)
    if not folder_lock.acquire(p, what):
        raise in_use_error(p)
    try:
        staging = Path(str(p) + ".partial")
        if folder_lock.locked_by_another(staging):      # another process is moving its results into place
            raise in_use_error(p, locked=staging) from None
        check_replaceable(p, kind)              # again under the lock: another process may have just written it
        yield p
    except BaseException as e:
        full = _full_disk_here(e, p)
        if full is not None:
            raise full from None
        raise
    finally:
        folder_lock.release(p)


def writes_out_dir(kind: str):
    """Decorator of a result command's function whose first argument is its config (a dataclass with
    ``out_dir``): the command holds ``out_dir`` (:func:`holding`) from its first line to its last, so that a second
    process started on the same folder is refused at once instead of replacing the first one's results."""
    def decorate(fn):
        @functools.wraps(fn)
        def run(cfg, *args, **kwargs):
            with holding(cfg.out_dir, kind):
                return fn(cfg, *args, **kwargs)
        return run
    return decorate


@contextmanager
def staged_dir(final: str | os.PathLike, relocate: bool = False, kind: str | None = None,
               settings: dict | None = None) -> Iterator[Path]:
    """Build a directory in ``<final>.partial`` and move it to ``final`` only if the block succeeds.

    ``final`` must be a directory :func:`check_replaceable` accepts (checked first, :class:`RunDirError`) and is
    held (:func:`holding`) until the end: one writer at a time. Yields the staging directory (created and checked
    writable; it holds :data:`RUN_MARKER`). On success an existing ``final`` is replaced by it; on any exception
    (Ctrl-C included) the staging directory is removed and the exception re-raised, so ``final`` is never
    half-written (a full disk is reported naming ``final``). With ``relocate``, text files
    inside (``.json``, ``.yaml``, ``.md``, ``.csv``) that name the staging path are rewritten to name
    ``final``: sub-runs built inside record their own output paths, which the move would leave stale.
    Binary files (Lightning checkpoints) keep the staging path in their stored hyper-parameters.
    ``kind``: the command writing the folder; it is recorded in ``run.json`` (with ``settings``), and an existing
    ``final`` recorded as another kind is refused (:func:`check_replaceable`). Without ``kind`` the folder is an
    export, which only replaces an earlier export (of a run this process holds, when inside one)."""
    from . import folder_lock

    final = Path(final)
    with holding(final, kind):
        run, old = Path(str(final) + ".partial"), Path(str(final) + ".old")
        for side in (run, old):             # ours from an earlier attempt (or empty); a user's folder is kept
            if side.exists() and not (side.is_dir() and ((side / RUN_MARKER).exists() or _is_empty(side))):
                raise RunDirError(f"{side} exists and was not written by a workbench command; it is where "
                                  f"{final.name} is built or swapped: move it away, or choose another --out_dir")
        shutil.rmtree(run, ignore_errors=True)
        prepare_run_dir(run)
        try:
            (run / RUN_MARKER).touch()
            folder_lock.acquire(run, f"`workbench {kind}`" if kind else "an export")   # held across the swap
            if kind is not None:
                from .atomic import write_json

                write_json(run / RUN_RECORD, {"kind": kind, "settings": settings or {}, "finished": True},
                           default=str)
            yield run
            if relocate:
                _relocate_paths(run, final)
            _swap_into_place(run, final)
        except BaseException:
            folder_lock.release(run)
            shutil.rmtree(run, ignore_errors=True)
            raise


def _swap_into_place(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is moved aside first and removed only after the rename,
    so at every moment one complete version exists (``<final>.old`` if the process dies between the renames).
    ``new``'s lock (held by this process) becomes ``final``'s. A process that created ``final`` in the instant
    between the renames finds ``new`` locked and withdraws (:func:`holding`); the rename waits for that."""
    import errno
    import time

    from . import folder_lock

    old = Path(str(final) + ".old")
    shutil.rmtree(old, ignore_errors=True)          # checked by staged_dir: ours, or empty
    if final.exists():
        final.rename(old)
    for attempt in range(500):
        try:
            new.rename(final)
            break
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == 499:
                raise
            time.sleep(0.01)
    folder_lock.moved(new, final)
    shutil.rmtree(old, ignore_errors=True)


def _relocate_paths(run: Path, final: Path) -> None:
    """Replace the path ``run`` by ``final`` in every text file under ``run`` (absolute forms included,
    since the relative path is a suffix of the absolute one)."""
    old, new = str(run), str(final)
    for f in run.rglob("*"):
        if f.suffix in _TEXT_SUFFIXES and f.is_file():
            text = f.read_text(errors="surrogateescape")
            if old in text:
                f.write_text(text.replace(old, new), errors="surrogateescape")


def step_generator(seed: int, step: int, salt: int, shard: int = 0):
    """A CPU ``torch.Generator`` seeded by ``(seed, step, salt)``: the random draws of a training or
    validation step depend only on the run seed and the step, so a resumed run repeats them exactly.

    ``shard``: which forward of the step this is, over ranks and accumulation steps
    (:func:`workbench.distributed.forward_index`); forward 0 draws what a one-device step draws, the others
    their own draws (so the ranks' rows do not share one noise pattern)."""
    import torch

    g = torch.Generator()
    base = ((seed * 1_000_003 + step) * 97 + salt) % (2**63 - 1)
    g.manual_seed(base if not shard else (base * 1_000_033 + shard) % (2**63 - 1))
    return g
