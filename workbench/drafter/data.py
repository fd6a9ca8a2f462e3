"""Training prefixes for LoRA drafter alignment (NLD §3.3).

A batch item is ``{"ids": (L,), "lo": int, "hi": int}``: a token window and the range ``[lo, hi]`` of
prefix lengths the module may cut from it (the draft continues the cut prefix). Two sources:

* ``corpus``: random windows of the corpus train split (:class:`workbench.data.RandomWindows`), any cut
  in ``[min_prefix, max_prefix]``;
* ``self_distill``: the verifier's own AR continuations of corpus prompts, generated once and cached on
  disk (:func:`self_distill_windows`); cuts fall inside the generated part, so the drafter learns on the
  text the verifier itself produces at inference.

Validation always uses evenly spaced windows of the corpus validation split, one fixed cut per window,
so every run (and every loss variant) is validated on the same prefixes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from ..corpus import by_split, load_corpus
from ..data import EvenWindows, RandomWindows, encode_documents, rank_sampler
from ..utils import is_rank_zero

SOURCES = ("corpus", "self_distill")


class PrefixWindows(Dataset):
    """Items of ``base`` (``(L,)`` windows) tagged with the allowed prefix-length range ``[lo, hi]``;
    ``fixed_cut=True`` gives item ``i`` the deterministic single cut ``lo + (i * 7919) % (hi - lo + 1)``."""

    def __init__(self, base: Dataset, lo: int, hi: int, fixed_cut: bool = False):
        self.base, self.lo, self.hi, self.fixed_cut = base, lo, hi, fixed_cut

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict:
        if self.fixed_cut:
            cut = self.lo + (i * 7919) % (self.hi - self.lo + 1)
            return {"ids": self.base[i], "lo": cut, "hi": cut}
        return {"ids": self.base[i], "lo": self.lo, "hi": self.hi}


class RowWindows(Dataset):
    """``length`` rows drawn from a ``(M, L)`` tensor; row ``start + i`` is a pure function of the seed
    (resumable like :class:`~workbench.data.RandomWindows`)."""

    def __init__(self, rows: torch.Tensor, length: int, seed: int, start: int = 0):
        self.rows, self.seed, self.start = rows, seed, start
        self.length = length      # not length - start: see workbench.data.RandomWindows

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> torch.Tensor:
        j = int(np.random.default_rng((self.seed, 7, self.start + i)).integers(0, len(self.rows)))
        return self.rows[j]


@torch.no_grad()
def self_distill_windows(model, tokens: np.ndarray, n: int, prompt_len: int, gen_len: int, temperature: float,
                         seed: int, cache_file: str | Path, batch_size: int = 32, precision: str = "fp32",
                         pad_id: int = 0) -> torch.Tensor:
    """Prompts of ``prompt_len`` corpus tokens + the verifier's AR continuation of ``gen_len`` tokens.

    Generated once with :func:`~workbench.decoding.ar.ar_decode` (inside ``verifier_mode``: adapter off)
    and cached in ``cache_file`` (``torch.save`` of a dict with the tensor and the generation settings);
    a cache with other settings is regenerated.

    Returns ``(n, prompt_len + gen_len)`` long.
    """
    from ..decoding.ar import ar_decode
    from ..model.fingerprint import model_fingerprint
    from ..speculative.adapter import verifier_mode

    with verifier_mode(model):
        key = dict(n=n, prompt_len=prompt_len, gen_len=gen_len, temperature=temperature, seed=seed,
                   model=model_fingerprint(model))
        path = Path(cache_file)
        if path.is_file():
            saved = torch.load(path, weights_only=True)
            if saved.get("key") == key:
                return saved["windows"]
        prompts = RandomWindows(tokens, prompt_len, n, seed + 1)
        rows = []
        for i in range(0, n, batch_size):
            chunk = [prompts[j].tolist() for j in range(i, min(n, i + batch_size))]
            res = ar_decode(model, chunk, gen_len, temperature=temperature, precision=precision, seed=seed + i,
                            pad_id=pad_id)
            rows += [p + t for p, t in zip(chunk, res.tokens)]
    windows = torch.tensor(rows, dtype=torch.long)
    if is_rank_zero():                  # every rank generates the same rows; one writes the cache
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        torch.save({"key": key, "windows": windows}, tmp)
        tmp.replace(path)
    return windows


class DrafterDataModule(pl.LightningDataModule):
    """Prefix windows for drafter training and validation.

    Args:
        corpus: corpus spec (see :func:`workbench.corpus.load_corpus`).
        min_prefix, max_prefix: range of training prefix lengths (corpus source; window length = ``max_prefix``).
        batch_size: draft blocks per optimiser step.
        train_windows: virtual epoch length in windows.
        val_windows: number of validation prefixes.
        seed: data seed.
        tokenizer: ``None`` for the byte-level fast path, else a Hugging Face tokenizer.
        distilled: optional ``(M, prompt_len + gen_len)`` self-distillation rows (replaces the corpus
            training source); ``distill_prompt_len`` is where their generated part starts.
    """

    def __init__(self, corpus: str, min_prefix: int, max_prefix: int, batch_size: int, train_windows: int,
                 val_windows: int, seed: int = 0, tokenizer=None, distilled: torch.Tensor | None = None,
                 distill_prompt_len: int = 0):
        super().__init__()
        self.corpus, self.min_prefix, self.max_prefix = corpus, min_prefix, max_prefix
        self.batch_size, self.train_windows, self.val_windows, self.seed = batch_size, train_windows, val_windows, seed
        self.tokenizer, self.distilled, self.distill_prompt_len = tokenizer, distilled, distill_prompt_len
        self.per_device_batch = batch_size      # items per forward on one device (train lora sets it)
        self.train_tokens = self.val_tokens = None

    def setup(self, stage: str | None = None) -> None:
        if self.val_tokens is not None:
            return
        docs = load_corpus(self.corpus)
        self.val_tokens = encode_documents(by_split(docs, "validation"), self.tokenizer)
        if self.distilled is None:
            self.train_tokens = encode_documents(by_split(docs, "train"), self.tokenizer)

    def train_dataset(self, start: int = 0) -> Dataset:
        """Training items from window ``start`` of the stream on (resume continues the stream)."""
        if self.distilled is not None:
            base = RowWindows(self.distilled, self.train_windows, self.seed, start)
            return PrefixWindows(base, self.distill_prompt_len + 1, self.distilled.shape[1])
        base = RandomWindows(self.train_tokens, self.max_prefix, self.train_windows, self.seed, start)
        return PrefixWindows(base, self.min_prefix, self.max_prefix)

    def val_dataset(self) -> Dataset:
        return PrefixWindows(EvenWindows(self.val_tokens, self.max_prefix, self.val_windows), self.min_prefix,
                             self.max_prefix, fixed_cut=True)

    def train_dataloader(self) -> DataLoader:
        step = self.trainer.global_step if self.trainer is not None else 0
        ds = self.train_dataset(step * self.batch_size)
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer), drop_last=True)

    def val_dataloader(self) -> DataLoader:
        ds = self.val_dataset()
        return DataLoader(ds, batch_size=self.per_device_batch, sampler=rank_sampler(ds, self.trainer))
