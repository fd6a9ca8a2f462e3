"""One writer per folder: an exclusive ``flock`` on ``<folder>/.lock``, whose text names the holder, and the record
of the folders this process holds.

The kernel releases an ``flock`` when its holder dies, so the lock file of a killed process is simply taken over by
the next one. A holder may remove its lock file when it is done (:func:`release` with ``unlink``, as result folders
do, so that a finished folder holds only its results): a process that opened the file just before it went sees,
once it holds the lock, that the path no longer names the file it locked (:func:`acquire` compares the inodes) and
tries again on the new file, so two processes never both hold one folder.

Which folders this process holds (:func:`holds`) is what lets a run write inside its own folder (a training run's
export, the demo's stages) while every other command is refused there.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from .atomic import disk_full_error, is_disk_full

#: The lock file of a folder (an ``flock``; its text names the holder).
LOCK = ".lock"


@dataclass
class _Hold:
    fd: int
    count: int
    folder: Path
    created: Path | None        # the highest folder this hold created (removed again if empty at release)


#: The folders this process holds, by absolute path, in the order they were taken.
_HELD: dict[str, _Hold] = {}


def _key(folder: str | os.PathLike) -> str:
    return os.path.abspath(folder)


def holds(folder: str | os.PathLike) -> bool:
    """Whether this process holds the lock of ``folder``."""
    return _key(folder) in _HELD


def held_fd(folder: str | os.PathLike) -> int | None:
    """The descriptor of ``folder``'s lock file if this process holds it, else None."""
    h = _HELD.get(_key(folder))
    return None if h is None else h.fd


def holder(folder: str | os.PathLike) -> str:
    """The text of ``folder``'s lock file: who holds (or last held) it ("another process" when unreadable)."""
    try:
        return (Path(folder) / LOCK).read_text().strip() or "another process"
    except (OSError, UnicodeDecodeError):
        return "another process"


def locked_by_another(folder: str | os.PathLike) -> bool:
    """Whether another process holds the lock of ``folder`` (creates nothing; False for a folder this process
    holds, or one without a lock file)."""
    if holds(folder):
        return False
    lock = Path(folder) / LOCK
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)                            # closing releases a lock taken here
    return False


def _highest_missing(folder: Path) -> Path | None:
    """The highest ancestor of ``folder`` (itself included) that does not exist (None: ``folder`` exists)."""
    top = None
    for q in (folder, *folder.parents):
        if q.exists():
            break
        top = q
    return top


def acquire(folder: str | os.PathLike, what: str) -> bool:
    """Take the lock of ``folder`` (created, with its parents, when absent) for ``what`` (the command, as
    "`workbench sol`", named in the lock file beside this process's id, host and start time). Returns False, taking nothing, when another process
    holds it; a folder this process already holds is taken again (released as often as taken).

    Raises :class:`~workbench.atomic.DiskFullError` on a full device (nothing left behind) and ``OSError`` when the
    folder cannot be created."""
    folder = Path(folder).absolute()
    key = _key(folder)
    if key in _HELD:
        _HELD[key].count += 1
        return True
    lock = folder / LOCK
    for _ in range(100):                        # a holder removing its lock file as we open it: try the new one
        created = _highest_missing(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            _remove_created(folder, created)
            if is_disk_full(e):
                raise disk_full_error(folder) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"process {os.getpid()} on {socket.gethostname()} ({what}, since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode())
        except OSError as e:
            _unlink_own(lock, fd)
            os.close(fd)
            _remove_created(folder, created)
            if is_disk_full(e):
                raise disk_full_error(lock) from None
            raise
        _HELD[key] = _Hold(fd, 1, folder, created)
        return True
    return False


def release(folder: str | os.PathLike, unlink: bool = True) -> None:
    """Release the lock of ``folder`` taken by :func:`acquire` (once per take). The last release removes the lock
    file when ``unlink`` (and it is still the one locked), closes it, and removes the folders the take created
    if they are empty again (a run that failed before writing anything leaves nothing behind)."""
    key = _key(folder)
    h = _HELD.get(key)
    if h is None:
        return
    h.count -= 1
    if h.count > 0:
        return
    del _HELD[key]
    if unlink:
        _unlink_own(Path(key) / LOCK, h.fd)
    os.close(h.fd)
    _remove_created(h.folder, h.created)


def moved(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Record that the held folder ``src`` was renamed to ``dst``, whose own hold (if any) it replaces: the
    lock ``dst`` had went with the folder that was moved away."""
    h = _HELD.pop(_key(src), None)
    if h is None:
        return
    old = _HELD.pop(_key(dst), None)
    if old is not None:
        os.close(old.fd)
        h.count, h.created = old.count, old.created
    h.folder = Path(_key(dst))
    _HELD[_key(dst)] = h


def _unlink_own(lock: Path, fd: int) -> None:
    """Remove ``lock`` if it is still the file ``fd`` locked."""
    try:
        if os.path.samestat(os.fstat(fd), os.stat(lock)):
            os.unlink(lock)
    except OSError:
        pass


def _remove_created(folder: Path, top: Path | None) -> None:
    """Remove ``folder`` and its parents up to ``top``, the folders a take created, while they are empty (a folder
    something was written into stays, and so do its parents)."""
    if top is None:
        return
    d = folder
    while True:
        try:
            d.rmdir()
        except OSError:
            return
        if d == top or d == d.parent:
            return
        d = d.parent


__all__ = ["LOCK", "acquire", "held_fd", "holder", "holds", "locked_by_another", "moved", "release"]
