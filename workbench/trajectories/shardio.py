"""Fast paths for the store's sharded row arrays: whole-shard writes and random-row reads.

zarr-python pushes every inner chunk through its asynchronous codec pipeline (about 150 µs per chunk here) and
re-reads the shard index for each chunk it reads: writes top out near 150k rows/s at B = 32 and a batch of 256
random rows over the 7 row arrays takes ~0.3 s. This module implements the zarr v3 ``sharding_indexed`` codec
(https://zarr-specs.readthedocs.io/en/latest/v3/codecs/sharding-indexed/) for exactly the layout ``store.py``
creates — index at the end with ``bytes`` + ``crc32c`` index codecs, ``bytes`` + an optional blosc / zstd
inner codec, inner chunks spanning all trailing dimensions, local filesystem — with numcodecs doing the
(de)compression:

- :class:`ShardEncoder` writes whole shard files (atomically: temporary file + rename, as zarr does);
- :class:`ShardedRows` caches shard indexes (checked against their crc32c) and ``pread`` s only the inner
  chunks it needs — about 10-20x faster than zarr's orthogonal indexing.

:func:`fast_writer` / :func:`fast_reader` return ``None`` for any other layout, and callers then use zarr.
Array metadata (shape), trajectory arrays and contiguous reads always go through zarr, and the tests read
everything written here back through zarr's own decoder.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import google_crc32c
import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec, ShardingCodecIndexLocation, ZstdCodec
from zarr.storage import LocalStore

_EMPTY = np.uint64(2**64 - 1)  # index entry of an inner chunk that was never written
_SHUFFLE = {"noshuffle": numcodecs.Blosc.NOSHUFFLE, "shuffle": numcodecs.Blosc.SHUFFLE,
            "bitshuffle": numcodecs.Blosc.BITSHUFFLE}


def _layout(array: zarr.Array):
    """``(inner rows, numcodecs codec or None)`` if ``array`` has the supported layout, else ``None``."""
    codecs = getattr(array.metadata, "codecs", ())
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec) or not isinstance(array.store, LocalStore):
        return None
    sc = codecs[0]
    inner = tuple(sc.codecs)
    ok = (
        sc.index_location == ShardingCodecIndexLocation.end
        and [type(c) for c in sc.index_codecs] == [BytesCodec, Crc32cCodec]
        and isinstance(inner[0], BytesCodec) and len(inner) <= 2
        and all(isinstance(c, (BloscCodec, ZstdCodec)) for c in inner[1:])
        and tuple(sc.chunk_shape[1:]) == tuple(array.shape[1:])
        and getattr(array.metadata.chunk_key_encoding, "separator", None) == "/"
        and np.little_endian
    )
    if not ok:
        return None
    codec = None
    if len(inner) == 2 and isinstance(inner[1], BloscCodec):
        c = inner[1]
        codec = numcodecs.Blosc(cname=c.cname.value, clevel=c.clevel, shuffle=_SHUFFLE[c.shuffle.value],
                                blocksize=c.blocksize)
    elif len(inner) == 2:
        codec = numcodecs.Zstd(level=inner[1].level, checksum=inner[1].checksum)
    return sc.chunk_shape[0], codec


def _shard_path(array: zarr.Array, s: int) -> Path:
    return Path(f"{array.store.root}/{array.path}/c/{s}" + "/0" * (array.ndim - 1))


def fast_reader(array: zarr.Array, stable_rows: int) -> "ShardedRows | None":
    """A :class:`ShardedRows` for ``array`` if its layout is supported, else ``None``.

    ``stable_rows``: rows ``[0, stable_rows)`` are committed; only shards entirely below it are cached (the
    writer may still rewrite the shard holding the tail).
    """
    layout = _layout(array)
    return None if layout is None else ShardedRows(array, *layout, stable_rows)


def fast_writer(array: zarr.Array) -> "ShardEncoder | None":
    """A :class:`ShardEncoder` for ``array`` if its layout is supported, else ``None``."""
    layout = _layout(array)
    return None if layout is None else ShardEncoder(array, *layout)


class ShardEncoder:
    """Writes whole shard files of one sharded array of shape ``(N, *trailing)``."""

    def __init__(self, array: zarr.Array, inner: int, codec):
        self.array, self.inner, self.codec = array, inner, codec
        self.shard = array.shards[0]
        self.fill = np.full((inner,) + array.shape[1:], array.fill_value, array.dtype)

    def write(self, start: int, data: np.ndarray) -> None:
        """Write rows ``[start, start + len(data))``; ``start`` must be shard-aligned and the array's shape must
        already cover them. Every shard touched is replaced whole (the last one may be partial: its missing
        rows are never read back because they lie beyond the committed length). A failed write (``OSError``, e.g. a
        full disk) leaves the old shard file and no temporary file."""
        assert start % self.shard == 0, "shard writes must start on a shard boundary"
        data = np.ascontiguousarray(data, dtype=self.array.dtype)
        for a in range(0, len(data), self.shard):
            part = data[a:a + self.shard]
            n_chunks = self.shard // self.inner
            index = np.full((n_chunks, 2), _EMPTY, dtype="<u8")
            blobs, off = [], 0
            for j in range(-(-len(part) // self.inner)):
                chunk = part[j * self.inner:(j + 1) * self.inner]
                if len(chunk) < self.inner:  # pad the last chunk to full size, as zarr does
                    chunk = np.concatenate([chunk, self.fill[len(chunk):]])
                blob = self.codec.encode(chunk) if self.codec is not None else chunk.tobytes()
                blobs.append(blob)
                index[j] = (off, len(blob))
                off += len(blob)
            raw = index.tobytes()
            blobs += [raw, google_crc32c.value(raw).to_bytes(4, "little")]
            path = _shard_path(self.array, (start + a) // self.shard)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
            try:
                with open(tmp, "wb") as f:
                    f.write(b"".join(blobs))
                os.replace(tmp, path)
            except BaseException:       # a full disk: no temporary file left holding the space
                tmp.unlink(missing_ok=True)
                raise


class ShardedRows:
    """Random-row reader for one sharded array of shape ``(N, *trailing)`` (see the module docstring)."""

    def __init__(self, array: zarr.Array, inner: int, decoder, stable_rows: int):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype
        self.inner, self.shard = inner, array.shards[0]
        self.per_shard = self.shard // inner
        self.decoder = decoder
        self.stable_shards = stable_rows // self.shard
        self._index: dict[int, np.ndarray | None] = {}

    def read(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (int64, any order, repeats allowed, all < N) -> array ``(len(idx), *trailing)``.

        Raises ValueError (one line) on a corrupt shard index or chunk.
        """
        out = np.empty((len(idx),) + self.shape[1:], self.dtype)
        chunk = idx // self.inner
        uniq, inv = np.unique(chunk, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        splits = np.cumsum(np.bincount(inv, minlength=len(uniq)))[:-1]
        fds: dict[int, int] = {}
        try:
            for c, pos in zip(uniq.tolist(), np.split(order, splits)):
                data = self._chunk(c, fds)
                out[pos] = data[idx[pos] - c * self.inner]
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def _file(self, s: int) -> Path:
        return _shard_path(self.array, s)

    def _shard_index(self, s: int, fds: dict[int, int]) -> np.ndarray:
        if s in self._index:
            return self._index[s]
        path = self._file(s)
        try:
            fd = fds[s] = fds.get(s) or os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            # only committed rows are read, and every write stores whole shards: a missing file is damage
            raise ValueError(f"missing shard file {path}") from None
        n = self.per_shard * 16 + 4
        size = os.fstat(fd).st_size
        raw = os.pread(fd, n, size - n) if size >= n else b""
        if len(raw) != n or google_crc32c.value(raw[:-4]) != int.from_bytes(raw[-4:], "little"):
            raise ValueError(f"corrupt shard index in {path} (checksum mismatch)")
        index = np.frombuffer(raw[:-4], "<u8").reshape(self.per_shard, 2)
        if s < self.stable_shards:
            self._index[s] = index
        return index

    def _chunk(self, c: int, fds: dict[int, int]) -> np.ndarray:
        s, k = divmod(c, self.per_shard)
        index = self._shard_index(s, fds)
        shape = (self.inner,) + self.shape[1:]
        if index[k, 0] == _EMPTY:            # a committed row in a chunk the writer never stored: damage
            raise ValueError(f"missing chunk {k} in {self._file(s)}")
        if s not in fds:
            fds[s] = os.open(self._file(s), os.O_RDONLY)
        off, nbytes = int(index[k, 0]), int(index[k, 1])
        raw = os.pread(fds[s], nbytes, off)
        try:
            buf = self.decoder.decode(raw) if self.decoder is not None else raw
            return np.frombuffer(buf, self.dtype).reshape(shape)
        except Exception as e:  # noqa: BLE001 - any decode failure means a corrupt chunk
            raise ValueError(f"corrupt chunk {k} of {self._file(s)} ({type(e).__name__})") from None
