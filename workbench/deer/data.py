"""Teacher data for DEER training: read the Parquet chunks, split train / validation, batch rows.

The validation split is chosen per prompt by ``crc32(prompt_id) % 100 < val_percent`` (``split_by='prompt'``)
or per source file by ``crc32(path) % 100 < val_percent`` (``split_by='document'``: the teacher cuts each file
into up to ``per_file`` prompts, and with the prompt split a validation prompt's siblings from the same file are
trained on); training draws rows pseudo-randomly (row ``i`` of the stream is a pure function of
``(seed, i)``), so a resumed run continues the same stream.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Dataset

from ..data import rank_sampler

from .teacher import SIDECAR, read_sidecar


@dataclass
class TeacherRows:
    """Teacher answers in memory: parallel lists (``prompt`` and ``answer`` are token-id lists)."""

    prompt_id: list[int]
    category: list[str]
    prompt: list[list[int]]
    answer: list[list[int]]
    settings: dict
    path: list[str] | None = None
    """Source file of each prompt (``None`` for teacher data written before the column existed)."""

    def __len__(self) -> int:
        return len(self.prompt_id)

    def subset(self, idx: list[int]) -> "TeacherRows":
        """The rows at ``idx``, in that order, with the same settings."""
        return TeacherRows([self.prompt_id[i] for i in idx], [self.category[i] for i in idx],
                           [self.prompt[i] for i in idx], [self.answer[i] for i in idx], self.settings,
                           None if self.path is None else [self.path[i] for i in idx])


def load_teacher(path: str | Path) -> TeacherRows:
    """Read a teacher directory written by :func:`~workbench.deer.teacher.generate_teacher`.

    Raises ``FileNotFoundError`` when ``path`` has no ``teacher.json`` and ``ValueError`` when the data is
    incomplete (the generation was interrupted: rerun ``workbench deer teacher`` to finish it).
    """
    p = Path(path)
    side_path = p / SIDECAR
    if not side_path.is_file():
        raise FileNotFoundError(f"{p} holds no teacher data ({SIDECAR} missing); run `workbench deer teacher` first")
    side = read_sidecar(p)
    if not side.get("complete"):
        raise ValueError(f"teacher data in {p} is incomplete; rerun `workbench deer teacher` with the same settings")
    cols: dict[str, list] = {"prompt_id": [], "category": [], "prompt": [], "answer": [], "path": []}
    has_path = True
    for name in side["chunks"]:
        names = pq.read_schema(p / name).names
        has_path = has_path and "path" in names
        t = pq.read_table(p / name, columns=[k for k in cols if k in names])
        for k in cols:
            if k in t.column_names:
                cols[k] += t.column(k).to_pylist()
    return TeacherRows(cols["prompt_id"], cols["category"], cols["prompt"], cols["answer"], side["settings"],
                       cols["path"] if has_path else None)


SPLIT_BY = ("prompt", "document")


def split_rows(rows: TeacherRows, val_percent: int, split_by: str = "prompt") -> tuple[TeacherRows, TeacherRows]:
    """(train, validation): a row is held out when ``crc32(key) % 100 < val_percent``, where the key is
    ``str(prompt_id)`` (``split_by='prompt'``) or the prompt's source file path (``'document'``: every prompt cut
    from one file lands on the same side).

    Raises ``ValueError`` for an unknown ``split_by``, for ``'document'`` on teacher data without the path
    column, and on an empty side."""
    if split_by not in SPLIT_BY:
        raise ValueError(f"unknown split_by {split_by!r}; valid: {', '.join(SPLIT_BY)}")
    if split_by == "document" and rows.path is None:
        raise ValueError("this teacher data records no source paths; regenerate it with `workbench deer teacher` "
                         "or train with --split_by prompt")
    keys = [str(i) for i in rows.prompt_id] if split_by == "prompt" else rows.path
    is_val = [zlib.crc32(k.encode()) % 100 < val_percent for k in keys]
    tr = rows.subset([i for i, v in enumerate(is_val) if not v])
    va = rows.subset([i for i, v in enumerate(is_val) if v])
    if len(tr) == 0 or len(va) == 0:
        raise ValueError(f"teacher data of {len(rows)} answers gives an empty train or validation split at "
                         f"val_percent={val_percent} by {split_by}; generate more answers or raise --val_percent")
    return tr, va


class RandomRows(Dataset):
    """``length`` rows of ``rows`` drawn pseudo-randomly; item ``i`` is row ``rng(seed, start + i)``."""

    def __init__(self, rows: TeacherRows, length: int, seed: int, start: int = 0):
        self.rows, self.seed, self.start = rows, seed, start
        self.length = length      # not length - start: see workbench.data.RandomWindows

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        j = int(np.random.default_rng((self.seed, self.start + i)).integers(len(self.rows)))
        return self.rows.prompt[j], self.rows.answer[j]


class FixedRows(Dataset):
    """Every row of ``rows`` in order (validation)."""

    def __init__(self, rows: TeacherRows):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.rows.prompt[i], self.rows.answer[i]


def collate_rows(items: list[tuple[list[int], list[int]]]) -> dict:
    """Batch of rows → ``{"prompt": [...], "answer": [...]}`` (ragged lists; padding happens per stage)."""
    return {"prompt": [p for p, _ in items], "answer": [a for _, a in items]}


class TeacherDataModule(pl.LightningDataModule):
    """Random training rows and fixed validation rows of a teacher directory.

    Args:
        teacher: teacher directory.
        batch_size: rows per optimiser step (the global batch).
        train_rows: virtual epoch length in rows.
        val_percent: share of prompts (or source files) held out.
        val_rows: at most this many validation rows.
        seed: data seed.
        per_device_batch: rows per forward on one device (None: ``batch_size``).
        split_by: 'prompt' or 'document' (:func:`split_rows`).

    Step ``s`` trains on rows ``s·G … (s+1)·G − 1`` of the seeded stream; on several devices rank ``r`` of
    ``W`` loads rows ``r, r + W, …`` (:func:`~workbench.data.rank_sampler`), so no row is read twice.
    """

    def __init__(self, teacher: str, batch_size: int, train_rows: int, val_percent: int = 5, val_rows: int = 128,
                 seed: int = 0, per_device_batch: int | None = None, split_by: str = "prompt"):
        super().__init__()
        self.split_by = split_by
        self.teacher, self.batch_size, self.train_rows = teacher, batch_size, train_rows
        self.per_device_batch = per_device_batch or batch_size
        self.val_percent, self.val_rows, self.seed = val_percent, val_rows, seed
        self.train = self.val = None

    def setup(self, stage: str | None = None) -> None:
        if self.train is None:
            tr, va = split_rows(load_teacher(self.teacher), self.val_percent, self.split_by)
            self.train, self.val = tr, va.subset(list(range(min(len(va), self.val_rows))))

    def train_dataloader(self) -> DataLoader:
        step = self.trainer.global_step if self.trainer is not None else 0
        ds = RandomRows(self.train, self.train_rows, self.seed, start=step * self.batch_size)
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer),
                          collate_fn=collate_rows, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        ds = FixedRows(self.val)
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer),
                          collate_fn=collate_rows)
