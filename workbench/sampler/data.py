"""Streaming sampler training data from a trajectory store (NLD App. A: per-position BCE on masked positions,
early stopping on a held-out trajectory split).

The store is never loaded into memory. Rows are read in contiguous **row blocks** (``block_rows`` rows,
one ``StoreReader.read_rows`` of a contiguous range each: its shard fast path beats ``read_row_range``
~10x); each epoch the block order is permuted (seed + epoch) and dealt round-robin to the ``world_size × num_workers`` readers (DDP rank r, DataLoader worker w → reader
``r·num_workers + w``). A reader keeps the rows of its split's trajectories, fills a shuffle buffer of
``buffer_blocks`` blocks, permutes it, computes features with
:func:`~workbench.trajectories.features.block_features` and yields batches. So every row of a split is
yielded exactly once per epoch (at world size 1), in a new order each epoch.

Split: a whole prompt (``split_by='prompt'``, default: all blocks of one prompt share context), every prompt cut
from one source file (``split_by='document'``: a store collected with ``prompts_per_file > 1`` cuts one file at
several points, and those prompts share text; needs the store's ``prompt_document`` array) or a single
trajectory (``split_by='traj'``) goes to validation when ``hash(id) < val_fraction`` (splitmix64 of the
id → [0, 1)); it depends only on the ids and ``val_fraction``, not on the seed.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..trajectories.features import block_features, feature_spec
from ..interrupts import worker_ignores_signals
from ..trajectories.store import StoreError, StoreReader, content_identity, open_store

SPLIT_BY = ("prompt", "document", "traj")
#: Store attrs that, with the corpus text, fix which prompt a prompt id names (``workbench collect``'s plan is
#: prefix-stable in ``n_prompts`` and ``prompts_per_file``, so those may differ): stores read together and split by
#: prompt must agree on them, or one id would name different prompts and leak held-out text into training.
PROMPT_PLAN_ATTRS = ("tokenizer_hash", "corpus", "corpus_split", "seed", "context_len", "blocks_per_prompt",
                     "block_lengths")


def check_same_prompt_plan(paths, attrs: list[dict]) -> None:
    """Stores ``paths`` (root ``attrs`` each) must share :data:`PROMPT_PLAN_ATTRS` to be split by prompt id.
    Raises :class:`StoreError` (one line) naming the first difference."""
    for p, a in zip(paths[1:], attrs[1:]):
        for key in PROMPT_PLAN_ATTRS:
            if a.get(key) != attrs[0].get(key):
                raise StoreError(f"stores {paths[0]} and {p} were collected on different prompt plans ({key}: "
                                 f"{attrs[0].get(key)!r} != {a.get(key)!r}), so their prompt ids name different "
                                 "prompts: train with split_by traj, or collect both with the same plan")


def check_distinct_stores(paths) -> None:
    """Stores read together must hold different rows: refuse two of ``paths`` with one
    :func:`~workbench.trajectories.store.content_identity` (a copy of a store, or two collections with the same
    settings), whose shared work items would be read, and trained on, twice. Raises :class:`StoreError` (one line
    naming both paths)."""
    seen: dict[str, str] = {}
    for p in paths:
        ident = content_identity(p)
        if ident in seen:
            raise StoreError(f"stores {seen[ident]} and {p} hold the same trajectories (content identity {ident}: a "
                             "copy, or a collection with the same settings), so their rows would be read twice: "
                             "pass only one of them (--store / --extra_stores)")
        seen[ident] = str(p)


def check_store_matches(store_attrs: dict, model_fingerprint: str | None = None, feature_dim: int | None = None,
                        name: str = "store") -> None:
    """Check a store's root attrs against the model and feature width a sampler is built for.

    Raises :class:`StoreError` (one line) if ``feature_dim`` differs from ``store_attrs['feature_spec']
    ['feature_dim']`` or ``model_fingerprint`` differs from ``store_attrs['model_fingerprint']``; a ``None``
    argument is not checked."""
    if feature_dim is not None:
        spec = store_attrs.get("feature_spec")
        have = spec.get("feature_dim") if isinstance(spec, dict) else None
        if have != feature_dim:
            raise StoreError(f"{name} has feature_spec feature_dim {have}, the sampler needs feature_dim "
                             f"{feature_dim}: set feature_dim {have} or collect a store with --feature_dim {feature_dim}")
    if model_fingerprint is not None and store_attrs.get("model_fingerprint") != model_fingerprint:
        raise StoreError(f"{name} was collected with model {store_attrs.get('model_fingerprint')}, not "
                         f"{model_fingerprint}; collect a store for this model")


def split_fraction(ids: np.ndarray) -> np.ndarray:
    """Deterministic uniform value in [0, 1) per integer id (splitmix64): ``(T,)`` int → ``(T,)`` float64."""
    z = np.asarray(ids, dtype=np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _split_rows_before(x: np.ndarray, row_start: np.ndarray, row_end: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Number of rows of kept trajectories in global rows ``[0, x)`` for each boundary ``x`` (vectorised)."""
    cum = np.concatenate([[0], np.cumsum((row_end - row_start) * keep)])
    k = np.searchsorted(row_end, x, side="right")               # trajectories entirely before x
    kk = np.minimum(k, len(row_start) - 1)
    part = np.where(k < len(row_start), keep[kk] * np.clip(x - row_start[kk], 0, None), 0) if len(row_start) else 0
    return cum[k] + part


