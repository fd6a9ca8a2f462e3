"""``workbench collect``: denoising trajectories into a Zarr store (NLD App. A), as a Lightning
**predict** loop.

Work is cut into *items*: fixed, ordered chunks of ``batch_size`` trajectories (one trajectory = one
block decoded from all-mask under a policy, conditioned on the real text before it). ``predict_step``
decodes one item and returns its per-step records; :class:`TrajectoryWriter` (a
``BasePredictionWriter``) appends them to this rank's shard. Under DDP rank ``r`` takes items
``r, r + W, r + 2W, ...`` and writes shard ``r``. A restarted run skips the items its shard already
committed, so a collection killed at any point continues where it stopped and ends identical to an
uninterrupted run. Ctrl-C (SIGINT) and SIGTERM stop it after the item in flight: every decoded item is committed
and the command exits 130 / 143 with one line saying how many items are committed (rerunning resumes). A full
disk stops it with one line (exit 1), keeping every committed item.

A finished (or unfinished) store grows with ``--extend true`` and a larger ``--n_prompts`` (and, once every file
has given a prompt, a larger ``--prompts_per_file``): prompt choice is prefix-stable, so the old plan's work
items are the first items of the new plan and only the new ones are collected. The extended store equals one
collected with the larger plan from the start.
"""
from __future__ import annotations

import json
import os
import signal
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter
from torch.utils.data import DataLoader, Dataset

from ..corpus import by_split, load_corpus
from ..decoding.base import DecodeError, cast_for_precision, check_precision, check_threshold, resolve_precision
from ..decoding.diffusion import diffusion_decode
from ..decoding.rules import confidence_rule, hybrid_rule, serial_rule
from ..distributed import check_accelerator
from ..evaluation.prompts import make_prompts
from ..interrupts import Interrupted, SafeStop, SignalFlag, stopping_at_safe_points
from ..model.fingerprint import model_fingerprint, tokenizer_hash
from ..run_folder import check_not_in_built_folder
from ..utils import check_run_dir
from ..tokenizer import is_byte_tokenizer
from .features import feature_spec, step_record, token_pca
from ..model.loading import ModelLoading

TRAJECTORY_POLICIES = ("serial", "hybrid", "confidence")
#: Store settings that ``--extend`` may raise: more prompts append work items after the ones already planned.
EXTENDABLE = ("n_prompts", "prompts_per_file", "work_items")
#: Store attr ``context_layout``: how a block's context is cut (:func:`build_specs`). "prompt_window+real_blocks":
#: the prompt's last ``context_len`` tokens and the real blocks before it. Stores from before lack it (each block
#: saw its own last ``context_len`` tokens), so a resume or an extension of one is refused, naming the setting.
CONTEXT_LAYOUT = "prompt_window+real_blocks"
_TEST_ITEM_DELAY = float(os.environ.get("WORKBENCH_TEST_ITEM_DELAY", "0"))


