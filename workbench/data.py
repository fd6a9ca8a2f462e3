"""Token data for LM training: the corpus splits as flat token arrays and fixed-length windows."""
from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .corpus import CorpusError, Document, by_split, load_corpus
from .interrupts import worker_ignores_signals
from .tokenizer import EOS_ID, bos_prefix, encode_bytes


ENCODE_CHUNK = 256
"""Documents per batched tokenizer call in :func:`encode_documents` (bounds the Python id lists held at once)."""


def encode_documents(docs: list[Document], tokenizer=None, eos_id: int | None = None) -> np.ndarray:
    """Concatenate the token ids of ``docs``, each followed by ``eos_id``: ``(total_tokens,)`` int32.

    ``tokenizer=None`` uses the byte-level fast path (:func:`workbench.tokenizer.encode_bytes`).
    ``eos_id=None`` → the byte tokenizer's end-of-sequence id, or ``tokenizer.eos_token_id``.

    Raises:
        CorpusError: the tokenizer has no end-of-sequence token and no ``eos_id`` was given.
    """
    if eos_id is None:
        eos_id = EOS_ID if tokenizer is None else tokenizer.eos_token_id
        if eos_id is None:
            raise CorpusError("the tokenizer has no end-of-sequence token to separate documents; "
                              "set tokenizer.eos_token (e.g. to its '</s>' or '<|endoftext|>' token)")
    parts = []
    sep = np.array([eos_id], dtype=np.int32)
    bos = np.asarray(bos_prefix(tokenizer), dtype=np.int32)     # the tokenizer's convention: [] or [BOS]
    for i in range(0, len(docs), ENCODE_CHUNK):
        chunk = docs[i:i + ENCODE_CHUNK]
        # batched: a fast tokenizer encodes a chunk's documents in parallel (2× on 2 cores), with the same ids
        encoded = [encode_bytes(d.text) for d in chunk] if tokenizer is None else \
            tokenizer([d.text for d in chunk], add_special_tokens=False, return_attention_mask=False)["input_ids"]
        for ids in encoded:
            parts += [bos, np.asarray(ids, dtype=np.int32), sep]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def teacher_tokens(path: str | list[str], eos_id: int) -> np.ndarray:
    """Self-distillation data: ``prompt + answer + EOS`` of every row of a ``workbench deer teacher`` folder
    (the AR model's own continuations of corpus prompts), concatenated: ``(total_tokens,)`` int32. A list of
    folders gives their data one after the other (e.g. answers generated on two machines, or by two runs with
    different ``--first``).

    Raises :class:`~workbench.corpus.CorpusError` for a folder without complete teacher data (checked for every
    folder before any is read).
    """
    import json
    from pathlib import Path

    import pyarrow.parquet as pq

    paths = [path] if isinstance(path, (str, Path)) else list(path)
    if not paths:
        raise CorpusError("train_data is an empty list; give a `workbench deer teacher` folder or leave it unset")
    infos = []
    for p in paths:
        side = Path(p) / "teacher.json"
        if not side.is_file():
            raise CorpusError(f"{p} holds no teacher data (teacher.json missing); "
                              "make it with `workbench deer teacher`")
        info = json.loads(side.read_text())
        if not info.get("complete"):
            raise CorpusError(f"teacher data in {p} is incomplete; rerun `workbench deer teacher` with the same settings")
        infos.append(info)
    parts, sep = [], np.array([eos_id], dtype=np.int32)
    for folder, info in zip(paths, infos):
        for name in info["chunks"]:
            t = pq.read_table(Path(folder) / name, columns=["prompt", "answer"])
            for prompt, answer in zip(t.column("prompt").to_pylist(), t.column("answer").to_pylist()):
                parts += [np.asarray(prompt, dtype=np.int32), np.asarray(answer, dtype=np.int32), sep]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


class RandomWindows(Dataset):
    """Windows of ``seq_len`` tokens at pseudo-random offsets. Item ``i`` is window ``start + i`` of the
    stream, a pure function of ``(seed, start + i)``, so a run resumed at step ``s`` continues the same
    data stream by starting at ``start = s * batch_size``.

    The length stays ``length`` (the whole run's stream) when ``start > 0``: Lightning counts the batches
    it restored from the checkpoint against the loader's length, so a loader shortened by ``start`` ended
    its epoch ``s`` batches early and replayed its first windows (a resume before half-way then diverged
    from the uninterrupted run). Training stops at ``max_steps`` before the extra items are reached.

    ``with_index``: items are ``(window, stream index start + i)`` pairs, so a training step knows where each
    of its windows lies in the step's global batch whichever rank or accumulation step loaded it."""

    def __init__(self, tokens: np.ndarray, seq_len: int, length: int, seed: int, start: int = 0,
                 with_index: bool = False):
        if len(tokens) <= seq_len:
            raise CorpusError(f"split has {len(tokens)} tokens, fewer than one window of {seq_len}")
        self.tokens, self.seq_len, self.seed, self.start = tokens, seq_len, seed, start
        self.length, self.with_index = length, with_index

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        off = int(np.random.default_rng((self.seed, self.start + i)).integers(0, len(self.tokens) - self.seq_len))
        window = torch.from_numpy(self.tokens[off:off + self.seq_len].astype(np.int64))
        return (window, self.start + i) if self.with_index else window


