"""The Zarr v3 trajectory store: create / open, the resumable shard writer, the reader, ``info`` and ``verify``.

Layout of a store directory (zarr v3, local filesystem)::

    zarr.json               root attrs: schema_version + the collection settings (model_fingerprint,
                            tokenizer_hash, policy, feature_spec, corpus_split, seed, categories, threshold, ...)
    token_pca               (V, pca_dim) float16, optional: PCA of the model's token embeddings (pca_dim from
                            feature_spec: 44 for the default 144-dim features)
    prompt_document         (n_prompts,) int64, optional: per prompt id, crc32 of its source file's path (-1: no
                            such prompt); a held-out split by document keeps every cut of one file on one side
    B{B}/                   one group per block length (attr block_length)
      shard-{rank:03d}/     one group per writer process; attr "commit" = the commit record (see ShardWriter)
        rows/<name>         row arrays, schema.row_array_specs(B)
        trajectories/<name> trajectory arrays, schema.traj_array_specs(B)
        items               (n_items, 3) int64 work-item bookkeeping, columns schema.ITEM_COLUMNS

Chunking. Row arrays are sharded: one shard (= one file, the writer's write unit) holds ``rows_per_chunk``
rows (default 16384, ~11.7 MB raw at B = 32) split into inner chunks of 256 rows (~100 KB of ``top_ids`` at
B = 32), so a random row costs one small read + decode; 16384-row shards keep a 10M-row store at ~600 files
per array. Whole shards are encoded by ``shardio.ShardEncoder`` and random rows read by
``shardio.ShardedRows`` (zarr's per-inner-chunk pipeline overhead made both 3-20x slower); everything else
goes through zarr. Trajectory arrays use plain chunks of ``traj_per_chunk`` (1024) trajectories, ``items``
chunks of 4096. Every chunk is blosc-lz4 + byte shuffle (fast both ways; small token ids compress well).
Arrays are written with ``write_empty_chunks=True`` so a missing chunk file always means damage.

Durability. Every file write in zarr's LocalStore is atomic (temporary file + rename), and so are the shard
files of ``shardio``: a full disk or a kill leaves the old file or the new one, never a damaged metadata file
(``zarr.json``: attrs, commit records) or chunk. The writer appends whole chunks, writes the data first and
the commit record last; on open it rolls every array back to the end of the last fully committed work item.
So a writer may be SIGKILLed at any point and a restart with the same arguments produces the same arrays as
an uninterrupted run. One process per shard group (an flock on the shard directory enforces it). Consolidated
metadata is never used (it goes stale after appends).

A full disk is reported as one :class:`~workbench.atomic.DiskFullError` naming the store or shard; what was
committed before stays committed, a store or shard group whose creation failed is removed, and a rerun of the
same ``workbench collect`` command after freeing space resumes.

Identity. Root attr ``kind`` is ``"trajectory store"`` (stores written before it lack it and still open).
:func:`content_identity` hashes the attrs that determine a store's rows: two stores with one identity (a copy,
or two collections with the same settings) hold the same rows for every work item both committed.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import zarr
from zarr.codecs import BloscCodec

from ..atomic import DiskFullError, disk_full_error, is_disk_full
from ..run_folder import STORE_KIND, enclosing_store, folder_kind
from .schema import ITEM_COLUMNS, PCA_DIM, SCHEMA_VERSION, row_array_specs, row_nbytes, traj_array_specs
from .shardio import fast_reader, fast_writer

ROW_INNER_CHUNK = 256          # rows per inner chunk of a row-array shard
DEFAULT_ROWS_PER_CHUNK = 16384  # rows per shard file = the writer's write unit
DEFAULT_TRAJ_PER_CHUNK = 1024
ITEM_CHUNK = 4096
GROW_CHUNKS = 16               # arrays grow in steps of 16 write units (fewer metadata rewrites)
SLICE_BYTES = 32 << 20         # verify / info read this many raw bytes of rows at a time
COMPRESSORS = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
_WRITE_CFG = {"write_empty_chunks": True}
_EMPTY_COMMIT = {"rows": 0, "trajs": 0, "items": 0, "item_rows": 0, "item_trajs": 0}


class _PendingChunkTaskFilter(logging.Filter):
    """zarr 3 reads the chunks of one slice as concurrent asyncio tasks on its own event loop. When one chunk is
    damaged, its error is raised (and reported by us in one line) while its sibling tasks are left pending; when
    they are garbage-collected, asyncio logs "Task was destroyed but it is pending!" for each, a screenful after
    the one-line error. This drops exactly those records."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Task was destroyed but it is pending")


def quiet_zarr_task_noise() -> None:
    """Drop the pending-task records of a damaged slice (:class:`_PendingChunkTaskFilter`) and the same siblings'
    "never awaited" RuntimeWarning, printed at interpreter exit when they never started. Runs on import; call it
    again after resetting the warning filters."""
    if not any(isinstance(f, _PendingChunkTaskFilter) for f in logging.getLogger("asyncio").filters):
        logging.getLogger("asyncio").addFilter(_PendingChunkTaskFilter())
    warnings.filterwarnings("ignore", message="coroutine 'concurrent_map.<locals>.run' was never awaited",
                            category=RuntimeWarning)


quiet_zarr_task_noise()


