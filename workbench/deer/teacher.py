"""``workbench deer teacher``: the AR target answers corpus prompts; DEER's distillation data (arXiv:2512.15176 §3.1).

Prompts come from the corpus **train** split (the test split is held out for evaluation) through
:func:`~workbench.evaluation.prompts.make_prompts` (prompt ≤ ``prompt_len`` tokens ending at a line
boundary). The target continues each for ``gen_len`` tokens with :func:`~workbench.decoding.ar.ar_decode`
(batched, KV cache; greedy or sampled).

On-disk layout of ``out_dir``:

* ``chunk-00000.parquet``, ...: ``chunk_size`` answers each; columns ``prompt_id``, ``path``, ``category``,
  ``prompt`` (list of ids), ``answer`` (list of ids); the generation settings are in each file's
  schema metadata (key ``deer_teacher``);
* ``teacher.json``: the same settings, the answer count and the chunk list (the sidecar).

Resumable: every chunk is written to ``.partial`` and renamed; a rerun with the same settings keeps the
complete chunks and generates the rest, and a rerun with a larger ``n_answers`` extends the data (the
prompt list is a stable prefix in ``n_answers``; each batch's sampling seed depends only on its position).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ..corpus import CorpusError, by_split, load_corpus
from ..decoding.ar import ar_decode
from ..evaluation.prompts import Prompt, make_prompts
from ..atomic import atomic_path, write_json
from ..run_folder import LOCK, check_not_in_built_folder, check_not_in_store, locked_folder
from ..utils import RunDirError, prepare_run_dir
from ..model.loading import ModelLoading

SIDECAR = "teacher.json"
META_KEY = b"deer_teacher"
#: Settings that must match for a rerun to reuse existing chunks.
SETTINGS = ("target", "corpus", "split", "prompt_len", "gen_len", "temperature", "seed", "chunk_size", "per_file",
            "batch_size", "precision", "first")
#: Settings added after data was generated without them, with the value that data implies.
SETTINGS_ADDED = {"first": 0}


@dataclass
class TeacherConfig(ModelLoading):
    """Teacher answers of the AR target for DEER alignment (arXiv:2512.15176 §3.1)."""

    target: str = "builtin:tiny"
    """AR target: 'builtin:tiny' or a checkpoint directory."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    split: str = "train"
    """Corpus split of the prompts: 'train' or 'validation' (never the held-out 'test')."""
    n_answers: int = 2048
    """Number of answers (prompts)."""
    first: int = 0
    """Position of the first prompt answered in the split's prompt list. The list is a stable prefix in
    ``n_answers`` and ``per_file``, so ``first = N`` answers only prompts that a run of N answers (or of fewer
    ``per_file`` rounds giving N prompts) did not: fresh self-distillation data for a further training leg."""
    prompt_len: int = 128
    """Maximum prompt length in tokens."""
    gen_len: int = 128
    """Answer length in tokens."""
    temperature: float = 0.0
    """0: AR greedy; > 0: sampling at this temperature."""
    seed: int = 0
    """Sampling seed (each batch's seed depends only on this seed, its chunk and its offset)."""
    per_file: int = 16
    """At most this many prompts per corpus file (distinct cut points)."""
    batch_size: int = 64
    """Prompts generated together (must divide chunk_size)."""
    chunk_size: int = 256
    """Answers per Parquet file (the resume granule)."""
    precision: str = "fp32"
    """'fp32' or 'bf16' (autocast)."""
    device: str = "auto"
    """'cpu', 'cuda' or 'auto'."""
    out_dir: str = "runs/deer/teacher"
    """Output directory (chunks + teacher.json)."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for an inconsistent configuration."""
        if self.split not in ("train", "validation"):
            raise ValueError(f"teacher prompts must come from 'train' or 'validation', not {self.split!r} "
                             "(the test split is held out for evaluation)")
        for name in ("n_answers", "prompt_len", "gen_len", "batch_size", "chunk_size", "per_file"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.first < 0:
            raise ValueError(f"first must be >= 0, got {self.first}")
        if self.chunk_size % self.batch_size:
            raise ValueError(f"batch_size {self.batch_size} must divide chunk_size {self.chunk_size}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    def settings(self) -> dict:
        """The generation settings recorded with the data (and compared on resume)."""
        d = asdict(self)
        return {k: d[k] for k in SETTINGS}


def teacher_prompts(cfg: TeacherConfig, tokenizer) -> list[Prompt]:
    """Prompts ``cfg.first`` to ``cfg.first + cfg.n_answers - 1`` of the split (fewer when the split runs out;
    a stable prefix: more answers extend the list). Each keeps its ``prompt_id``, its position in the whole list.

    Raises :class:`~workbench.corpus.CorpusError` when the split has no prompt at or after ``cfg.first``."""
    docs = by_split(load_corpus(cfg.corpus), cfg.split)
    prompts = make_prompts(docs, cfg.first + cfg.n_answers, cfg.prompt_len, cfg.gen_len, tokenizer,
                           per_file=cfg.per_file)
    if cfg.first and len(prompts) <= cfg.first:
        raise CorpusError(f"the {cfg.split} split gives only {len(prompts)} prompts with per_file {cfg.per_file}, "
                          f"none from first = {cfg.first}; raise --per_file or lower --first")
    return prompts[cfg.first:]


def _chunk_path(out: Path, i: int) -> Path:
    return out / f"chunk-{i:05d}.parquet"


def _rows(path: Path) -> int:
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - an unreadable chunk is regenerated
        return -1


def read_sidecar(path: str | Path) -> dict:
    """The ``teacher.json`` of teacher folder ``path``: a mapping with the generation ``settings`` and its
    ``chunks``. Raises ``ValueError`` (one line naming the file) when it is not UTF-8 JSON of that form."""
    f = Path(path) / SIDECAR
    try:
        side = json.loads(f.read_text(encoding="utf-8"))
        if not (isinstance(side, dict) and isinstance(side.get("settings"), dict)
                and isinstance(side.get("chunks"), list)):
            raise ValueError("not a mapping with settings and chunks")
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{f} is damaged ({' '.join(str(e).split())[:80]}); generate the teacher data again into a "
                         "new --out_dir with `workbench deer teacher`") from None
    return side


def _check_resume(out: Path, settings: dict) -> None:
    side = out / SIDECAR
    if not side.exists():
        return
    old = {**SETTINGS_ADDED, **read_sidecar(out)["settings"]}
    diff = [f"{k}: {old.get(k)!r} vs {v!r}" for k, v in settings.items() if old.get(k) != v]
    if diff:
        raise ValueError(f"{out} holds teacher data generated with other settings ({'; '.join(diff)}); "
                         "choose another --out_dir")


def generate_chunk(model, prompts: list[Prompt], cfg: TeacherConfig, chunk_index: int, pad_id: int) -> pa.Table:
    """Answers of one chunk of prompts as an Arrow table (AR decoding in batches of ``cfg.batch_size``)."""
    answers: list[list[int]] = []
    for b in range(0, len(prompts), cfg.batch_size):
        batch = [list(p.prompt) for p in prompts[b:b + cfg.batch_size]]
        res = ar_decode(model, batch, cfg.gen_len, temperature=cfg.temperature, pad_id=pad_id,
                        precision=cfg.precision, seed=cfg.seed + chunk_index * 1009 + b)
        answers += res.tokens
    meta = {META_KEY: json.dumps(cfg.settings()).encode()}
    return pa.table({"prompt_id": [p.prompt_id for p in prompts], "path": [p.path for p in prompts],
                     "category": [p.category for p in prompts],
                     "prompt": pa.array([list(p.prompt) for p in prompts], type=pa.list_(pa.int32())),
                     "answer": pa.array(answers, type=pa.list_(pa.int32()))}).replace_schema_metadata(meta)


def generate_teacher(cfg: TeacherConfig, model=None, tokenizer=None,
                     on_chunk: Callable[[int], None] | None = None) -> Path:
    """Generate (or resume) the teacher data; returns ``cfg.out_dir``.

    Args:
        cfg: settings. model, tokenizer: the loaded target (loaded from ``cfg.target`` when ``None``).
        on_chunk: called with the chunk index after each chunk is written (progress; tests interrupt here).

    Raises ``ValueError`` for a bad config or an ``out_dir`` holding data of other settings,
    :class:`~workbench.corpus.CorpusError` when the split has too few long files.
    """
    cfg.validate()
    existing = Path(cfg.out_dir)
    if existing.is_dir() and any(q.name != LOCK for q in existing.iterdir()) and not (existing / SIDECAR).exists():
        raise RunDirError(f"{existing} is not empty and holds no teacher data ({SIDECAR}); choose another --out_dir")
    check_not_in_store(existing)
    check_not_in_built_folder(existing)
    created = not existing.exists()
    out = prepare_run_dir(cfg.out_dir)
    with locked_folder(out, "deer teacher"):     # one writer: two generations never mix their chunks
        return _generate(cfg, out, created, model, tokenizer, on_chunk)


def _generate(cfg: TeacherConfig, out: Path, created: bool, model, tokenizer, on_chunk) -> Path:
    """:func:`generate_teacher` in its locked folder ``out`` (``created``: this call made it)."""
    settings = cfg.settings()
    try:
        _check_resume(out, settings)
        if model is None:
            from ..model.load import resolve_device
            from .models import load_target

            model, tokenizer = load_target(cfg.target, resolve_device(cfg.device))
        prompts = teacher_prompts(cfg, tokenizer)
    except BaseException:
        if created and not any(q.name != LOCK for q in out.iterdir()):
            shutil.rmtree(out, ignore_errors=True)   # nothing half-written: the folder this call made goes again
        raise
    n = len(prompts)
    n_chunks = (n + cfg.chunk_size - 1) // cfg.chunk_size
    side = {"settings": settings, "n_answers": n, "complete": False,
            "chunks": [_chunk_path(out, i).name for i in range(n_chunks)]}
    write_json(out / SIDECAR, side, sort_keys=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for i in range(n_chunks):
        part = prompts[i * cfg.chunk_size:(i + 1) * cfg.chunk_size]
        path = _chunk_path(out, i)
        if _rows(path) == len(part):
            continue
        table = generate_chunk(model, part, cfg, i, pad)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        if on_chunk is not None:
            on_chunk(i)
    side["complete"] = True
    write_json(out / SIDECAR, side, sort_keys=True)
    return out


def main(argv: list[str]) -> int:
    """``workbench deer teacher --config <yaml> [--field value ...]``."""
    from ..cli_args import parse_dataclass

    cfg = parse_dataclass("workbench deer teacher", TeacherConfig, argv)
    out = generate_teacher(cfg)
    side = json.loads((out / SIDECAR).read_text())
    print(f"teacher data: {side['n_answers']} answers in {len(side['chunks'])} chunks under {out}")
    return 0