class EvenWindows(Dataset):
    """``count`` windows of ``seq_len`` tokens evenly spaced over ``tokens`` (deterministic validation set)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, count: int):
        if len(tokens) <= seq_len:
            raise CorpusError(f"split has {len(tokens)} tokens, fewer than one window of {seq_len}")
        self.tokens, self.seq_len = tokens, seq_len
        self.offsets = np.linspace(0, len(tokens) - seq_len - 1, count).astype(np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> torch.Tensor:
        o = int(self.offsets[i])
        return torch.from_numpy(self.tokens[o:o + self.seq_len].astype(np.int64))


class LMDataModule(pl.LightningDataModule):
    """Random training windows from the train split; evenly spaced validation windows.

    **Order and sharding.** Optimiser step ``s`` trains on windows ``s·G … (s+1)·G − 1`` of the seeded stream
    (:class:`RandomWindows`, ``G = batch_size``), whatever the number of devices: Lightning's distributed
    sampler gives rank ``r`` of ``W`` the windows ``r, r + W, r + 2W, …``, in forwards of ``per_device_batch``
    windows, so no window is read twice and the ranks' forwards of one step cover exactly its ``G`` windows.
    Training items are ``(window, stream index)`` pairs (:class:`RandomWindows` ``with_index``).

    Args:
        corpus: ``"stdlib"`` (default), a directory of source files or a ``.txt``/``.jsonl`` file.
        seq_len: window length in tokens.
        batch_size: windows per optimiser step (the global batch).
        train_windows: virtual epoch length in windows.
        val_windows: number of validation windows.
        seed: data seed.
        tokenizer: ``None`` for the byte-level fast path, else a Hugging Face tokenizer.
        num_workers: DataLoader workers.
        train_data: optional ``workbench deer teacher`` folder, or a list of them: train on their answers
            (:func:`teacher_tokens`) instead of the corpus's train split; validation stays on the corpus's
            validation split.
        per_device_batch: windows per forward on one device (:func:`workbench.distributed.batch_plan`);
            None: ``batch_size``.
    """

    def __init__(self, corpus: str = "stdlib", seq_len: int = 256, batch_size: int = 16,
                 train_windows: int = 1_000_000, val_windows: int = 64, seed: int = 0, tokenizer=None,
                 num_workers: int = 0, train_data: str | list[str] | None = None, per_device_batch: int | None = None):
        super().__init__()
        self.corpus, self.seq_len, self.batch_size = corpus, seq_len, batch_size
        self.per_device_batch = per_device_batch or batch_size
        self.train_windows, self.val_windows, self.seed = train_windows, val_windows, seed
        self.tokenizer, self.num_workers, self.train_data = tokenizer, num_workers, train_data
        self.train_tokens = self.val_tokens = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_tokens is not None:
            return
        docs = load_corpus(self.corpus)
        if self.train_data is not None:             # an empty list is refused by teacher_tokens, not ignored
            eos = EOS_ID if self.tokenizer is None else self.tokenizer.eos_token_id
            self.train_tokens = teacher_tokens(self.train_data, eos)
        else:
            self.train_tokens = encode_documents(by_split(docs, "train"), self.tokenizer)
        self.val_tokens = encode_documents(by_split(docs, "validation"), self.tokenizer)

    def train_dataloader(self) -> DataLoader:
        # resume: continue the window stream where the restored global step left it
        step = self.trainer.global_step if self.trainer is not None else 0
        ds = RandomWindows(self.train_tokens, self.seq_len, self.train_windows, self.seed, start=step * self.batch_size,
                           with_index=True)
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer),
                          num_workers=self.num_workers, drop_last=True, worker_init_fn=worker_ignores_signals)

    def val_dataloader(self) -> DataLoader:
        ds = EvenWindows(self.val_tokens, self.seq_len, self.val_windows)
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer),
                          num_workers=self.num_workers, worker_init_fn=worker_ignores_signals)


def rank_sampler(ds: Dataset, trainer) -> DistributedSampler | None:
    """The sampler of a sequential dataset on this rank: ``DistributedSampler`` without shuffling (rank ``r``
    of ``W`` takes items ``r, r + W, …``; made here rather than by Lightning so the order is explicit), or
    None (sequential) on one device."""
    if trainer is None or trainer.world_size <= 1:
        return None
    return DistributedSampler(ds, num_replicas=trainer.world_size, rank=trainer.global_rank, shuffle=False)
