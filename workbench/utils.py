"""Small shared helpers: run directories, threads, timing."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


class RunDirError(OSError):
    """Raised when a run directory cannot be created or written."""


def prepare_run_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) and check it is writable; raise :class:`RunDirError` otherwise."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p, prefix=".write-test-"):
            pass
    except OSError as e:
        raise RunDirError(f"run directory {p} is not writable ({e.strerror or e}); choose another --out_dir") from None
    return p


def check_run_dir(path: str | os.PathLike) -> None:
    """Fail early, leaving nothing behind: ``path`` must be a writable directory or creatable under its
    nearest existing ancestor. The check makes and removes a temporary directory there, because
    ``os.access`` answers yes for root on read-only or virtual file systems such as ``/proc``.
    Raises :class:`RunDirError` (same message as :func:`prepare_run_dir`)."""
    p = Path(path).absolute()
    base = p
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise RunDirError(f"run directory {path} is not writable (not a directory); choose another --out_dir")
    try:
        with tempfile.TemporaryDirectory(dir=base, prefix=".write-test-"):
            pass
    except OSError as e:
        raise RunDirError(f"run directory {path} is not writable (cannot create entries in {base}: "
                          f"{e.strerror or e}); choose another --out_dir") from None


def step_generator(seed: int, step: int, salt: int):
    """A CPU ``torch.Generator`` seeded by ``(seed, step, salt)``: the random draws of a training or
    validation step depend only on the run seed and the step, so a resumed run repeats them exactly."""
    import torch

    g = torch.Generator()
    g.manual_seed(((seed * 1_000_003 + step) * 97 + salt) % (2**63 - 1))
    return g
