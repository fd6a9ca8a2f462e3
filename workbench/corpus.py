"""Corpora: the running interpreter's standard-library source (default), a directory of source files,
or a local text / JSONL file.

Every corpus is a list of :class:`Document` (relative path, category, split, text). The split is
decided per file by a stable hash (crc32 of the relative path; Python's ``hash`` is salted per
process), so the same file always lands in the same split on every machine and run.
"""
from __future__ import annotations

import functools
import json
import os
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

SPLITS = ("train", "validation", "test")
#: Default split fractions (train, validation, test) in percent of the crc32 range.
DEFAULT_FRACTIONS = (90, 5, 5)
#: Standard-library folders that are not stdlib source (third-party or caches).
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


class CorpusError(ValueError):
    """Raised for a missing, unreadable or empty corpus."""


@dataclass(frozen=True)
class Document:
    """One file of a corpus.

    Attributes:
        path: path relative to the corpus root (the split key).
        category: top-level package (``asyncio``, ``email``, ``test``...) or ``modules`` for top-level
            modules of the standard library; for JSONL corpora the ``category`` field if present.
        split: ``train``, ``validation`` or ``test``.
        text: the file's text.
    """

    path: str
    category: str
    split: str
    text: str


def split_of(rel_path: str, fractions: tuple[int, int, int] = DEFAULT_FRACTIONS) -> str:
    """Deterministic split for a relative path: ``crc32(path) % 100`` against cumulative percents."""
    if sum(fractions) != 100:
        raise CorpusError(f"split fractions must sum to 100, got {fractions}")
    bucket = zlib.crc32(rel_path.replace(os.sep, "/").encode("utf-8")) % 100
    if bucket < fractions[0]:
        return "train"
    if bucket < fractions[0] + fractions[1]:
        return "validation"
    return "test"


def category_of(rel_path: str) -> str:
    """Category of a file: its top-level package, or ``modules`` for a top-level module."""
    parts = Path(rel_path).parts
    return parts[0] if len(parts) > 1 else "modules"


def stdlib_root() -> Path:
    """Root folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _iter_source_files(root: Path, suffixes: tuple[str, ...]) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith(suffixes) and path.is_file():   # regular files only: a FIFO or /dev/zero never ends
                yield path


def load_directory(root: str | os.PathLike, suffixes: tuple[str, ...] = (".py",),
                   fractions: tuple[int, int, int] = DEFAULT_FRACTIONS) -> list[Document]:
    """Load every file under ``root`` whose name ends with one of ``suffixes``.

    Files that are not valid UTF-8, and entries that are not regular files (FIFOs, devices, links to them), are
    skipped. Raises :class:`CorpusError` if ``root`` does not
    exist or holds no matching non-empty file.
    """
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"corpus directory {root} does not exist; pass an existing folder of source files")
    docs = []
    for path in _iter_source_files(root, suffixes):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        rel = path.relative_to(root).as_posix()
        docs.append(Document(rel, category_of(rel), split_of(rel, fractions), text))
    if not docs:
        raise CorpusError(f"corpus {root} is empty: no non-empty {'/'.join(suffixes)} file found")
    return docs


def load_text_file(path: str | os.PathLike, fractions: tuple[int, int, int] = DEFAULT_FRACTIONS) -> list[Document]:
    """Load a ``.jsonl`` file (one document per line: a ``text`` field, optional ``category`` and ``id``)
    or a plain-text file, cut into documents at form-feed characters if it has any, else every 200
    lines (so a long file still spreads over the three splits).

    Raises :class:`CorpusError` for a missing file, a JSONL line without ``text``, or no document.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    try:
        return _load_text_file(path, fractions)
    except UnicodeDecodeError:
        raise CorpusError(f"corpus file {path} is not UTF-8 text") from None


def _load_text_file(path: Path, fractions: tuple[int, int, int]) -> list[Document]:
    docs: list[Document] = []
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    text = rec["text"]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise CorpusError(f"{path}:{i + 1}: each JSONL line needs a 'text' field ({e})") from None
                if not str(text).strip():
                    continue
                rel = str(rec.get("id", f"{path.name}#{i}"))
                docs.append(Document(rel, str(rec.get("category", "text")), split_of(rel, fractions), str(text)))
    else:
        text = path.read_text(encoding="utf-8")
        if "\f" in text:
            chunks = text.split("\f")
        else:
            lines = text.splitlines(keepends=True)
            chunks = ["".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
        for i, chunk in enumerate(chunks):
            if chunk.strip():
                rel = f"{path.name}#{i}"
                docs.append(Document(rel, "text", split_of(rel, fractions), chunk))
    if not docs:
        raise CorpusError(f"corpus {path} is empty: no non-empty document found")
    return docs


@functools.lru_cache(maxsize=4)
def _stdlib_documents(suffixes: tuple[str, ...]) -> tuple[Document, ...]:
    """The interpreter's standard library read once per process (it cannot change while we run); the
    demo's stages (evaluation, collection, sampler sweep, SOL) all start from it."""
    return tuple(load_directory(stdlib_root(), suffixes))


def load_corpus(source: str | None = None, suffixes: tuple[str, ...] = (".py",)) -> list[Document]:
    """Load a corpus by source: ``None`` or ``"stdlib"`` → the interpreter's standard library; an
    existing directory → its source files; a ``.txt`` / ``.jsonl`` file → its documents."""
    if source in (None, "", "stdlib"):
        return list(_stdlib_documents(suffixes))
    p = Path(source)
    if p.is_dir():
        return load_directory(p, suffixes)
    if p.is_file():
        return load_text_file(p)
    raise CorpusError(f"corpus {source!r} is neither 'stdlib', a directory nor a .txt/.jsonl file")


def by_split(docs: list[Document], split: str) -> list[Document]:
    """Documents of one split, in path order. Raises :class:`CorpusError` on an unknown or empty split."""
    if split not in SPLITS:
        raise CorpusError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    out = [d for d in docs if d.split == split]
    if not out:
        raise CorpusError(f"the {split} split of this corpus is empty; use a larger corpus")
    return out