def _settle_zarr_tasks(timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` seconds) for the chunk tasks still running on zarr's event loop, and mark their
    exceptions retrieved. Called when a chunk read failed: the failed chunk's siblings keep running, and if the
    interpreter exits first they print tracebacks and warnings after our one-line error. Best effort: a no-op
    when zarr's loop (``zarr.core.sync.loop``, not a public API) is not there."""
    import asyncio

    try:
        from zarr.core import sync as zsync

        lp = zsync.loop[0]
        if lp is None or not lp.is_running():
            return

        async def wait() -> None:
            me = asyncio.current_task()
            pending = [t for t in asyncio.all_tasks() if t is not me]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
            for t in pending:
                if t.done() and not t.cancelled():
                    t.exception()

        asyncio.run_coroutine_threadsafe(wait(), lp).result(timeout + 1)
    except Exception:  # noqa: BLE001 - best effort only
        pass


class StoreError(ValueError):
    """A one-line, user-facing store problem: what is wrong and how to fix it."""


@contextmanager
def reporting_full_disk(path):
    """Turn an ``OSError`` of a full device raised inside the block into one :class:`DiskFullError` naming
    ``path`` (the store or shard being written); other exceptions pass unchanged."""
    try:
        yield
    except OSError as e:
        if isinstance(e, DiskFullError) or not is_disk_full(e):
            raise
        raise disk_full_error(path) from None


# ----------------------------------------------------------------------------------------------- create / open
def _jsonable(attrs: dict) -> dict:
    """``attrs`` as zarr stores them (JSON round trip; numpy scalars / arrays become Python values)."""
    def default(o):
        if isinstance(o, (np.generic, np.ndarray)):
            return o.tolist()
        raise TypeError(f"store attribute value {o!r} is not JSON-serialisable")
    try:
        return json.loads(json.dumps(attrs, default=default))
    except TypeError as e:
        raise StoreError(f"{e}: pass str / int / float / list / dict values") from None


def _block_lengths(root: zarr.Group) -> list[int]:
    return sorted(int(k[1:]) for k in root.group_keys() if re.fullmatch(r"B\d+", k))


def _pca_width(attrs: dict) -> int:
    """Columns of ``token_pca``: the ``pca_dim`` of the store's ``feature_spec`` (44 for the default 144-dim
    features), or :data:`PCA_DIM` when the attrs give none."""
    spec = attrs.get("feature_spec")
    return int(spec["pca_dim"]) if isinstance(spec, dict) and "pca_dim" in spec else PCA_DIM


def create_store(path, attrs: dict, block_lengths: list[int], token_pca: np.ndarray | None = None,
                 growable: tuple[str, ...] = (), extend: bool = False, replaceable: tuple[str, ...] = (),
                 prompt_document: np.ndarray | None = None, derived: tuple[str, ...] = ()) -> None:
    """Create a store at ``path`` (root attrs ``{"schema_version": SCHEMA_VERSION, "kind": "trajectory store",
    **attrs}``, one group ``B{B}`` per block length, optional ``token_pca`` (V, pca_dim) stored as float16, pca_dim
    from ``attrs["feature_spec"]``, 44 by default, and optional ``prompt_document``, recorded as
    :func:`record_prompt_documents` does).

    If a store with identical attrs, block lengths and ``token_pca`` exists this is a no-op (how resume
    re-opens it). Raises StoreError if it exists with different settings or ``path`` is something else.

    ``growable`` names attrs that may differ from an existing store's when every new value is at least the old
    one (ints, or dicts of ints compared key by key, e.g. the planned ``work_items`` per B). With ``extend`` the
    store is then extended: its root attrs are rewritten with the new values in one atomic write. Without it,
    such a difference is refused with a hint to ``--extend true``. The caller checks that the larger plan keeps
    the old one as its prefix (``workbench collect --extend``).

    ``derived`` names attrs that follow from others (the prompts' ``categories`` from ``n_prompts``): a difference
    in them is reported only when no other setting differs, so that the refusal names the setting that was changed.

    ``replaceable`` names attrs the caller has already checked against the existing store (the prompt digest of
    ``workbench collect``): once every other setting matched, a new value is written (or added to a store that
    lacks it) instead of refused.

    A store without ``kind`` (written before it existed) is given it; one of another kind is refused.

    Atomic against concurrent creators: the whole check-or-create runs under an exclusive lock on the directory
    that holds the store (:func:`_creation_lock`), so of two collections started at once into a new path, the
    second finds the first's finished store and is refused if its settings differ.

    All or nothing: a creation that fails (a full disk, Ctrl-C) removes what it wrote (and the parent
    directories it made), so ``path`` is as before; a kill leaves a partial store that the next call completes
    (the root attrs, written last, mark it complete). Raises :class:`DiskFullError` on a full disk.
    """
    p = Path(path)
    made = _missing_ancestor(p.parent)
    try:
        with reporting_full_disk(p):
            p.parent.mkdir(parents=True, exist_ok=True)
            with _creation_lock(p):
                _create_store_locked(p, attrs, block_lengths, token_pca, tuple(growable), extend, tuple(replaceable),
                                     prompt_document, tuple(derived))
    except BaseException:
        _remove_empty_dirs(p.parent, made)
        raise


def _missing_ancestor(p: Path) -> Path | None:
    """The outermost ancestor-or-self of ``p`` that does not exist yet (None: ``p`` exists)."""
    missing = None
    for q in (p, *p.parents):
        if q.exists():
            return missing
        missing = q
    return missing


def _remove_empty_dirs(p: Path, top: Path | None) -> None:
    """Remove ``p`` and its ancestors up to ``top`` while they are empty (the parents a failed creation made)."""
    if top is None:
        return
    for q in (p, *p.parents):
        try:
            q.rmdir()
        except OSError:
            return
        if q == top:
            return


def _not_smaller(new, old) -> bool:
    """``new >= old`` for ints, key by key for dicts of ints (a key missing from ``new`` counts as smaller)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _not_smaller(new[k], v) for k, v in old.items())
    return isinstance(old, int) and isinstance(new, int) and new >= old


@contextmanager
def _creation_lock(p: Path):
    """An exclusive ``flock`` on the directory that holds store ``p`` (released when the block ends or the process
    dies). Locking the directory itself leaves no lock file behind; creations of other stores in the same
    directory wait for each other, which costs little (a creation takes milliseconds). Stores created before this
    lock left an empty ``.<name>.create-lock`` file beside them: harmless, and safe to delete."""
    fd = os.open(p.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


#: Entries of a store directory whose creation was interrupted (``zarr.<hex>.partial``: the temporary file of a
#: root-metadata write a kill interrupted).
_CREATION_ENTRIES = r"zarr\.json|token_pca|prompt_document|B\d+|zarr\.\w+\.partial"


def _create_store_locked(p: Path, attrs: dict, block_lengths: list[int], token_pca: np.ndarray | None,
                         growable: tuple[str, ...] = (), extend: bool = False,
                         replaceable: tuple[str, ...] = (), prompt_document: np.ndarray | None = None,
                         derived: tuple[str, ...] = ()) -> None:
    attrs = {"schema_version": SCHEMA_VERSION, "kind": STORE_KIND, **_jsonable(attrs)}
    lens = sorted({int(b) for b in block_lengths})
    if not lens or min(lens) < 1:
        raise StoreError(f"block_lengths {block_lengths} must be a non-empty list of positive ints")
    if token_pca is not None:
        token_pca = np.asarray(token_pca, dtype=np.float16)
        k = _pca_width(attrs)
        if token_pca.ndim != 2 or token_pca.shape[1] != k:
            raise StoreError(f"token_pca has shape {token_pca.shape}, expected (V, {k}): fit the PCA with {k} components")
    if (p / "zarr.json").is_file():
        try:
            root = zarr.open_group(p, mode="r")
        except Exception:  # noqa: BLE001 - a zarr array or unreadable metadata: not ours
            raise StoreError(f"{p} exists and is not a workbench trajectory store: choose another path") from None
        if "schema_version" in root.attrs:  # a finished store: compare settings
            old = {"block_lengths": _block_lengths(root), **dict(root.attrs)}
            new = {"block_lengths": lens, **attrs}
            if old.get("kind", STORE_KIND) != STORE_KIND:
                raise StoreError(f"{p} is a {old['kind']!r}, not a workbench trajectory store: choose another path")
            grown = {}
            # a setting the user gave is named before one derived from it (the prompts' categories follow from
            # n_prompts), and a fixed one before a growable one (which --extend could only fix if the rest matched)
            for key in sorted(set(old) | set(new), key=lambda k: (k in derived, k in growable, str(k))):
                if old.get(key) == new.get(key):
                    continue
                if (key in replaceable or key == "kind") and key in new:
                    grown[key] = new[key]                        # written below, once the rest matched
                    continue
                larger = key in growable and _not_smaller(new.get(key), old.get(key))
                if larger and extend:
                    grown[key] = new[key]
                    continue
                how = ("a larger plan extends the store with --extend true; or use a new path" if larger else
                       "the store holds a larger plan: rerun with its settings (`workbench store info`), or use a "
                       "new path" if key in growable else "use a new path or delete it")
                raise StoreError(f"store {p} was created with different settings ({key}: {old.get(key)!r} != "
                                 f"{new.get(key)!r}); {how}")
            # the PCA of the same model (same fingerprint) can differ in the last float16 ulp with the BLAS thread count
            if token_pca is not None and ("token_pca" not in root or not np.allclose(
                    root["token_pca"][:].astype(np.float32), token_pca.astype(np.float32), rtol=1e-2, atol=1e-2)):
                raise StoreError(f"store {p} was created with different settings (token_pca differs); use a new path or delete it")
            if grown:
                zarr.open_group(p, mode="r+").update_attributes(grown)   # one atomic zarr.json write
            if prompt_document is not None:
                _record_documents_locked(p, prompt_document)
            return
    if p.exists() and not (p.is_dir() and _only_creation_entries(p)):
        raise StoreError(f"{p} exists and is not a workbench trajectory store: choose another path")
    # New store, or an interrupted create_store: build from scratch; root attrs last (they mark it complete).
    existed = p.exists()
    try:
        _undo_creation(p, existed)      # an interrupted creation's entries (not the directory: it may be a mount point)
        root = zarr.open_group(p, mode="w-")
        for b in lens:
            root.create_group(f"B{b}", attributes={"block_length": b})
        if token_pca is not None:
            arr = root.create_array("token_pca", shape=token_pca.shape, dtype=np.float16,
                                    chunks=(min(len(token_pca), 8192) or 1, token_pca.shape[1]), compressors=COMPRESSORS)
            arr[:] = token_pca
        if prompt_document is not None:
            _documents_array(p / "prompt_document", prompt_document)
        root.update_attributes(attrs)  # one atomic zarr.json write (attrs.update rewrites it once per key)
    except (zarr.errors.ContainsGroupError, zarr.errors.ContainsArrayError):
        _undo_creation(p, existed)
        raise StoreError(f"another collection holds the store {p} (it created it meanwhile); wait for it or use "
                         "another --out") from None
    except BaseException:
        _undo_creation(p, existed)
        raise


def _only_creation_entries(p: Path) -> bool:
    """Whether directory ``p`` holds nothing but what a store's creation writes (empty counts)."""
    return all(re.fullmatch(_CREATION_ENTRIES, f) for f in os.listdir(p))


def _undo_creation(p: Path, existed: bool) -> None:
    """Remove what a failed creation wrote at ``p``: the directory, or only its entries when it existed before
    (an empty directory given as the store path, which may be a mount point)."""
    if not existed:
        shutil.rmtree(p, ignore_errors=True)
        return
    for f in os.listdir(p) if p.is_dir() else ():
        if re.fullmatch(_CREATION_ENTRIES, f):
            q = p / f
            shutil.rmtree(q, ignore_errors=True) if q.is_dir() else q.unlink(missing_ok=True)


def check_store_path(path, option: str = "--out") -> None:
    """Refuse, before anything is written, a path that cannot become (or be resumed as) a trajectory store: it must
    be absent (outside any store), an empty directory, or a trajectory store (``zarr.json``; :func:`create_store`
    then compares its settings). A file, a symbolic link that leads nowhere (a loop, a missing target), a
    workbench run folder (``run.json``), a directory of other files and a path inside a store are refused.
    Raises :class:`StoreError` (one line naming ``option`` and what was found)."""
    p = Path(path)
    fix = f"choose another {option}: a new path, an empty directory or a trajectory store"
    if os.path.lexists(p) and not p.exists():
        raise StoreError(f"{option} {p} is a symbolic link that leads nowhere (a loop, or a missing target); {fix}")
    if p.exists() and not p.is_dir():
        raise StoreError(f"{option} {p} exists and is not a directory; {fix}")
    if p.is_dir() and (p / "zarr.json").is_file():
        return
    store = enclosing_store(p)
    if store is not None:
        raise StoreError(f"{option} {p} lies inside the trajectory store {store}; {fix}")
    if not p.is_dir():
        return
    kind = folder_kind(p)
    if kind is not None:
        raise StoreError(f"{option} {p} holds a `workbench {kind}` run, not a trajectory store; {fix}")
    if not _only_creation_entries(p):
        raise StoreError(f"{option} {p} is a directory of other files, not a trajectory store; {fix}")


def record_prompt_documents(path, documents: np.ndarray) -> None:
    """Write the root array ``prompt_document`` ``(n_prompts,)`` int64 (per prompt id, crc32 of its file's path).

    Written when the store lacks it (a store collected before it existed gets it on resume) or holds a shorter one
    (``--extend`` added prompts); otherwise a no-op. The array is built beside the store and renamed into place,
    so a kill leaves either no array or a whole one, and a failed write (a full disk) leaves nothing beside the
    store. Raises :class:`StoreError` when the recorded documents are not a prefix of ``documents`` (the corpus
    changed under the store, which its prompt digest also refuses), :class:`DiskFullError` on a full disk.
    """
    p = Path(path)
    with reporting_full_disk(p), _creation_lock(p):
        _record_documents_locked(p, documents)


def _documents_array(where: Path, documents: np.ndarray) -> None:
    """Write ``documents`` as the int64 zarr array at ``where`` (a new path)."""
    documents = np.asarray(documents, dtype=np.int64)
    arr = zarr.create_array(str(where), shape=documents.shape, dtype=np.int64,
                            chunks=(max(1, min(len(documents), 1 << 16)),), compressors=COMPRESSORS,
                            config={"write_empty_chunks": True})
    arr[:] = documents


def _record_documents_locked(p: Path, documents: np.ndarray) -> None:
    """:func:`record_prompt_documents` under the creation lock."""
    documents = np.asarray(documents, dtype=np.int64)
    root = zarr.open_group(p, mode="r")
    if "prompt_document" in root:
        old = root["prompt_document"][:]
        n = min(len(old), len(documents))
        if not np.array_equal(old[:n], documents[:n]):
            raise StoreError(f"store {p} records other source files for its prompts than this corpus gives: "
                             "collect into a new path")
        if len(old) >= len(documents):
            return
    tmp = p.parent / f".{p.name}.prompt_document.partial"
    old = p.parent / f".{p.name}.prompt_document.old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _documents_array(tmp, documents)
        shutil.rmtree(old, ignore_errors=True)
        if (p / "prompt_document").exists():
            os.replace(p / "prompt_document", old)       # a reader meanwhile may miss the record, never read half
        try:
            os.replace(tmp, p / "prompt_document")
        except BaseException:
            if old.exists():
                os.replace(old, p / "prompt_document")    # keep the old record
            raise
    finally:                                             # a failed write (a full disk) leaves nothing beside the store
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def check_metadata(path: Path) -> None:
    """Every ``zarr.json`` of the store must be UTF-8 JSON; raises :class:`StoreError` naming the first damaged
    file (zarr itself only says ``Expecting value: line 1 column 1``)."""
    for f in sorted(Path(path).rglob("zarr.json")):
        try:
            json.loads(f.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise StoreError(f"the store is damaged: metadata file {f} is not valid JSON; restore it, or delete its "
                             "shard group (or the store) and re-run the collection") from None


def open_store(path) -> zarr.Group:
    """Open a store read-only. Raises StoreError if it is missing, not a workbench store, or newer than this code."""
    p = Path(path)
    if not (p / "zarr.json").is_file():
        raise StoreError(f"no trajectory store at {p}: check the path or collect one first")
    check_metadata(p)
    try:
        root = zarr.open_group(p, mode="r")
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"{p} is not a readable zarr group ({type(e).__name__}): check the path") from None
    version = root.attrs.get("schema_version")
    if not isinstance(version, int):
        if not dict(root.attrs) and _only_creation_entries(p):
            raise StoreError(f"store {p} was never finished (its creation was interrupted): rerun the same "
                             "`workbench collect` command to create it")
        raise StoreError(f"{p} is not a workbench trajectory store (no schema_version attribute): check the path")
    if root.attrs.get("kind", STORE_KIND) != STORE_KIND:
        raise StoreError(f"{p} is a {root.attrs['kind']!r}, not a workbench trajectory store: check the path")
    if version > SCHEMA_VERSION:
        raise StoreError(f"store schema version {version} is newer than this workbench ({SCHEMA_VERSION}); upgrade workbench")
    if version < SCHEMA_VERSION:
        raise StoreError(f"store schema version {version} is older than this workbench's ({SCHEMA_VERSION}: top "
                         "probabilities in float32); collect it again with `workbench collect`")
    return root


#: Root attrs that do not change which rows a work item holds: bookkeeping (``kind``), where the model was loaded
#: from (``model``; ``model_fingerprint`` identifies its weights), the size of the plan (prompt choice is
#: prefix-stable, so a larger plan's first work items are a smaller one's: ``n_prompts``, ``prompts_per_file``,
#: ``work_items``, ``prompt_digest``, ``categories``), the cut into work items (``batch_size``) and the features
#: derived from the rows (``feature_spec``).
NOT_CONTENT_ATTRS = ("kind", "model", "n_prompts", "prompts_per_file", "work_items", "prompt_digest", "categories",
                     "batch_size", "feature_spec")


def content_identity(path) -> str:
    """The content identity of store ``path``: sha256 (first 16 hex digits) of its root attrs except
    :data:`NOT_CONTENT_ATTRS`, i.e. of everything that determines the rows of a work item (model, tokenizer,
    policy and threshold, corpus and split, seed, context, blocks, block lengths, precision, schema).

    Two stores with one identity hold the same rows for every work item both committed: a copy of a store
    (``cp -r``), or two collections with the same settings, also when one has more prompts than the other, so
    reading both would read those rows twice. (Not told apart: collections whose corpus path names other texts,
    with every other setting equal.) Raises :class:`StoreError` for a missing or damaged store."""
    attrs = {k: v for k, v in dict(open_store(path).attrs).items() if k not in NOT_CONTENT_ATTRS}
    return hashlib.sha256(json.dumps(attrs, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------------ writer
class _Stream:
    """Arrays sharing a leading dimension, appended in whole chunks of ``chunk``.

    The buffer always starts at ``base`` (chunk-aligned) and holds rows ``[base, end)``: a partial chunk that
    is already on disk (after a final flush or a resume) stays buffered so it is rewritten whole later.
    """

    def __init__(self, arrays: dict[str, zarr.Array], committed: int):
        self.arrays = {k: a.with_config(_WRITE_CFG) for k, a in arrays.items()}
        self.encoders = {k: fast_writer(a) for k, a in arrays.items()}  # None: write through zarr
        first = next(iter(self.arrays.values()))
        self.chunk = (first.shards or first.chunks)[0]
        self.committed = committed
        self.base = committed // self.chunk * self.chunk
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in arrays}
        self.buffered = 0
        if committed > self.base:  # reload the on-disk partial chunk
            self.push({k: a[self.base:committed] for k, a in self.arrays.items()})

    @property
    def end(self) -> int:
        return self.base + self.buffered

    def push(self, data: dict[str, np.ndarray]) -> None:
        for k, v in data.items():
            self.parts[k].append(v)
        self.buffered += len(next(iter(data.values())))

    def write(self, final: bool) -> None:
        """Write buffered whole chunks (``final``: everything); data only, no commit record."""
        stop = self.end if final else self.end // self.chunk * self.chunk
        if stop <= self.committed:
            return
        keep_from = stop // self.chunk * self.chunk
        for k, a in self.arrays.items():
            data = np.concatenate(self.parts[k]) if len(self.parts[k]) > 1 else self.parts[k][0]
            if a.shape[0] < stop:
                step = self.chunk * GROW_CHUNKS
                a.resize((math.ceil(stop / step) * step,) + a.shape[1:])
            if self.encoders[k] is not None:
                self.encoders[k].write(self.base, data[:stop - self.base])
            else:
                a[self.base:stop] = data[:stop - self.base]
            self.parts[k] = [data[keep_from - self.base:]]
        self.buffered = self.end - keep_from
        self.base, self.committed = keep_from, stop

    def trim(self, n: int) -> None:
        """Resize every array to exactly ``n`` rows (drops growth headroom / uncommitted data)."""
        for a in self.arrays.values():
            if a.shape[0] != n:
                a.resize((n,) + a.shape[1:])


class ShardWriter:
    """Appends complete trajectories to shard group ``B{B}/shard-{rank:03d}`` (``rows/`` and ``trajectories/``).

    Data is buffered in memory and written in whole write units (``rows_per_chunk`` rows = one shard file;
    ``traj_per_chunk`` trajectories); partial writes rewrite chunks and are ~12x slower. After each write the
    **commit record** (shard attr ``commit``) is updated, data first, record last::

        rows / trajs / items    lengths of the row, trajectory and items arrays that are durably written
        item_rows / item_trajs  end of the last fully written work item (what readers present)

    On open the writer rolls back to the last fully committed item (a commit can land mid-item) and resizes
    every array to it, so appends continue from a consistent point. Chunk sizes of an existing shard win over
    the arguments. A shard group whose creation fails is removed again. Raises StoreError if the store is missing
    / has no such block length / the shard is held by another process, :class:`DiskFullError` (here and in
    :meth:`append`, :meth:`flush`, :meth:`close`) on a full disk.

    A write that fails (a full disk, an interrupt) leaves the writer *broken*: what it committed before stays
    committed, it writes nothing more, and :meth:`close` only releases the lock; a new writer resumes.
    """

    def __init__(self, path, block_length: int, rank: int = 0, rows_per_chunk: int = DEFAULT_ROWS_PER_CHUNK,
                 traj_per_chunk: int = DEFAULT_TRAJ_PER_CHUNK):
        root = open_store(path)
        B = self.block_length = int(block_length)
        if f"B{B}" not in root:
            raise StoreError(f"store {path} has no block length {B} (has {_block_lengths(root)}): "
                             f"create it with block_lengths including {B}")
        self.name = f"B{B}/shard-{int(rank):03d}"
        self._broken = False
        shard_dir = self._dir = Path(path) / self.name
        with reporting_full_disk(shard_dir):
            shard_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(shard_dir, os.O_RDONLY)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(self._lock_fd)
                self._lock_fd = None
                raise StoreError(f"shard {self.name} of {path} is being written by another process: give each "
                                 "process its own rank") from None
            try:
                self._open(Path(path), shard_dir, rows_per_chunk, traj_per_chunk)
            except BaseException:
                self.release()
                raise

    def _open(self, path: Path, shard_dir: Path, rows_per_chunk: int, traj_per_chunk: int) -> None:
        """Create (or finish creating) the shard group, then roll it back to its last commit."""
        for tmp in shard_dir.rglob("*.partial"):  # temp files of writes interrupted by a kill
            tmp.unlink(missing_ok=True)
        group = zarr.open_group(path, mode="a")[f"B{self.block_length}"]
        if "commit" not in zarr.open_group(shard_dir, mode="a").attrs:  # new, or creation was interrupted
            try:
                self.group = self._create(group, shard_dir, rows_per_chunk, traj_per_chunk)
            except BaseException:
                shutil.rmtree(shard_dir, ignore_errors=True)   # under our lock: nothing half-created stays
                raise
        else:
            self.group = group[shard_dir.name]
        self._recover()

    def _create(self, parent: zarr.Group, shard_dir: Path, rows_per_chunk: int, traj_per_chunk: int) -> zarr.Group:
        for entry in shard_dir.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        g = parent.require_group(shard_dir.name)
        S = int(rows_per_chunk)
        inner = math.gcd(S, ROW_INNER_CHUNK) if S > ROW_INNER_CHUNK else S
        rows, trajs = g.require_group("rows"), g.require_group("trajectories")
        for name, (shape, dtype) in row_array_specs(self.block_length).items():
            rows.create_array(name, shape=(0, *shape), dtype=dtype, chunks=(inner, *shape), shards=(S, *shape),
                              compressors=COMPRESSORS, overwrite=True)
        for name, (shape, dtype) in traj_array_specs(self.block_length).items():
            trajs.create_array(name, shape=(0, *shape), dtype=dtype, chunks=(int(traj_per_chunk), *shape),
                               compressors=COMPRESSORS, overwrite=True)
        g.create_array("items", shape=(0, len(ITEM_COLUMNS)), dtype=np.int64, chunks=(ITEM_CHUNK, len(ITEM_COLUMNS)),
                       compressors=COMPRESSORS, overwrite=True)
        g.attrs.update({"block_length": self.block_length, "commit": dict(_EMPTY_COMMIT)})
        return g

    def _recover(self) -> None:
        g = self.group
        rows = {k: g["rows"][k] for k in row_array_specs(self.block_length)}
        trajs = {k: g["trajectories"][k] for k in traj_array_specs(self.block_length)}
        items = g["items"]
        c = g.attrs["commit"]
        n_rows = min([c["rows"]] + [a.shape[0] for a in rows.values()])
        n_trajs = min([c["trajs"]] + [a.shape[0] for a in trajs.values()])
        recs = items[:min(c["items"], items.shape[0])]
        n_items = int(np.sum((recs[:, 2] <= n_rows) & (recs[:, 1] <= n_trajs)))  # ends are monotone
        recs = recs[:n_items]
        R0, T0 = (int(recs[-1, 2]), int(recs[-1, 1])) if n_items else (0, 0)
        commit = {"rows": R0, "trajs": T0, "items": n_items, "item_rows": R0, "item_trajs": T0}
        if commit != c:
            g.attrs["commit"] = commit  # record first (R0 <= every array's length), then cut the arrays
        self.rows, self.trajs, self.items = _Stream(rows, R0), _Stream(trajs, T0), _Stream({"items": items}, n_items)
        for s, n in ((self.rows, R0), (self.trajs, T0), (self.items, n_items)):
            s.trim(n)
        self._done = set(recs[:, 0].tolist())
        self._last_id = int(recs[-1, 0]) if n_items else None
        self._pending: list[tuple[int, int, int]] = []  # (item_id, traj_end, row_end) not yet committed

    @property
    def done_items(self) -> set[int]:
        """Work-item ids fully and durably written (the live set: do not modify it)."""
        return self._done

    def append(self, item_id: int, rows: dict[str, np.ndarray], trajs: dict[str, np.ndarray]) -> None:
        """Buffer all trajectories of one work item; writes whole chunks when a write unit is full.

        ``rows``: every array of ``schema.row_array_specs(B)`` with the same leading length n, rows grouped by
        trajectory with ``traj`` = item-local trajectory index 0..t-1 (non-decreasing). ``trajs``: every array of
        ``schema.traj_array_specs(B)`` except ``row_start`` / ``row_end``, leading length t. Items must come in
        increasing id order; ids already in :attr:`done_items` are ignored. Raises StoreError on bad input.
        """
        item_id = int(item_id)
        if self._lock_fd is None:
            raise StoreError(f"append to closed writer of {self.name}: open a new ShardWriter to continue")
        if item_id in self._done:
            return
        if self._last_id is not None and item_id <= self._last_id:
            raise StoreError(f"work item {item_id} appended after item {self._last_id}: append items in increasing id order")
        rows = _conform(rows, row_array_specs(self.block_length), f"rows of item {item_id}")
        tspec = {k: v for k, v in traj_array_specs(self.block_length).items() if k not in ("row_start", "row_end")}
        trajs = _conform(trajs, tspec, f"trajs of item {item_id}")
        t, local = len(trajs["prompt_id"]), rows["traj"]
        if len(local) and (local.min() < 0 or local.max() >= t or np.any(np.diff(local) < 0)):
            raise StoreError(f"rows of item {item_id} have traj outside 0..{t - 1} or not grouped by trajectory: "
                             "give item-local trajectory indices in non-decreasing order")
        counts = np.bincount(local, minlength=t)
        ends = self.rows.end + np.cumsum(counts)
        rows["traj"] = local + self.trajs.end
        trajs["row_start"], trajs["row_end"] = ends - counts, ends
        self.rows.push(rows)
        self.trajs.push(trajs)
        self._pending.append((item_id, self.trajs.end, self.rows.end))
        self._last_id = item_id
        if self.rows.end - self.rows.base >= self.rows.chunk or self.trajs.end - self.trajs.base >= self.trajs.chunk:
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Write whole buffered chunks (``final``: everything, trimmed to exact lengths), then the commit record.
        Raises :class:`DiskFullError` on a full disk (the writer is then broken, see the class docstring)."""
        if self._broken:
            raise StoreError(f"the writer of {self.name} failed in an earlier write: open a new ShardWriter to resume")
        try:
            with reporting_full_disk(self._dir):
                self._flush(final)
        except BaseException:
            self._broken = True      # its buffers may be half-written: never write them again
            raise

    def _flush(self, final: bool) -> None:
        self.rows.write(final)
        self.trajs.write(final)
        n_done = 0
        for item_id, t_end, r_end in self._pending:
            if r_end > self.rows.committed or t_end > self.trajs.committed:
                break
            n_done += 1
        done, self._pending = self._pending[:n_done], self._pending[n_done:]
        if done:
            self.items.push({"items": np.array([[i, t, r] for i, t, r in done], dtype=np.int64)})
        self.items.write(True)
        if final:
            for s in (self.rows, self.trajs, self.items):
                s.trim(s.committed)
        old = self.group.attrs["commit"]
        c = dict(old, rows=self.rows.committed, trajs=self.trajs.committed, items=self.items.committed)
        if done:
            c.update(item_rows=done[-1][2], item_trajs=done[-1][1])
        if c != old:
            self.group.attrs["commit"] = c
        self._done.update(i for i, _, _ in done)

    def close(self) -> None:
        """``flush(final=True)`` (not for a broken writer) and release the shard lock. Raises
        :class:`DiskFullError` on a full disk (the lock is released all the same)."""
        if self._lock_fd is None:
            return
        try:
            if not self._broken:
                self.flush(final=True)
        finally:
            self.release()

    def release(self) -> None:
        """Release the shard lock without writing: items appended since the last commit are dropped (a new writer
        resumes after the last committed item)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _conform(data: dict, spec: dict, what: str) -> dict[str, np.ndarray]:
    """Check names / trailing shapes / equal lengths and cast to the schema dtypes. Raises StoreError."""
    if set(data) != set(spec):
        raise StoreError(f"{what} have arrays {sorted(data)}, expected {sorted(spec)}")
    out, n = {}, None
    for name, (shape, dtype) in spec.items():
        a = np.asarray(data[name])
        if a.ndim != 1 + len(shape) or a.shape[1:] != shape or (n is not None and len(a) != n):
            want = "(" + ", ".join(map(str, (n if n is not None else "n", *shape))) + ")"
            raise StoreError(f"{what}: array {name} has shape {a.shape}, expected {want}: check the block length")
        n = len(a)
        out[name] = np.array(a, dtype=dtype, order="C")  # a copy: callers may reuse their buffers
    return out


# ------------------------------------------------------------------------------------------------------ reader
def _shards(root: zarr.Group, B: int, path) -> list[tuple[str, zarr.Group, dict]]:
    if f"B{B}" not in root:
        raise StoreError(f"store {path} has no block length {B} (has {_block_lengths(root)}): pick one of those")
    group = root[f"B{B}"]
    names = sorted(k for k in group.group_keys() if re.fullmatch(r"shard-\d+", k))
    return [(n, group[n], group[n].attrs.get("commit")) for n in names]  # commit None: creation interrupted


def store_block_length(path, block_length: int | None = None) -> int:
    """``block_length`` when given, else the one block length store ``path`` holds (for scripts whose
    ``--block_length`` defaults to the store's). Raises :class:`StoreError` for a missing store, or one holding
    several block lengths (name one) or none."""
    if block_length is not None:
        return int(block_length)
    have = _block_lengths(open_store(path))
    if len(have) != 1:
        raise StoreError(f"store {path} holds block lengths {have}: pass --block_length with one of them")
    return have[0]


def committed_items(path, B: int) -> dict[str, set[int]]:
    """Work-item ids each shard group of block length ``B`` has committed: ``{"shard-000": {ids}, ...}`` (a shard
    whose creation was interrupted has none). Raises StoreError for a missing store or block length."""
    out = {}
    for name, g, c in _shards(open_store(path), B, path):
        n = int(c["items"]) if c else 0
        out[name] = set(g["items"][:n, 0].tolist()) if n else set()
    return out


#: Root attrs that every store read together by one :class:`StoreReader` must share: the rows of all of them are
#: states of one model, with one feature spec and one category list (trajectories index it).
SAME_MODEL_ATTRS = ("model_fingerprint", "tokenizer_hash", "feature_spec", "vocab_size", "mask_token_id", "categories")


class StoreReader:
    """All shards of one block length presented as one dataset (global row and trajectory indices).

    ``path`` is one store or a list of stores of the same model (:data:`SAME_MODEL_ATTRS` and ``token_pca``
    equal), e.g. NLD App. A's two trajectory policies, serial and hybrid, collected on the same prompts: their
    shards are read one after the other, store by store. ``attrs`` are the first store's root attrs; with several
    stores ``attrs["policy"]`` joins their policies with ``+`` and ``attrs["stores"]`` lists them.

    Only the committed part of each shard is visible (rows ``[0, item_rows)``, trajectories
    ``[0, item_trajs)`` of the commit record), so a store can be read while it is being written.
    Attributes: ``n_rows``, ``n_traj``, ``block_length``, ``attrs`` (root attrs), ``token_pca`` ((V, 44)
    float16 or None), ``prompt_documents`` (the longest ``prompt_document`` record of the
    stores, every other one a prefix of it; None when a store has none). Global ids follow store order, then
    shard order (``shard-000`` first).

    Raises :class:`StoreError` (one line) for a missing or damaged store, a missing block length, or stores of
    different models, feature specs, categories or token PCA tables.
    """

    def __init__(self, path, block_length: int, limits: dict[tuple[int, str], tuple[int, int]] | None = None):
        paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
        if not paths:
            raise StoreError("no trajectory store given: pass at least one store path")
        if len({p.resolve() for p in paths}) < len(paths):
            raise StoreError(f"a store is given twice in {[str(p) for p in paths]}: its rows would be read twice")
        self.path, self.paths, self.block_length = paths[0], paths, int(block_length)
        self._rows, self._trajs, self._fast, self.shard_names, self._store_of = [], [], [], [], []
        n_rows, n_trajs, policies = [], [], []
        for i, p in enumerate(paths):
            root = open_store(p)
            attrs = dict(root.attrs)
            policies.append(str(attrs.get("policy")))
            pca = root["token_pca"][:] if "token_pca" in root else None
            docs = root["prompt_document"][:] if "prompt_document" in root else None
            if i == 0:
                self.attrs, self.token_pca, self.prompt_documents = attrs, pca, docs
            else:
                self._check_same_model(p, attrs, pca)
                self.prompt_documents = self._merge_documents(p, docs)
            for name, g, c in _shards(root, self.block_length, p):
                if c is None or (limits is not None and (i, name) not in limits):
                    continue
                check_committed_files(p, f"B{self.block_length}/{name}", g, c, self.block_length)
                rows, trajs = c["item_rows"], c["item_trajs"]
                if limits is not None:
                    rows, trajs = limits[(i, name)]
                    if rows > c["item_rows"] or trajs > c["item_trajs"]:
                        raise StoreError(f"store {p} B{self.block_length}/{name} holds fewer committed rows than when "
                                         "it was first opened: it was replaced or rolled back meanwhile; restart")
                self.shard_names.append(name)
                self._store_of.append(i)
                self._rows.append({k: g["rows"][k] for k in row_array_specs(self.block_length)})
                self._trajs.append({k: g["trajectories"][k] for k in traj_array_specs(self.block_length)})
                self._fast.append({k: fast_reader(a, rows) for k, a in self._rows[-1].items()})
                n_rows.append(rows)
                n_trajs.append(trajs)
        if len(paths) > 1:
            self.attrs = {**self.attrs, "policy": "+".join(policies), "stores": [str(p) for p in paths]}
        self._row_off = np.concatenate([[0], np.cumsum(n_rows, dtype=np.int64)])
        self._traj_off = np.concatenate([[0], np.cumsum(n_trajs, dtype=np.int64)])
        self.n_rows, self.n_traj = int(self._row_off[-1]), int(self._traj_off[-1])

    def _merge_documents(self, p: Path, docs: np.ndarray | None) -> np.ndarray | None:
        """The longer of the records read so far and store ``p``'s (None if either is missing); raises
        :class:`StoreError` when neither is a prefix of the other (different prompt plans)."""
        if docs is None or self.prompt_documents is None:
            return None
        short, long_ = sorted((docs, self.prompt_documents), key=len)
        if not np.array_equal(short, long_[:len(short)]):
            raise StoreError(f"stores {self.paths[0]} and {p} record other source files for the same prompt ids: "
                             "they were collected on different prompt plans")
        return long_

    @property
    def limits(self) -> dict[tuple[int, str], tuple[int, int]]:
        """The committed ``(rows, trajectories)`` of every shard read, keyed by ``(store index, shard name)``: pass
        them to another reader (``StoreReader(path, B, limits=...)``) to read exactly this snapshot while the
        stores keep growing (the sampler's data workers re-open the stores every epoch)."""
        return {(i, n): (int(self._row_off[s + 1] - self._row_off[s]), int(self._traj_off[s + 1] - self._traj_off[s]))
                for s, (i, n) in enumerate(zip(self._store_of, self.shard_names))}

    def _shard_label(self, s: int) -> str:
        """Shard ``s`` named for messages: ``shard-000``, or ``<store>/shard-000`` when several stores are read."""
        name = self.shard_names[s]
        return f"{self.paths[self._store_of[s]]}/{name}" if len(self.paths) > 1 else name

    def _check_same_model(self, p: Path, attrs: dict, pca: np.ndarray | None) -> None:
        for key in SAME_MODEL_ATTRS:
            if attrs.get(key) != self.attrs.get(key):
                raise StoreError(f"stores {self.path} and {p} differ in {key} ({self.attrs.get(key)!r} != "
                                 f"{attrs.get(key)!r}): read together only stores of one model, feature spec and "
                                 "prompt categories")
        same = (pca is None) == (self.token_pca is None) and (pca is None or (
            pca.shape == self.token_pca.shape and np.allclose(pca.astype(np.float32),
                                                              self.token_pca.astype(np.float32), rtol=1e-2, atol=1e-2)))
        if not same:
            raise StoreError(f"stores {self.path} and {p} have different token_pca tables: read together only stores "
                             "collected with the same feature settings")

    def read_rows(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Rows at global indices ``idx`` (int, any order, repeats allowed) -> ``{name: (len(idx), *trailing)}``
        with ``traj`` as global trajectory ids. Raises IndexError out of range, StoreError on a corrupt chunk."""
        idx = np.asarray(idx, dtype=np.int64).ravel()
        if len(idx) and (idx.min() < 0 or idx.max() >= self.n_rows):
            raise IndexError(f"row index out of range [0, {self.n_rows})")
        shard = np.searchsorted(self._row_off, idx, side="right") - 1
        out = {k: np.empty((len(idx), *s), d) for k, (s, d) in row_array_specs(self.block_length).items()}
        for s in np.unique(shard).tolist():
            m = shard == s
            local = idx[m] - self._row_off[s]
            for k, a in self._rows[s].items():
                out[k][m] = self._read(s, k, a, local)
        out["traj"] += self._traj_off[shard]
        return out

    def _read(self, s: int, name: str, arr: zarr.Array, local: np.ndarray) -> np.ndarray:
        try:
            if self._fast[s][name] is not None:
                return self._fast[s][name].read(local)
            uniq, inv = np.unique(local, return_inverse=True)
            return arr.oindex[uniq][inv]
        except Exception as e:  # noqa: BLE001
            _settle_zarr_tasks()
            raise StoreError(f"corrupt data in {self._shard_label(s)}/rows/{name} ({_one_line(e)}): "
                             "run `workbench store verify` on the store") from None

    def _traj(self, s: int, name: str) -> np.ndarray:
        """The committed entries of trajectory array ``name`` of shard ``s``; a damaged chunk raises a one-line
        :class:`StoreError` (as row reads do) instead of the codec's own error."""
        n = self._traj_off[s + 1] - self._traj_off[s]
        try:
            return self._trajs[s][name][:n]
        except Exception as e:  # noqa: BLE001 - any codec / store error is a corrupt chunk
            _settle_zarr_tasks()
            raise StoreError(f"corrupt data in {self._shard_label(s)}/trajectories/{name} ({_one_line(e)}): "
                             "run `workbench store verify` on the store") from None

    def read_row_range(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` (global, clipped to ``n_rows``) as in :meth:`read_rows`."""
        start, stop = max(0, int(start)), min(int(stop), self.n_rows)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in row_array_specs(self.block_length)}
        for s in range(len(self._rows)):
            a, b = max(start, self._row_off[s]), min(stop, self._row_off[s + 1])
            if a >= b:
                continue
            for k, arr in self._rows[s].items():
                v = arr[a - self._row_off[s]:b - self._row_off[s]]
                parts[k].append(v + self._traj_off[s] if k == "traj" else v)
        return {k: np.concatenate(v) if v else np.empty((0, *s), d)
                for (k, v), (s, d) in zip(parts.items(), row_array_specs(self.block_length).values())}

    def trajectories(self) -> pd.DataFrame:
        """One row per trajectory, index = global trajectory id: prompt_id, category (name), block_index,
        row_start, row_end (global rows), shard (writer rank), store (index into ``paths``)."""
        cats = self.attrs.get("categories")
        frames = []
        for s in range(len(self._trajs)):
            code = self._traj(s, "category")
            frames.append(pd.DataFrame({
                "prompt_id": self._traj(s, "prompt_id"),
                "category": np.asarray(cats, dtype=object)[code] if cats else code.astype(str),
                "block_index": self._traj(s, "block_index"),
                "row_start": self._traj(s, "row_start") + self._row_off[s],
                "row_end": self._traj(s, "row_end") + self._row_off[s],
                "shard": int(self.shard_names[s].split("-")[1]),
                "store": self._store_of[s],
            }))
        cols = ["prompt_id", "category", "block_index", "row_start", "row_end", "shard", "store"]
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
        df.index.name = "traj"
        return df

    def final_ids(self) -> np.ndarray:
        """Final committed token ids of every trajectory: (n_traj, B) int32."""
        parts = [self._traj(s, "final_ids") for s in range(len(self._trajs))]
        return np.concatenate(parts) if parts else np.empty((0, self.block_length), np.int32)


def _one_line(e: Exception) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:160]}" if msg else type(e).__name__


# ---------------------------------------------------------------------------------------------- info / verify
def _slice_rows(B: int, chunk: int) -> int:
    return max(chunk, SLICE_BYTES // row_nbytes(B) // chunk * chunk)


def _dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def store_info(path) -> dict:
    """Summary of a store: ``{"path", "schema_version", "attrs", "bytes_on_disk", "block_lengths": {B: {...}}}``.

    Per block length: rows, trajectories, shards, bytes_on_disk, bytes_per_row, label_balance (mean label over
    masked positions; None if none) and label_balance_by_category ({name: mean}). Reads in bounded slices.
    """
    root = open_store(path)
    out = {"path": str(path), "schema_version": root.attrs["schema_version"], "attrs": dict(root.attrs),
           "bytes_on_disk": _dir_bytes(Path(path)), "block_lengths": {}}
    cats = list(root.attrs.get("categories") or [])
    for B in _block_lengths(root):
        pos, msk = np.zeros(max(len(cats), 1)), np.zeros(max(len(cats), 1))
        rows = trajs = 0
        shards = [s for s in _shards(root, B, path) if s[2] is not None]
        for name, g, c in shards:
            n, t = c["item_rows"], c["item_trajs"]
            rows, trajs = rows + n, trajs + t
            code = g["trajectories/category"][:t].astype(np.int64)
            ncat = max(len(cats), int(code.max()) + 1 if t else 1)
            pos, msk = np.pad(pos, (0, ncat - len(pos))), np.pad(msk, (0, ncat - len(msk)))
            step = _slice_rows(B, g["rows/label"].shards[0])
            for a in range(0, n, step):
                b = min(a + step, n)             # rows past item_rows (a live or killed writer's) are not counted
                lab, m = g["rows/label"][a:b], g["rows/masked"][a:b]
                rc = code[g["rows/traj"][a:b]]
                pos += np.bincount(rc, weights=(lab & m).sum(1), minlength=len(pos))
                msk += np.bincount(rc, weights=m.sum(1), minlength=len(msk))
        nbytes = _dir_bytes(Path(path) / f"B{B}")
        names = [cats[i] if i < len(cats) else str(i) for i in range(len(pos))]
        out["block_lengths"][B] = {
            "rows": rows, "trajectories": trajs, "shards": len(shards), "bytes_on_disk": nbytes,
            "bytes_per_row": nbytes / rows if rows else None,
            "label_balance": float(pos.sum() / msk.sum()) if msk.sum() else None,
            "label_balance_by_category": {names[i]: float(pos[i] / msk[i]) for i in range(len(pos)) if msk[i]},
        }
    return out


def verify_store(path, model_fingerprint: str | None = None, tokenizer_hash: str | None = None) -> dict:
    """Check a store end to end; returns ``{"path", "schema_version", "block_lengths": {B: {rows, trajectories,
    shards}}}``. Raises StoreError (one line naming the problem and the fix) on the first problem found: missing
    store, newer schema, model / tokenizer mismatch, schema shape / dtype mismatch, missing or corrupt chunks,
    truncated arrays, NaN / inf probabilities or entropies, broken row ranges, labels inconsistent with final ids.
    Reads rows in ~32 MB slices, so memory stays bounded for any store size; a shard's trajectory columns are
    read whole (4·B + 30 bytes per trajectory, 158 bytes at B = 32).
    """
    root = open_store(path)
    for key, want, what in (("model_fingerprint", model_fingerprint, "model"), ("tokenizer_hash", tokenizer_hash, "tokenizer")):
        have = root.attrs.get(key)
        if want is not None and have != want:
            raise StoreError(f"store was collected with {what} {have}, not {want}: collect a new store for this {what}")
    vocab = root.attrs.get("vocab_size")
    if "token_pca" in root:
        _check_spec(root["token_pca"], ((_pca_width(dict(root.attrs)),), np.dtype(np.float16)), "token_pca", None)
        if vocab is not None and root["token_pca"].shape[0] != vocab:
            raise StoreError(f"token_pca has {root['token_pca'].shape[0]} rows but the store's vocab_size is {vocab}: "
                             "the store mixes two vocabularies; collect it again")
    n_cat = len(root.attrs.get("categories") or []) or None
    recorded = root.attrs.get("block_lengths")
    if recorded is not None and sorted(int(b) for b in recorded) != _block_lengths(root):
        raise StoreError(f"store {path} records block lengths {sorted(recorded)} but holds groups for "
                         f"{_block_lengths(root)}: two collections wrote it at once; delete it and collect again")
    summary = {"path": str(path), "schema_version": root.attrs["schema_version"], "block_lengths": {}}
    planned = root.attrs.get("work_items") or {}
    for B in _block_lengths(root):
        shards = _shards(root, B, path)
        for name, g, c in shards:
            _verify_shard(Path(path), f"B{B}/{name}", g, c, B, vocab, n_cat)
        summary["block_lengths"][B] = {"rows": sum(c["item_rows"] for *_, c in shards),
                                       "trajectories": sum(c["item_trajs"] for *_, c in shards), "shards": len(shards)}
        done, want = sum(c["items"] for *_, c in shards), planned.get(str(B))
        if want is not None and done < want:
            raise StoreError(f"store {path} is an unfinished collection: {done} of {want} work items committed at "
                             f"B = {B}; rerun the same `workbench collect` command to finish it")
    if not any(v["rows"] for v in summary["block_lengths"].values()):
        raise StoreError(f"store {path} holds no rows (its collection committed nothing): rerun the same "
                         "`workbench collect` command to collect them")
    return summary


def _check_ids(v: np.ndarray, hi: int | None, where: str, first: int) -> None:
    """Ids must lie in ``[0, hi)`` (``hi`` None: only ``>= 0``); ``first`` is the index of ``v[0]`` in the array."""
    bad = (v < 0) | (v >= hi) if hi is not None else v < 0
    if bad.any():
        at = first + int(np.argwhere(bad)[0, 0])
        raise StoreError(f"array {where} has an id outside [0, {hi if hi is not None else 'inf'}) at entry {at}: the store "
                         "is damaged or mixes vocabularies; delete the shard group and re-run the collection")


def _check_spec(arr: zarr.Array, spec, where: str, committed: int | None) -> None:
    shape, dtype = spec
    if arr.dtype != dtype or tuple(arr.shape[1:]) != shape:
        raise StoreError(f"array {where} has shape {arr.shape} / dtype {arr.dtype}, the schema says (n, "
                         f"{', '.join(map(str, shape))}) / {dtype}: the store was written by incompatible code; collect it again")
    if committed is not None and arr.shape[0] < committed:
        raise StoreError(f"array {where} is truncated: {arr.shape[0]} rows on disk, {committed} committed; "
                         "re-run the collection with the same arguments to rewrite the lost part")


def _check_files(root: Path, arr: zarr.Array, where: str, n: int) -> None:
    """Every chunk (shard) file below ``n`` committed rows must exist and hold data: arrays are written with
    write_empty_chunks=True, so a missing or empty (0-byte) file under committed rows is damage, which zarr would
    otherwise read back as fill values (zeros)."""
    outer = (arr.shards or arr.chunks)[0]
    for i in range(math.ceil(n / outer)):
        f = root / arr.path / "c" / "/".join([str(i)] + ["0"] * (arr.ndim - 1))
        if not f.is_file():
            raise StoreError(f"array {where} is truncated: chunk file {f.relative_to(root)} is missing; delete the "
                             "shard group and re-run the collection to rewrite it")
        if f.stat().st_size == 0:
            raise StoreError(f"array {where} is damaged: chunk file {f.relative_to(root)} is empty; delete the "
                             "shard group and re-run the collection to rewrite it")


def check_committed_files(root_path: Path, name: str, g: zarr.Group, c: dict, B: int) -> None:
    """The integrity check every reader shares (:class:`StoreReader`, hence the sampler data, SOL and reports):
    each row and trajectory array of shard ``g`` has a non-empty chunk file under its committed entries.
    Raises :class:`StoreError` (one line) like :func:`verify_store` for the same damage."""
    for sub, spec, n in (("rows", row_array_specs(B), c["rows"]), ("trajectories", traj_array_specs(B), c["trajs"])):
        for k in spec:
            where = f"{name}/{sub}/{k}"
            if k not in g[sub]:
                raise StoreError(f"array {where} is missing: the store is damaged or was written by incompatible "
                                 "code; collect it again")
            _check_files(root_path, g[sub][k], where, n)


def _read(arr: zarr.Array, sl: slice, where: str) -> np.ndarray:
    try:
        return arr[sl]
    except Exception as e:  # noqa: BLE001 - any codec / store error is a corrupt chunk
        _settle_zarr_tasks()
        raise StoreError(f"corrupt chunk in array {where} (entries {sl.start}-{sl.stop}: {_one_line(e)}); delete "
                         "the shard group and re-run the collection to rewrite it") from None


def _verify_shard(root: Path, name: str, g: zarr.Group, c: dict, B: int, vocab: int | None = None,
                  n_cat: int | None = None) -> None:
    if c is None:                      # the writer's creation of the group was killed before its first commit
        raise StoreError(f"shard {name} was never committed (its creation was interrupted): rerun the same "
                         "`workbench collect` command to finish it")
    if not isinstance(c, dict) or set(c) != set(_EMPTY_COMMIT):
        raise StoreError(f"shard {name} has a damaged commit record: delete the shard group and re-run the collection")
    arrays = {}
    for sub, spec, n in (("rows", row_array_specs(B), c["rows"]), ("trajectories", traj_array_specs(B), c["trajs"])):
        for k, s in spec.items():
            where = f"{name}/{sub}/{k}"
            if k not in g[sub]:
                raise StoreError(f"array {where} is missing: the store was written by incompatible code; collect it again")
            arrays[k] = g[sub][k]
            _check_spec(arrays[k], s, where, n)
            _check_files(root, arrays[k], where, n)
    _check_spec(g["items"], ((len(ITEM_COLUMNS),), np.dtype(np.int64)), f"{name}/items", c["items"])
    R, T = c["item_rows"], c["item_trajs"]
    items = _read(g["items"], slice(0, c["items"]), f"{name}/items")
    traj = {k: _read(arrays[k], slice(0, T), f"{name}/trajectories/{k}") for k in ("row_start", "row_end")}
    rs, re_ = traj["row_start"], traj["row_end"]
    ok_items = (not len(items) or (np.all(np.diff(items[:, 0]) > 0) and np.all(np.diff(items[:, 1:], axis=0) >= 0)
                                   and items[-1, 1] == T and items[-1, 2] == R))
    if not ok_items or R > c["rows"] or T > c["trajs"]:
        raise StoreError(f"shard {name} has an inconsistent commit record / items table: delete the shard group and re-run the collection")
    if T and (rs[0] != 0 or re_[-1] != R or np.any(rs[1:] != re_[:-1]) or np.any(re_ < rs)):
        raise StoreError(f"shard {name} has trajectory row ranges that are not contiguous and monotone: "
                         "delete the shard group and re-run the collection")
    if R and not T:
        raise StoreError(f"shard {name} has {R} rows but no trajectories: delete the shard group and re-run the collection")
    # decode every trajectory column (row ranges above), range-checking ids; final_ids is kept for the labels
    cols = {k: _read(arrays[k], slice(0, T), f"{name}/trajectories/{k}")
            for k in ("prompt_id", "block_index", "category", "final_ids")}
    for k, hi in (("prompt_id", None), ("block_index", None), ("category", n_cat), ("final_ids", vocab)):
        _check_ids(cols[k], hi, f"{name}/trajectories/{k}", 0)
    step = _slice_rows(B, arrays["label"].shards[0] if arrays["label"].shards else arrays["label"].chunks[0])
    for a in range(0, R, step):
        sl = slice(a, min(a + step, R))
        v = {k: _read(arrays[k], sl, f"{name}/rows/{k}") for k in row_array_specs(B)}
        for k in ("top_probs", "entropy"):
            if not np.all(np.isfinite(v[k])):
                bad = a + int(np.argwhere(~np.isfinite(v[k]))[0, 0])
                raise StoreError(f"array {name}/rows/{k} has NaN/inf at row {bad}: the collecting model produced "
                                 "non-finite outputs; fix the model / precision and collect again")
        expect = np.searchsorted(re_, np.arange(sl.start, sl.stop), side="right")
        if np.any(v["traj"] != expect):
            bad = a + int(np.argmax(v["traj"] != expect))
            raise StoreError(f"array {name}/rows/traj disagrees with the trajectory row ranges at row {bad}: "
                             "delete the shard group and re-run the collection")
        _check_ids(v["top_ids"], vocab, f"{name}/rows/top_ids", a)
        fin = cols["final_ids"][expect]
        bad_pos = v["masked"] & (v["label"] != (v["top_ids"][..., 0] == fin))
        if bad_pos.any():
            r, j = np.argwhere(bad_pos)[0]
            raise StoreError(f"label inconsistency in {name} at row {a + r}, position {j}: label must equal "
                             "top_ids[..., 0] == final_ids at masked positions; fix the collector and collect again")
