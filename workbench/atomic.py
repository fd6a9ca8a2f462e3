"""Files written whole or not at all, and a full disk reported in one line.

Every file the workbench writes (checkpoints, exports, store metadata, reports, run records) goes to a temporary
name beside its destination and is renamed into place (``os.replace``, atomic on POSIX) only once it is complete,
so a full disk, a kill or a power cut leaves either the old file or the new one, never a truncated one.

A write that fails for lack of space raises :class:`DiskFullError`, a one-line error that names the path, the
bytes it needed and the bytes free, and says that a rerun after freeing space resumes.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

#: ``errno`` values that mean "the device cannot hold more": no space, a quota, a file-size limit.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFullError(OSError):
    """A write failed because the device is full (one line: path, bytes needed, bytes free, what to do)."""


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the file system that holds ``path`` (or its nearest existing ancestor); None if unknown."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) is an ``OSError`` of a full device."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def disk_full_error(path: str | os.PathLike | None, needed: int | None = None) -> DiskFullError:
    """The :class:`DiskFullError` of a write to ``path`` that needed about ``needed`` bytes."""
    free = free_bytes(path) if path else None
    sizes = [f"needs about {_size(needed)}"] if needed else []
    sizes += [f"{_size(free)} free"] if free is not None else []
    where = (f" writing {path}" if path else "") + (f" ({', '.join(sizes)})" if sizes else "")
    return DiskFullError(errno.ENOSPC, f"no space left on the device{where}; nothing was left half-written: free some "
                                       "space and rerun the same command to resume")


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


@contextmanager
def atomic_path(path: str | os.PathLike, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it is renamed to ``path``.

    On any exception the temporary file is removed and ``path`` is untouched; a full device becomes
    :class:`DiskFullError` (``needed``: bytes the write needed, for the message)."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e) or _torch_short_write(e, path, needed):
            raise disk_full_error(path, needed) from None
        raise


def _torch_short_write(e: BaseException, path: Path, needed: int | None) -> bool:
    """Whether ``e`` is how ``torch.save``'s C++ writer reports a full device (a ``RuntimeError`` such as
    "basic_ios::clear: iostream error", not an ``OSError``): a write of ``needed`` bytes that no longer fit."""
    free = free_bytes(path)
    return isinstance(e, RuntimeError) and bool(needed) and free is not None and free < needed


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns ``path``. Raises
    :class:`DiskFullError` on a full device."""
    with atomic_path(path, len(data)) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj, **kwargs) -> Path:
    """:func:`write_text` of ``json.dumps(obj, indent=2, **kwargs)`` plus a newline."""
    return write_text(path, json.dumps(obj, indent=2, **kwargs) + "\n")


def write_yaml(path: str | os.PathLike, obj) -> Path:
    """:func:`write_text` of ``obj`` as YAML (keys in their order)."""
    import yaml

    return write_text(path, yaml.safe_dump(obj, sort_keys=False))


__all__ = ["DiskFullError", "FULL_ERRNOS", "atomic_path", "disk_full_error", "free_bytes", "is_disk_full",
           "write_bytes", "write_json", "write_text", "write_yaml"]
