"""Code-continuation prompts from held-out files (DESIGN.md "Embedded default").

A prompt is up to ``prompt_len`` tokens ending at a line boundary of a test file; its real
continuation is the next ``gen_len`` tokens. Cut points are chosen deterministically (crc32 of the
path), and prompts are spread over categories round-robin so small categories are represented.
"""
from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..corpus import CorpusError, Document
from ..tokenizer import bos_prefix, encode_bytes


@dataclass(frozen=True)
class Prompt:
    """One evaluation item: ``prompt`` ids (≤ prompt_len), ``real`` continuation ids (gen_len)."""

    prompt_id: int
    path: str
    category: str
    prompt: tuple[int, ...]
    real: tuple[int, ...]


def _encode(text: str, tokenizer) -> np.ndarray:
    if tokenizer is None:
        return encode_bytes(text).astype(np.int64)
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)


def make_prompts(docs: list[Document], n_prompts: int, prompt_len: int, gen_len: int, tokenizer=None,
                 min_prompt: int = 32, per_file: int = 1) -> list[Prompt]:
    """Pick ``n_prompts`` (prompt, continuation) pairs from ``docs``, at most ``per_file`` per file
    (distinct cut points; files are visited round-robin over categories, ``per_file`` rounds).

    The cut is the start of a line chosen by ``crc32(path)`` (and the round) among lines that leave ≥ ``gen_len``
    tokens after it and ≥ ``min_prompt`` tokens before it, and that no earlier round of the same file chose. A file
    that has no such line left gives no prompt in that round. ``tokenizer=None`` → byte-level ids.

    Prefix-stable: the prompts for ``n_prompts = n`` (or ``per_file = r``) are the first ones for any larger
    value, which is what ``workbench collect --extend`` relies on.

    Raises :class:`~workbench.corpus.CorpusError` if no file is long enough.
    """
    if n_prompts <= 0 or prompt_len <= 0 or gen_len <= 0:
        raise CorpusError("n_prompts, prompt_len and gen_len must be positive")
    by_cat: dict[str, list[Document]] = defaultdict(list)
    for d in sorted(docs, key=lambda d: zlib.crc32(d.path.encode())):
        by_cat[d.category].append(d)
    order: list[Document] = []
    queues = [list(v) for _, v in sorted(by_cat.items())]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    out: list[Prompt] = []
    bos = bos_prefix(tokenizer)
    if len(bos) >= prompt_len:
        raise CorpusError(f"prompt_len {prompt_len} leaves no room after the tokenizer's BOS prefix {bos}")
    chosen: dict[str, set[int]] = defaultdict(set)      # cuts of each file taken by earlier rounds
    for round_ in range(per_file):
        for d in order:
            if len(out) == n_prompts:
                break
            lines = d.text.splitlines(keepends=True)
            starts = np.cumsum([0] + [len(l) for l in lines[:-1]]) if lines else np.zeros(0, dtype=int)
            # character offsets of line starts → candidate cuts; tokenise prefix/suffix separately
            cands = [int(s) for s in starts if s > 0]
            if not cands:
                continue
            rng = np.random.default_rng((zlib.crc32(d.path.encode()), round_) if round_ else zlib.crc32(d.path.encode()))
            # the round's own order over all lines, then the first 8 not taken before: a file's non-repeated picks
            # are the same as without the exclusion
            for cut in [int(c) for c in rng.permutation(cands) if int(c) not in chosen[d.path]][:8]:
                before, after = _encode(d.text[:cut], tokenizer), _encode(d.text[cut:], tokenizer)
                if len(after) >= gen_len and len(before) >= min_prompt:
                    chosen[d.path].add(cut)
                    # the tokenizer's own BOS convention (bos_prefix), then the end of the text before the cut
                    ids = bos + before[-(prompt_len - len(bos)):].tolist()
                    out.append(Prompt(len(out), d.path, d.category, tuple(ids), tuple(after[:gen_len].tolist())))
                    break
    if not out:
        raise CorpusError(f"no held-out file is long enough for a {min_prompt}+{gen_len}-token prompt")
    return out