@dataclass
class CollectConfig(ModelLoading):
    """Trajectory collection into a Zarr store."""

    model: str = "builtin:tiny"
    """Checkpoint directory or 'builtin:tiny'."""
    add_mask_token: bool = False
    """Add a [MASK] token (embedding row = the mean of the others, deterministic) when the checkpoint's tokenizer
    has none, e.g. a plain Hugging Face AR model such as smollm2-135m."""
    out: str = "trajectories/tiny-serial.zarr"
    """Store path (created; rerunning the same command resumes it)."""
    extend: bool = False
    """Grow an existing store at --out to a larger --n_prompts / --prompts_per_file (all other settings equal):
    its work items are kept and only the new ones are collected."""
    policy: str = "serial"
    """Trajectory policy: serial (confidence k = 1), hybrid (ground-truth matches first), confidence (threshold)."""
    threshold: float = 0.9
    """Threshold of the confidence policy, in (0, 1]."""
    block_lengths: list[int] = field(default_factory=lambda: [8, 32])
    """Block lengths; one store group per B."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    split: str = "train"
    """Corpus split the prompts come from."""
    prompts: str | None = None
    """A local prompt file (.txt / .jsonl) or folder used instead of the corpus split (all its documents)."""
    n_prompts: int = 256
    """Prompts (at most one per file)."""
    prompts_per_file: int = 1
    """Prompts cut from each file (different cut points)."""
    blocks_per_prompt: int = 4
    """Consecutive blocks decoded per prompt, each conditioned on the real text before it."""
    context_len: int = 192
    """Prompt tokens before a prompt's first block (its last context_len); block k also sees the k real blocks
    before it, so the prompt is prefilled once per prompt."""
    batch_size: int = 64
    """Trajectories per work item (decoded in lockstep in one predict step)."""
    rows_per_chunk: int = 4096
    """Store rows per chunk (writes are buffered to whole chunks)."""
    feature_dim: int = 144
    """Sampler feature dimension recorded in the store's feature spec (12 + 3 · PCA dims)."""
    seed: int = 0
    """Seed recorded in the store (prompt choice is deterministic from crc32 of paths)."""
    precision: str = "auto"
    """'auto' (bf16 autocast where the accelerator has native bf16 matmuls, fp32 on a CPU that would emulate them:
    docs/guides/precision.md; the store records the precision it resolved to), 'bf16' (autocast), 'bf16-true'
    (weights stored in bf16: faster on a CPU with native bf16) or 'fp32'."""
    accelerator: str = "auto"
    """Lightning accelerator."""
    devices: int = 1
    """Processes / devices (each rank writes its own shard)."""
    strategy: str = "auto"
    """Lightning strategy ('auto', 'ddp', 'ddp_spawn'...). CPU DDP uses gloo."""
    progress_bar: bool = True
    """Show Lightning's progress bar."""

    def validate(self) -> None:
        check_precision(self.precision, allow_auto=True)
        if self.policy not in TRAJECTORY_POLICIES:
            raise ValueError(f"unknown trajectory policy {self.policy!r}; valid: {', '.join(TRAJECTORY_POLICIES)}")
        check_threshold(self.threshold)
        if not self.block_lengths:
            raise ValueError("--block_lengths is empty; give at least one block length, e.g. [8, 32]")
        for b in self.block_lengths:
            if b <= 0:
                raise DecodeError(f"block length must be positive, got {b}")
        for name in ("batch_size", "blocks_per_prompt", "n_prompts", "context_len", "rows_per_chunk",
                     "prompts_per_file", "devices"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
        feature_spec(self.feature_dim)


class TrajectorySpec(NamedTuple):
    """One trajectory to collect: a block of ``truth`` (the real text) after ``context``.
    (A NamedTuple, so Lightning's batch handling passes it through unchanged.)"""

    prompt_id: int
    category: int
    block_index: int
    context: tuple[int, ...]
    truth: tuple[int, ...]


def build_specs(prompts, categories: list[str], block_length: int, blocks_per_prompt: int, context_len: int
                ) -> list[TrajectorySpec]:
    """Trajectory specs in a fixed order: prompt by prompt, block by block.

    Block ``k`` of a prompt is conditioned on the last ``context_len`` tokens of the prompt and the ``k`` real
    blocks after it (``context = full[w:start]`` with one window start ``w`` per prompt): the contexts of a
    prompt's blocks chain (``context[k + 1] == context[k] + truth[k]``), so :func:`collect_item` prefills the
    prompt once and extends the KV cache with each real block, as real-context decoding does (NLD §4.1), instead
    of prefilling every block's context anew. A block's context is therefore at most
    ``context_len + (blocks_per_prompt - 1) · block_length`` tokens (store attr ``context_layout``).
    """
    out = []
    cat_ix = {c: i for i, c in enumerate(categories)}
    for p in prompts:
        full = list(p.prompt) + list(p.real)
        w = max(0, len(p.prompt) - context_len)
        for k in range(blocks_per_prompt):
            start = len(p.prompt) + k * block_length
            out.append(TrajectorySpec(p.prompt_id, cat_ix[p.category], k, tuple(full[w:start]),
                                      tuple(full[start:start + block_length])))
    return out


def prompt_digest(prompts) -> str:
    """sha256 (first 16 hex digits) of a prompt plan: every prompt's id, path, category, prompt ids and real
    continuation ids, in order. The store records it (root attr ``prompt_digest``) so that a resume or an
    ``--extend`` on a changed corpus, split or tokenizer, whose work items would no longer be the ones already
    committed, is refused."""
    import hashlib

    h = hashlib.sha256()
    for p in prompts:
        h.update(f"{p.prompt_id}\0{p.path}\0{p.category}\0{len(p.prompt)}\0{len(p.real)}\0".encode())
        h.update(np.asarray(p.prompt, dtype=np.int64).tobytes())
        h.update(np.asarray(p.real, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def prompt_documents(prompts) -> np.ndarray:
    """``(max prompt id + 1,)`` int64: per prompt id, crc32 of its source file's path (-1 where no prompt has that
    id), the store's ``prompt_document`` array."""
    out = np.full(max((p.prompt_id for p in prompts), default=-1) + 1, -1, dtype=np.int64)
    for p in prompts:
        out[p.prompt_id] = zlib.crc32(p.path.encode())
    return out


def check_prompt_digest(out, recorded: str | None, planned: str, what: str = "") -> None:
    """Refuse to resume (or extend) the store at ``out`` when the prompts its recorded settings plan today
    (digest ``planned``) are not those it was collected on (``recorded``; ``None``: a store from before the
    digest, not checked). Raises :class:`~workbench.trajectories.store.StoreError` (one line)."""
    from .store import StoreError

    if recorded is not None and recorded != planned:
        raise StoreError(f"store {out} was collected on other prompts{what} (prompt digest {recorded} != {planned}): "
                         "the corpus, its split or the tokenizer changed since; resume it on the corpus that "
                         "started it, or collect into a new path")


#: Store attrs that, with the corpus text, determine the prompt plan (and so the prompt digest).
PLAN_INPUTS = ("model_fingerprint", "tokenizer_hash", "corpus", "corpus_split", "seed", "n_prompts",
               "prompts_per_file", "blocks_per_prompt", "context_len", "block_lengths")


def check_resumed_prompts(out, attrs: dict) -> None:
    """Before a resume: when the store at ``out`` has every plan input of ``attrs`` (:data:`PLAN_INPUTS`), its
    recorded prompt digest must be ``attrs["prompt_digest"]``; a difference can only come from the corpus text
    (or the tokenizer's behaviour) and is refused by :func:`check_prompt_digest`. Other differences are left to
    :func:`~workbench.trajectories.store.create_store`, which names the setting. A missing store passes."""
    from .store import open_store

    if not (Path(out) / "zarr.json").is_file():
        return
    old = dict(open_store(out).attrs)
    if all(json.dumps(old.get(k), sort_keys=True) == json.dumps(attrs[k], sort_keys=True) for k in PLAN_INPUTS):
        check_prompt_digest(out, old.get("prompt_digest"), attrs["prompt_digest"])


class ItemDataset(Dataset):
    """Work items of one rank: each element is ``(block_length, item_id, [TrajectorySpec, ...])``."""

    def __init__(self, items: list[tuple[int, list[TrajectorySpec]]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def _rule(policy: str, threshold: float):
    if policy == "serial":
        return serial_rule, False
    if policy == "hybrid":
        return hybrid_rule, True
    return partial(confidence_rule, threshold=threshold), False


def prompt_chains(specs: list[TrajectorySpec]) -> list[list[int]]:
    """Group ``specs`` (indices, in order) into chains of consecutive blocks of one prompt whose contexts chain:
    spec ``i + 1`` follows spec ``i`` when it has the same prompt, the next block index and
    ``context[i + 1] == context[i] + truth[i]``. Every spec is in exactly one chain; specs built by
    :func:`build_specs` give one chain per prompt of an item (a work item may start or end inside a prompt)."""
    chains: list[list[int]] = []
    for i, s in enumerate(specs):
        if chains:
            prev = specs[chains[-1][-1]]
            if (s.prompt_id == prev.prompt_id and s.block_index == prev.block_index + 1
                    and len(s.truth) == len(prev.truth) and s.context == prev.context + prev.truth):
                chains[-1].append(i)
                continue
        chains.append([i])
    return chains


def check_context_fits(cfg: "CollectConfig", model) -> None:
    """The last block of a prompt sees ``context_len + (blocks_per_prompt - 1) · B`` tokens before it
    (:func:`build_specs`), so ``context_len + blocks_per_prompt · max(B)`` positions must fit the model.
    Raises :class:`~workbench.decoding.base.DecodeError` (one line) before anything is written."""
    ctx = int(getattr(model.backbone.config, "max_position_embeddings", 1 << 30))
    need = cfg.context_len + cfg.blocks_per_prompt * max(cfg.block_lengths)
    if need > ctx:
        raise DecodeError(f"--context_len {cfg.context_len} + --blocks_per_prompt {cfg.blocks_per_prompt} × block "
                          f"length {max(cfg.block_lengths)} = {need} positions exceeds the model context ({ctx}); "
                          "lower one of them")


@torch.no_grad()
def collect_item(model, specs: list[TrajectorySpec], policy: str, threshold: float, pad_id: int, precision: str,
                 share_prefix: bool = True) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Decode the trajectories of one work item and return ``(rows, trajs)`` store records.

    ``rows`` has one entry per (trajectory, step) with the state *before* that step's commit; ``traj``
    indexes ``specs``. ``label = 1[top-1 == final id]`` where the final id is what the same policy
    finally committed at that position. ``trajs`` has prompt_id, category, block_index, final_ids.

    With ``share_prefix`` the specs are decoded as :func:`prompt_chains`: one real-context decode per chain
    (all chains of one length in lockstep), which prefills the first block's context once and appends each
    real block to the KV cache (a ``B``-token forward) instead of prefilling every block's context: the same
    trajectories up to floating-point rounding (tested), for about half the forwarded tokens at
    ``context_len`` 192, B = 8 and 4 blocks (``benchmarks/bench_collect.py``). ``share_prefix=False`` decodes
    every spec from its own prefilled context (the reference).
    """
    b = len(specs[0].truth)
    rule, sees_truth = _rule(policy, threshold)
    chains = prompt_chains(specs) if share_prefix else [[i] for i in range(len(specs))]
    final = np.zeros((len(specs), b), dtype=np.int32)                               # (T, B)
    steps: list[dict] = []
    for n_blocks in sorted({len(c) for c in chains}):
        group = [c for c in chains if len(c) == n_blocks]
        traj_of = torch.tensor(group, dtype=torch.long)                             # (chains, n_blocks) → spec

        def on_step(start, step, block, probs, masked, commit, traj_of=traj_of):
            rec = step_record(probs, masked)
            active = masked.any(dim=1)
            rec = {k: v[active].cpu() for k, v in rec.items()}
            rec["traj"] = traj_of[active.cpu(), start // b]
            rec["step"] = torch.full((int(active.sum()),), step, dtype=torch.int16)
            steps.append(rec)

        res = diffusion_decode(model, [list(specs[c[0]].context) for c in group], n_blocks * b, b, rule,
                               real_continuation=[[t for i in c for t in specs[i].truth] for c in group],
                               pad_id=pad_id, precision=precision, on_step=on_step, rule_sees_truth=sees_truth,
                               commit_last_block=False)
        tokens = np.asarray(res.tokens, dtype=np.int32).reshape(len(group), n_blocks, b)
        final[traj_of.numpy()] = tokens
    cat = {k: torch.cat([s[k] for s in steps]) for k in steps[0]}
    order = np.lexsort((cat["step"].numpy(), cat["traj"].numpy()))                  # trajectory-major rows
    rows = {k: v.numpy()[order] for k, v in cat.items()}
    rows["label"] = rows["top_ids"][..., 0] == final[rows["traj"]]
    rows["traj"] = rows["traj"].astype(np.int64)
    trajs = {"prompt_id": np.array([s.prompt_id for s in specs], np.int64),
             "category": np.array([s.category for s in specs], np.int16),
             "block_index": np.array([s.block_index for s in specs], np.int32), "final_ids": final}
    return rows, trajs


class CollectModule(pl.LightningModule):
    """Predict-only module: ``predict_step`` decodes one work item under the trajectory policy."""

    def __init__(self, model, policy: str, threshold: float, pad_id: int, precision: str):
        super().__init__()
        self.model, self.policy, self.threshold, self.pad_id, self.precision = model, policy, threshold, pad_id, precision
        # a resume where one rank's items are all committed and another's are not: that rank has nothing to do
        self.allow_zero_length_dataloader_with_multiple_devices = True

    def predict_step(self, batch, batch_idx: int):
        b, item_id, specs = batch
        if _TEST_ITEM_DELAY:  # test hook: slow items down so crash tests can kill mid-run
            time.sleep(_TEST_ITEM_DELAY)
        rows, trajs = collect_item(self.model, specs, self.policy, self.threshold, self.pad_id, self.precision)
        return {"block_length": b, "item_id": item_id, "rows": rows, "trajs": trajs}


def _identity(x):
    return x


class TrajectoryWriter(BasePredictionWriter):
    """Appends each predicted item to this rank's shard of its block-length group; the shard writers
    buffer whole chunks; everything is flushed and committed at the end.

    ``flag`` (from :func:`~workbench.interrupts.stopping_at_safe_points`): once a SIGINT or SIGTERM has set it,
    the writer stops the loop after the item in flight (its safe point): it commits every item decoded so far
    and raises :class:`~workbench.interrupts.SafeStop` with the one-line :meth:`stop_message`."""

    def __init__(self, path: str, block_lengths: list[int], rows_per_chunk: int, flag: SignalFlag | None = None):
        super().__init__(write_interval="batch")
        self.path, self.block_lengths, self.rows_per_chunk = path, list(block_lengths), rows_per_chunk
        self.flag = flag
        self.writers: dict = {}
        self.planned = {b: 0 for b in self.block_lengths}   # this rank's work items per B (set by CollectData)
        self.rows_written = {b: 0 for b in self.block_lengths}
        self.seconds = 0.0

    def open(self, rank: int) -> dict:
        """Open (or resume) this rank's shard writer of every block length; returns them by B. Raises
        :class:`~workbench.trajectories.store.StoreError` or :class:`~workbench.atomic.DiskFullError` (the
        writers opened before are kept, so :meth:`on_exception` releases them)."""
        from .store import ShardWriter

        self.writers = {}
        for b in self.block_lengths:
            self.writers[b] = ShardWriter(self.path, b, rank=rank, rows_per_chunk=self.rows_per_chunk)
        return self.writers

    def on_predict_start(self, trainer, pl_module):
        if self.flag is not None:       # Lightning installed its own SIGTERM handler as the loop started
            self.flag.install()

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        t0 = time.perf_counter()
        b = prediction["block_length"]
        self.writers[b].append(prediction["item_id"], prediction["rows"], prediction["trajs"])
        self.rows_written[b] += len(prediction["rows"]["step"])
        self.seconds += time.perf_counter() - t0
        if self.flag is not None and self.flag.signum is not None:
            self.close()
            raise SafeStop(self.flag.signum, self.stop_message(self.flag.signum))

    def stop_message(self, signum: int) -> str:
        """The line printed when a signal stopped the collection: the work items committed (of this rank's plan)
        per block length, and how to go on."""
        done = {b: len(w.done_items) for b, w in self.writers.items()}
        per_b = ", ".join(f"B{b}: {done.get(b, 0)} of {n}" for b, n in self.planned.items())
        return (f"interrupted after committing {sum(done.values())} of {sum(self.planned.values())} work items "
                f"({per_b}); {signal.Signals(signum).name}: stopped after the item in flight; rerun the same "
                "command to resume")

    def close(self) -> None:
        """Commit every appended item and release the shard writers. Raises
        :class:`~workbench.atomic.DiskFullError` on a full disk."""
        for w in self.writers.values():
            w.close()

    def on_predict_end(self, trainer, pl_module):
        self.close()

    def on_exception(self, trainer, pl_module, exception):
        """A failure (a full disk, a second Ctrl-C) stops the loop: release the shard locks without writing more;
        what was committed stays committed, and a rerun resumes after it."""
        for w in self.writers.values():
            w.release()


class CollectData(pl.LightningDataModule):
    """Splits the work items over ranks (``items[rank::world]``) and drops the items this rank's shards
    already committed (resume)."""

    def __init__(self, items: list[tuple[int, int, list[TrajectorySpec]]], writer: TrajectoryWriter):
        super().__init__()
        self.items, self.writer = items, writer

    def predict_dataloader(self):
        rank, world = self.trainer.global_rank, self.trainer.world_size
        writers = self.writer.open(rank)
        check_same_world(self.writer.path, self.items[rank::world], rank, world)
        self.writer.planned = {b: sum(1 for it in self.items[rank::world] if it[0] == b) for b in writers}
        mine = [it for it in self.items[rank::world] if it[1] not in writers[it[0]].done_items]
        return DataLoader(ItemDataset(mine), batch_size=None, shuffle=False, collate_fn=_identity)


def check_same_world(path, mine: list[tuple[int, int, list]], rank: int, world: int) -> None:
    """Refuse to resume a store with another number of processes than the run that started it.

    Rank ``r`` of ``world`` owns work items ``items[r::world]``; a resume with another world size would give
    rank ``r`` items another rank's shard already holds, and collect them twice. In a run with the same world
    size no other shard ever holds this rank's items, so the check cannot fire while the other ranks write.
    Raises :class:`~workbench.trajectories.store.StoreError` (one line)."""
    from .store import StoreError, committed_items

    for b in sorted({it[0] for it in mine}):
        ids = {it[1] for it in mine if it[0] == b}
        for shard, done in committed_items(path, b).items():
            if shard != f"shard-{rank:03d}" and ids & done:
                raise StoreError(f"store {path} was started with another number of processes: {shard} of B{b} "
                                 f"already holds work items of rank {rank} of {world}; resume with the --devices "
                                 "of the first run, or collect into a new path")


def store_attrs(cfg: CollectConfig, model, tok, categories: list[str]) -> dict:
    """Root attributes of a store (schema version is added by the store layer). They include the decoding
    ``precision``: the labels and top-k of a bf16 decode are not an fp32 one's, so a resume in another precision
    (say fp32 on a CPU that emulates bf16) is refused by :func:`~workbench.trajectories.store.create_store`
    instead of mixing the two."""
    return {"model_fingerprint": model_fingerprint(model), "tokenizer_hash": tokenizer_hash(tok),
            "policy": cfg.policy, "threshold": cfg.threshold if cfg.policy == "confidence" else None,
            "block_lengths": list(cfg.block_lengths), "feature_spec": feature_spec(cfg.feature_dim),
            "corpus": cfg.corpus if cfg.prompts is None else cfg.prompts,
            "corpus_split": cfg.split if cfg.prompts is None else "all", "seed": cfg.seed, "categories": categories,
            "n_prompts": cfg.n_prompts, "prompts_per_file": cfg.prompts_per_file,
            "blocks_per_prompt": cfg.blocks_per_prompt, "context_len": cfg.context_len, "context_layout": CONTEXT_LAYOUT,
            "batch_size": cfg.batch_size, "precision": cfg.precision,
            "mask_token_id": int(model.mask_token_id), "vocab_size": int(model.vocab_size),
            "model": cfg.model, **model_family(model)}


def model_family(model) -> dict:
    """``{"model_family": ...}``: the decoding semantics of a released diffusion LM recorded in its stores
    (:meth:`~workbench.model.families.spec.FamilySpec.semantics` with its block size), so a store says which
    attention, shift and cache its labels came from; ``{}`` for the workbench's own tri-mode models (whose stores
    keep the attributes they always had)."""
    spec = getattr(model, "family", None)
    return {} if spec is None else {"model_family": {**spec.semantics(), "block_size": model.block_size}}


def check_extension(cfg: CollectConfig, docs, enc, categories: list[str],
                    specs: dict[int, list[TrajectorySpec]]) -> None:
    """Before ``--extend`` grows the store at ``cfg.out``: rebuild the plan it was started with (its recorded
    ``n_prompts`` and ``prompts_per_file``) and check that it is the prefix of the new plan ``specs`` (per B) and
    that its last work item is whole, so every committed item keeps its id and content. A missing store is simply
    created; other differing settings are left to :func:`~workbench.trajectories.store.create_store`, which names
    them. A corpus changed since the store was collected (as on a resume) is
    detected by the prompt digest the store records (:func:`prompt_digest`).

    Raises :class:`~workbench.trajectories.store.StoreError` (one line) otherwise, before anything is written."""
    from .store import StoreError, open_store

    if not (Path(cfg.out) / "zarr.json").is_file():
        return
    old = dict(open_store(cfg.out).attrs)
    if old.get("n_prompts") is None or old.get("prompts_per_file") is None:
        raise StoreError(f"store {cfg.out} does not record its prompt plan (n_prompts, prompts_per_file): it cannot "
                         "be extended; collect into a new path")
    for key in ("n_prompts", "prompts_per_file"):
        if getattr(cfg, key) < old[key]:
            raise StoreError(f"--extend cannot shrink store {cfg.out}: --{key} {getattr(cfg, key)} < its {old[key]}")
    same = {"batch_size": cfg.batch_size, "blocks_per_prompt": cfg.blocks_per_prompt, "context_len": cfg.context_len,
            "block_lengths": list(cfg.block_lengths), "policy": cfg.policy, "context_layout": CONTEXT_LAYOUT}
    if any(old.get(k) != v for k, v in same.items()):
        return                                    # refused by create_store, naming the setting
    if len(cfg.block_lengths) > 1 and cfg.devices > 1:
        raise StoreError(f"store {cfg.out} has {len(cfg.block_lengths)} block lengths: extend it with --devices 1 "
                         "(ranks take every W-th work item over all groups, so growing one group moves the next "
                         "group's items to other ranks)")
    b_max = max(cfg.block_lengths)
    before = make_prompts(docs, old["n_prompts"], cfg.context_len, cfg.blocks_per_prompt * b_max, enc,
                          per_file=old["prompts_per_file"])
    check_prompt_digest(cfg.out, old.get("prompt_digest"), prompt_digest(before),
                        f" than its plan of {old['n_prompts']} prompts gives now")
    if old.get("categories") != categories:       # stored trajectories index the old list
        raise StoreError(f"the extended plan of store {cfg.out} has other prompt categories ({old.get('categories')} "
                         f"!= {categories}): extend only a store whose prompts cover every category; or use a new path")
    for b, new in specs.items():
        had = build_specs(before, categories, b, cfg.blocks_per_prompt, cfg.context_len)
        if new[:len(had)] != had:
            raise StoreError(f"the prompt choice of this workbench is not prefix-stable at B = {b}: store {cfg.out} "
                             "cannot be extended; collect into a new path")
        if len(had) % cfg.batch_size and len(new) > len(had):
            raise StoreError(f"store {cfg.out}'s last work item at B = {b} is partial ({len(had)} trajectories, "
                             f"batch_size {cfg.batch_size}): extending would change it; collect into a new path")


def _collect_device(cfg: CollectConfig) -> str:
    """The device type the collection decodes on: 'cuda' for a GPU accelerator (or 'auto' with one present), else
    'cpu' (what 'auto' precision is resolved for)."""
    gpu = cfg.accelerator in ("gpu", "cuda") or (cfg.accelerator == "auto" and torch.cuda.is_available())
    return "cuda" if gpu else "cpu"


def run_collect(cfg: CollectConfig) -> dict:
    """Collect (or resume) a store; returns counts and timings per block length.

    ``--out`` must be absent, an empty directory or a trajectory store
    (:func:`~workbench.trajectories.store.check_store_path`), checked before anything is written. Raises
    :class:`~workbench.trajectories.store.StoreError` / ``ValueError`` (one line) for bad settings or paths,
    :class:`~workbench.atomic.DiskFullError` on a full disk (committed items stay; rerun after freeing space),
    :class:`~workbench.interrupts.Interrupted` after a SIGINT / SIGTERM (completed items committed)."""
    from ..model.load import load_model
    from .store import check_store_path, create_store

    cfg.validate()
    cfg = replace(cfg, precision=resolve_precision(cfg.precision, _collect_device(cfg)))
    check_store_path(cfg.out, "--out")
    check_not_in_built_folder(cfg.out, "--out")         # an export or result folder: its rerun would delete the store
    check_run_dir(cfg.out, "--out")                     # a read-only file system
    pl.seed_everything(cfg.seed, verbose=False)
    check_accelerator(cfg.accelerator, cfg.devices, cfg.strategy)   # one line naming the fix (no GPU here)
    writer = TrajectoryWriter(cfg.out, cfg.block_lengths, cfg.rows_per_chunk)
    # Lightning checks the devices and the strategy here: before prompts are chosen or the store is created
    trainer = pl.Trainer(accelerator=cfg.accelerator, devices=cfg.devices, strategy=cfg.strategy, logger=False,
                         callbacks=[writer], enable_progress_bar=cfg.progress_bar, enable_model_summary=False,
                         use_distributed_sampler=False, inference_mode=True)
    model, tok, _ = load_model(cfg.model, "cpu", cfg.add_mask_token)
    check_context_fits(cfg, model)
    cast_for_precision(model, cfg.precision)
    docs = load_corpus(cfg.prompts) if cfg.prompts else by_split(load_corpus(cfg.corpus), cfg.split)
    b_max = max(cfg.block_lengths)
    enc = None if is_byte_tokenizer(tok) else tok
    prompts = make_prompts(docs, cfg.n_prompts, cfg.context_len, cfg.blocks_per_prompt * b_max, enc,
                           per_file=cfg.prompts_per_file)
    categories = sorted({p.category for p in prompts})
    emb = model.backbone.get_input_embeddings().weight.float()
    specs = {b: build_specs(prompts, categories, b, cfg.blocks_per_prompt, cfg.context_len) for b in cfg.block_lengths}
    if cfg.extend:
        check_extension(cfg, docs, enc, categories, specs)
    items, n_traj = [], {}
    for b, sp in specs.items():
        n_traj[b] = len(sp)
        items += [(b, i, sp[s:s + cfg.batch_size]) for i, s in enumerate(range(0, len(sp), cfg.batch_size))]
    # the planned work items per block length: `store verify` calls a store with fewer committed unfinished
    work_items = {str(b): sum(1 for it in items if it[0] == b) for b in cfg.block_lengths}
    attrs = {**store_attrs(cfg, model, tok, categories), "work_items": work_items,
             "prompt_digest": prompt_digest(prompts)}
    if not cfg.extend:                            # extend checked its old plan's digest above
        check_resumed_prompts(cfg.out, attrs)
    create_store(cfg.out, attrs, list(cfg.block_lengths),
                 token_pca(emb, feature_spec(cfg.feature_dim)["pca_dim"], cfg.seed),
                 growable=EXTENDABLE, extend=cfg.extend, replaceable=("prompt_digest",), derived=("categories",),
                 prompt_document=prompt_documents(prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with stopping_at_safe_points(f"the store {cfg.out}") as flag, warnings.catch_warnings():
        writer.flag = flag
        # a rerun on a complete store has nothing left to decode: that is its intention, not a mistake to flag
        warnings.filterwarnings("ignore", message=r"Total length of .* across ranks is zero")
        t0 = time.perf_counter()
        trainer.predict(CollectModule(model, cfg.policy, cfg.threshold, pad, cfg.precision),
                        datamodule=CollectData(items, writer), return_predictions=False)
        wall = time.perf_counter() - t0
    if flag.signum is not None:        # a signal after the last item's safe point: everything is committed
        raise Interrupted(flag.signum, writer.stop_message(flag.signum))
    return {"rank": trainer.global_rank, "wall_s": wall, "write_s": writer.seconds,
            "trajectories": n_traj, "rows_written_this_run": writer.rows_written,
            "rows_written_total_this_run": sum(writer.rows_written.values())}


def main(argv: list[str]) -> int:
    """``workbench collect``."""
    from ..cli_args import parse_dataclass
    from .store import store_info

    cfg = parse_dataclass("workbench collect", CollectConfig, argv)
    r = run_collect(cfg)
    if r["rank"] == 0:
        rows = r["rows_written_total_this_run"]
        print(f"rank 0: {rows} rows written this run in {r['wall_s']:.1f} s ({rows / max(r['wall_s'], 1e-9):.0f} rows/s; "
              f"store writes {r['write_s']:.1f} s); trajectories per B: {r['trajectories']}")
        print(json.dumps(store_info(cfg.out), indent=2, default=str))
    return 0


__all__ = ["CollectConfig", "collect_item", "run_collect", "TrajectoryWriter", "CollectModule", "asdict"]
