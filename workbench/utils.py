"""Small shared helpers: run directories, threads, timing."""
from __future__ import annotations

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


def check_replaceable(path: str | os.PathLike, kind: str | None = None) -> None:
    """``path`` may be replaced by a new output directory: it is absent, an empty directory, or one a
    workbench command built (it holds :data:`RUN_MARKER`) and, with ``kind``, not recorded as another kind of run
    (its ``run.json``). Anything else raises :class:`RunDirError`, so that ``--out_dir .`` or ``--out_dir runs``
    cannot delete a directory of other files, nor one command's results replace another's."""
    p = Path(path)
    store = enclosing_store(p)
    if store is not None:
        raise RunDirError(f"{p} {'is' if store == p.absolute() else 'lies inside'} the trajectory store {store}: "
                          "results must not mix with a store's arrays; choose another --out_dir")
    if not p.exists():
        return
    if not p.is_dir():
        raise RunDirError(f"{p} exists and is not a directory; choose another --out_dir")
    found = _recorded_kind(p)
    if kind is not None and found is not None and found != kind:
        raise RunDirError(f"{p} holds the results of `workbench {found}` (run.json); `workbench {kind}` will not "
                          "replace them: choose another --out_dir")
    if (p / RUN_MARKER).exists() or not any(p.iterdir()):
        return
    raise RunDirError(f"{p} exists and was not written by a workbench command (no {RUN_MARKER} in it), so it "
                      "will not be replaced; choose another --out_dir or remove it")


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
        rec = json.loads((p / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return rec.get("kind") if isinstance(rec, dict) else None


def check_out_dir(path: str | os.PathLike, kind: str | None = None) -> None:
    """Fail before any work, leaving nothing behind, if ``path`` cannot become a result directory: it must be
    replaceable (:func:`check_replaceable`) and writable (:func:`check_run_dir`). Raises :class:`RunDirError`."""
    check_replaceable(path, kind)
    check_run_dir(path)


@contextmanager
def staged_dir(final: str | os.PathLike, relocate: bool = False, kind: str | None = None,
               settings: dict | None = None) -> Iterator[Path]:
    """Build a directory in ``<final>.partial`` and move it to ``final`` only if the block succeeds.

    ``final`` must be a directory :func:`check_replaceable` accepts (checked first, :class:`RunDirError`).
    Yields the staging directory (created and checked writable; it holds :data:`RUN_MARKER`). On success an
    existing ``final`` is replaced by it; on any exception (Ctrl-C included) the staging directory is removed
    and the exception re-raised, so ``final`` is never half-written. With ``relocate``, text files
    inside (``.json``, ``.yaml``, ``.md``, ``.csv``) that name the staging path are rewritten to name
    ``final``: sub-runs built inside record their own output paths, which the move would leave stale.
    Binary files (Lightning checkpoints) keep the staging path in their stored hyper-parameters.
    ``kind``: the command writing the folder; it is recorded in ``run.json`` (with ``settings``), and an existing
    ``final`` recorded as another kind is refused (:func:`check_replaceable`)."""
    final = Path(final)
    check_replaceable(final, kind)
    run, old = Path(str(final) + ".partial"), Path(str(final) + ".old")
    for side in (run, old):                 # ours from an earlier attempt (or empty); a user's folder is kept
        if side.exists() and not (side.is_dir() and ((side / RUN_MARKER).exists() or not any(side.iterdir()))):
            raise RunDirError(f"{side} exists and was not written by a workbench command; it is where "
                              f"{final.name} is built or swapped: move it away, or choose another --out_dir")
    shutil.rmtree(run, ignore_errors=True)
    prepare_run_dir(run)
    try:
        (run / RUN_MARKER).touch()
        if kind is not None:
            from .atomic import write_json

            write_json(run / "run.json", {"kind": kind, "settings": settings or {}, "finished": True}, default=str)
        yield run
        if relocate:
            _relocate_paths(run, final)
        _swap_into_place(run, final)
    except BaseException:
        shutil.rmtree(run, ignore_errors=True)
        raise


def _swap_into_place(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is moved aside first and removed only after the rename,
    so at every moment one complete version exists (``<final>.old`` if the process dies between the renames)."""
    old = Path(str(final) + ".old")
    shutil.rmtree(old, ignore_errors=True)          # checked by staged_dir: ours, or empty
    if final.exists():
        final.rename(old)
    new.rename(final)
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