class StoreRowStream(IterableDataset):
    """Batches of one split of a store: ``{"features": (n, B, F) float32, "masked": (n, B) bool, "label": (n, B)
    bool, "top1_prob": (n, B) float32, "row": (n,) int64 global row index}`` with ``n ≤ batch_size`` (only the
    last batch of a reader is short). Set :attr:`epoch` before iterating (new block order and row shuffle).

    ``equalize`` (training under DDP): every rank yields the same number of batches (the smallest rank's),
    dropping the last few batches of the larger ranks, as DDP's lock-step gradients require.
    """

    def __init__(self, path, block_length: int, keep_traj: np.ndarray, block_counts: np.ndarray, batch_size: int,
                 feature_dim: int, shuffle: bool, seed: int = 0, block_rows: int = 1024, buffer_blocks: int = 8,
                 rank: int = 0, world_size: int = 1, equalize: bool = False,
                 limits: dict[tuple[int, str], tuple[int, int]] | None = None):
        super().__init__()
        self.path = [str(x) for x in path] if isinstance(path, (list, tuple)) else str(path)
        self.block_length, self.keep_traj = int(block_length), keep_traj
        self.block_counts = block_counts  # (n_blocks,) rows of the split in each row block
        self.batch_size, self.feature_dim, self.shuffle, self.seed = int(batch_size), feature_dim, shuffle, seed
        self.block_rows, self.buffer_rows = int(block_rows), int(block_rows) * max(1, int(buffer_blocks))
        self.rank, self.world_size, self.equalize = rank, world_size, equalize
        self.limits = limits  # the rows the split was computed on (StoreReader.limits), None: all committed rows
        self.epoch = 0

    def block_order(self) -> np.ndarray:
        """The epoch's permutation of row blocks (identity without shuffle)."""
        n = len(self.block_counts)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)

    def batch_caps(self, num_workers: int) -> list[int]:
        """Batches each DataLoader worker of this rank yields this epoch (see ``equalize``)."""
        order, G = self.block_order(), self.world_size * num_workers
        n = [math.ceil(int(self.block_counts[order[g::G]].sum()) / self.batch_size) for g in range(G)]
        caps = n[self.rank * num_workers:(self.rank + 1) * num_workers]
        if self.equalize and self.world_size > 1:
            target = min(sum(n[r * num_workers:(r + 1) * num_workers]) for r in range(self.world_size))
            for _ in range(sum(caps) - target):
                caps[int(np.argmax(caps))] -= 1
        return caps

    def __iter__(self):
        info = get_worker_info()
        nw, wid = (info.num_workers, info.id) if info is not None else (1, 0)
        g, G = self.rank * nw + wid, self.world_size * nw
        cap = self.batch_caps(nw)[wid]
        mine = self.block_order()[g::G]
        reader = StoreReader(self.path, self.block_length, self.limits)
        k = feature_spec(self.feature_dim)["pca_dim"]
        pca = torch.from_numpy(np.ascontiguousarray(reader.token_pca[:, :k], dtype=np.float32))
        rng = np.random.default_rng([self.seed, self.epoch, g, 1])
        buf: list[dict[str, np.ndarray]] = []
        emitted = 0
        for b in mine.tolist():
            if emitted >= cap:
                return
            if not self.block_counts[b]:
                continue
            idx = np.arange(b * self.block_rows, min((b + 1) * self.block_rows, reader.n_rows), dtype=np.int64)
            rows = reader.read_rows(idx)  # contiguous, via the store's fast shard reader (~10x read_row_range)
            keep = self.keep_traj[rows["traj"]]
            rows["row"] = idx
            buf.append({k_: v[keep] for k_, v in rows.items()})
            if sum(len(r["row"]) for r in buf) >= self.buffer_rows:
                for batch in self._emit(buf, rng, pca, final=False):
                    if emitted >= cap:
                        return
                    emitted += 1
                    yield batch
        for batch in self._emit(buf, rng, pca, final=True):
            if emitted >= cap:
                return
            emitted += 1
            yield batch

    def _emit(self, buf: list, rng: np.random.Generator, pca: torch.Tensor, final: bool):
        """Yield batches from the buffer (shuffled); keep the remainder (< batch_size rows) unless ``final``."""
        if not buf:
            return
        rows = {k: np.concatenate([r[k] for r in buf]) for k in buf[0]}
        n = len(rows["row"])
        perm = rng.permutation(n) if self.shuffle else np.arange(n)
        full = n // self.batch_size * self.batch_size
        stop = n if final else full
        buf.clear()
        if stop < n:
            buf.append({k: v[perm[stop:]] for k, v in rows.items()})
        for a in range(0, stop, self.batch_size):
            idx = perm[a:a + self.batch_size]
            yield self._batch({k: v[idx] for k, v in rows.items()}, pca)

    def _batch(self, r: dict[str, np.ndarray], pca: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = block_features(torch.from_numpy(r["top_ids"]), torch.from_numpy(r["top_probs"]),
                               torch.from_numpy(r["entropy"]), torch.from_numpy(r["masked"]),
                               torch.from_numpy(r["step"]), pca, self.feature_dim)
        return {"features": feats, "masked": torch.from_numpy(r["masked"]), "label": torch.from_numpy(r["label"]),
                "top1_prob": torch.from_numpy(r["top_probs"][..., 0].astype(np.float32)),
                "row": torch.from_numpy(r["row"])}


class _EpochLoader(DataLoader):
    """A DataLoader that sets ``dataset.epoch`` at every ``iter()`` (before workers copy the dataset):
    ``epoch_fn()`` (the trainer's current epoch) or, when that returns None, the number of earlier iterations.

    ``skip_fn()`` (called at the first ``iter()`` only) gives the batches of that epoch a resumed run has already
    trained on; they are skipped, so a run resumed from a mid-epoch checkpoint sees exactly the batches the
    uninterrupted run saw next (each epoch's batch sequence is a pure function of the seed and the epoch)."""

    def __init__(self, dataset: StoreRowStream, epoch_fn, skip_fn=None, **kw):
        # its own generator: creating an iterator draws a base seed, which must not consume the global RNG that
        # dropout uses (a resumed run creates its iterators at other moments than the uninterrupted run)
        # workers ignore Ctrl-C: the main process stops at its safe point and ends them (workbench.interrupts)
        super().__init__(dataset, batch_size=None, persistent_workers=False, generator=torch.Generator().manual_seed(0),
                         worker_init_fn=worker_ignores_signals, **kw)
        self._epoch_fn, self._skip_fn, self._iters = epoch_fn, skip_fn, 0
        self.exhausted = False            # the current epoch's iterator has yielded its last batch

    def __iter__(self):
        e = self._epoch_fn() if self._epoch_fn is not None else None
        self.dataset.epoch = self._iters if e is None else int(e)
        skip = self._skip_fn() if self._skip_fn is not None and self._iters == 0 else 0
        self._iters += 1
        self.exhausted = False
        it = super().__iter__()
        return self._track(itertools.islice(it, skip, None) if skip else it)

    def _track(self, it):
        yield from it
        self.exhausted = True


class SamplerDataModule(pl.LightningDataModule):
    """Train / validation streams over block length ``block_length`` of the store at ``store``.

    Args:
        store: store path, or a list of stores of one model read as one dataset (:class:`StoreReader`; e.g.
            the serial and hybrid policies' stores, NLD App. A); block_length: B.
        batch_size: block states (rows) per batch; feature_dim: F (must match the store's feature_spec).
        val_fraction: share of prompts (or documents, or trajectories) held out, in (0, 1); split_by: 'prompt',
            'document' or 'traj' (see the module docstring).
        num_workers: DataLoader workers (each opens its own reader); seed: shuffle seed.
        block_rows / buffer_blocks: rows per contiguous read, shuffle buffer size in blocks.
        model_fingerprint: if given, the store must have been collected with this model.

    Raises :class:`StoreError` (one line) for a missing / mismatched store (see :func:`check_store_matches`),
    two stores holding the same rows (:func:`check_distinct_stores`), a store without ``token_pca`` or rows, or an
    empty split; ``ValueError`` for bad arguments.
    """

    def __init__(self, store, block_length: int, batch_size: int = 256, feature_dim: int = 144,
                 val_fraction: float = 0.1, split_by: str = "prompt", num_workers: int = 0, seed: int = 0,
                 block_rows: int = 1024, buffer_blocks: int = 8, model_fingerprint: str | None = None):
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
        if split_by not in SPLIT_BY:
            raise ValueError(f"unknown split_by {split_by!r}; valid: {', '.join(SPLIT_BY)}")
        if batch_size <= 0 or block_rows <= 0 or num_workers < 0:
            raise ValueError("batch_size and block_rows must be positive, num_workers >= 0")
        self.store = [str(x) for x in store] if isinstance(store, (list, tuple)) else str(store)
        self.block_length, self.batch_size = int(block_length), int(batch_size)
        self.per_device_batch = self.batch_size     # rows per forward on one device (train sampler sets it)
        self.feature_dim, self.num_workers, self.seed = feature_dim, num_workers, seed
        self.block_rows, self.buffer_blocks = block_rows, buffer_blocks
        reader = StoreReader(store, block_length)
        self.store_attrs = reader.attrs
        self._limits = reader.limits        # every worker reads this snapshot, however far a collection has gone since
        store = self.store if isinstance(self.store, str) else " + ".join(self.store)     # for messages
        check_store_matches(reader.attrs, model_fingerprint, feature_dim, name=f"store {store}")
        if len(reader.paths) > 1:
            check_distinct_stores(reader.paths)
        if len(reader.paths) > 1 and split_by in ("prompt", "document"):
            check_same_prompt_plan(reader.paths, [dict(open_store(p).attrs) for p in reader.paths])
        if reader.token_pca is None:
            raise StoreError(f"store {store} has no token_pca array: collect it with `workbench collect`")
        if reader.n_rows == 0:
            raise StoreError(f"store {store} has no rows at block length {block_length}: collect some first")
        df = reader.trajectories()
        key = df["prompt_id"].to_numpy() if split_by != "traj" else df.index.to_numpy()
        if split_by == "document":
            docs = reader.prompt_documents
            if docs is None or key.max(initial=-1) >= len(docs) or (docs[key] < 0).any():
                raise StoreError(f"store {store} records no source file for some of its prompts (collected by an "
                                 "earlier version): resume its collection with this version to record them, or use "
                                 "split_by prompt")
            key = docs[key]
        self.val_traj = split_fraction(key) < val_fraction                  # (n_traj,) bool
        rs, re_ = df["row_start"].to_numpy(np.int64), df["row_end"].to_numpy(np.int64)
        bounds = np.append(np.arange(0, reader.n_rows, block_rows), reader.n_rows)  # row-block edges
        self._counts = {}
        for split, keep in (("train", ~self.val_traj), ("val", self.val_traj)):
            self._counts[split] = np.diff(_split_rows_before(bounds, rs, re_, keep))
            if not self._counts[split].sum():
                raise StoreError(f"the {split} split of store {store} is empty ({len(np.unique(key))} {split_by} ids, "
                                 f"val_fraction {val_fraction}): collect more prompts, change val_fraction or split_by")
        self.n_train_rows, self.n_val_rows = (int(self._counts[s].sum()) for s in ("train", "val"))

    def _dataset(self, split: str, batch_size: int | None = None, one_reader: bool = False) -> StoreRowStream:
        t = None if one_reader else self.trainer
        rank, world = (t.global_rank, t.world_size) if t is not None else (0, 1)
        keep = self.val_traj if split == "val" else ~self.val_traj
        return StoreRowStream(self.store, self.block_length, keep, self._counts[split],
                              batch_size or self.per_device_batch,
                              self.feature_dim, shuffle=split == "train", seed=self.seed, block_rows=self.block_rows,
                              buffer_blocks=self.buffer_blocks, rank=rank, world_size=world, equalize=split == "train",
                              limits=self._limits)

    def _epoch(self):
        return self.trainer.current_epoch if self.trainer is not None else None

    def state_dict(self) -> dict:
        """Saved in every checkpoint: whether the epoch's training batches were all consumed when it was written
        (see :meth:`_done_in_epoch`)."""
        loader = getattr(self, "_train_loader", None)
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed if self.trainer is not None else 0
        return {"epoch_finished": bool(loader is not None and loader.exhausted), "batches_done": int(done)}

    def load_state_dict(self, state_dict: dict) -> None:
        self._skip_on_resume = 0 if state_dict.get("epoch_finished", True) else int(state_dict.get("batches_done", 0))

    def _done_in_epoch(self) -> int:
        """Batches of the current epoch a resumed run already trained on: the batches Lightning had processed in
        that epoch when the checkpoint was written inside it (saved with the checkpoint), 0 when it was written
        after the epoch's last batch (with a loader of unknown length Lightning keeps that epoch's count,
        although it starts the next one)."""
        return getattr(self, "_skip_on_resume", 0) if self.trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches; a new order every epoch (the trainer's ``current_epoch``, or the count of
        earlier iterations without a trainer); a run resumed mid-epoch skips the batches it already trained on."""
        self._train_loader = _EpochLoader(self._dataset("train"), self._epoch, self._done_in_epoch,
                                          num_workers=self.num_workers)
        return self._train_loader

    def val_dataloader(self) -> DataLoader:
        """Validation batches in store order (every validation row exactly once)."""
        return _EpochLoader(self._dataset("val"), None, num_workers=self.num_workers)

    def train_batches_per_epoch(self) -> int:
        """Batches per epoch on this rank (epoch 0; other epochs differ by at most a few batches)."""
        ds = self._dataset("train")
        return sum(ds.batch_caps(max(1, self.num_workers)))

    def train_steps_per_epoch(self) -> int:
        """Optimiser steps per epoch (epoch 0): batches of the global ``batch_size`` on one device, the same
        whatever the devices and accumulation (the schedule's horizon)."""
        return sum(self._dataset("train", self.batch_size, one_reader=True).batch_caps(max(1, self.num_workers)))
