"""Code-continuation prompts from held-out files (DESIGN.md "Embedded default").

A prompt is up to ``prompt_len`` tokens ending at a line boundary of a test file; its real
continuation is the next ``gen_len`` tokens. Cut points are chosen deterministically (crc32 of the
path), and prompts are spread over categories round-robin so small categories are represented.
"""
from __future__ import annotations

import re
import zlib
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..corpus import CorpusError, Document
from ..tokenizer import bos_prefix, encode_bytes, is_byte_tokenizer, splits_at_whitespace


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


#: characters per token a window starts with (it doubles until it holds enough tokens); code is ~3–4
_WINDOW_CHARS_PER_TOKEN = 6
#: where a whitespace run starts: the encoding restarts there (:func:`~workbench.tokenizer.splits_at_whitespace`).
#: Python's ``\\S`` excludes every character the tokenizers' Unicode ``\\s`` does (and a few more), and the six
#: ASCII whitespace characters are whitespace to both, so every position found is a restart point.
_RESTART = re.compile(r"(?<=\S)(?=[ \t\n\r\f\v])")


class _WindowedText:
    """The two encodings a cut needs, from windows of ``text`` that start or end where a whitespace run starts,
    instead of the whole text: exact where :func:`~workbench.tokenizer.splits_at_whitespace` holds (otherwise
    whole-text encodes). A file of ~15 k tokens costs two whole-file encodes per candidate cut without windows;
    with them, two encodes of a few hundred tokens."""

    def __init__(self, text: str, tokenizer, windowed: bool):
        self.text, self.tokenizer, self.windowed = text, tokenizer, windowed
        self.restarts = [m.start() for m in _RESTART.finditer(text)] if windowed else []
        lines = text.splitlines(keepends=True)
        #: character offsets of the line starts after the first (``str.splitlines``' line boundaries)
        self.line_starts = [int(x) for x in np.cumsum([len(line) for line in lines[:-1]])]

    def before(self, cut: int, need: int) -> np.ndarray:
        """The ids of ``text[:cut]``, or at least their last ``need`` (a tail of ≥ ``need`` ids)."""
        if not self.windowed:
            return _encode(self.text[:cut], self.tokenizer)
        span = need * _WINDOW_CHARS_PER_TOKEN
        while True:
            i = bisect_right(self.restarts, cut - span) - 1
            start = self.restarts[i] if i >= 0 and cut - span > 0 else 0
            ids = _encode(self.text[start:cut], self.tokenizer)
            if len(ids) >= need or start == 0:
                return ids
            span *= 2

    def after(self, cut: int, need: int) -> np.ndarray:
        """The ids of ``text[cut:]``, or at least their first ``need`` (a prefix of ≥ ``need`` ids)."""
        if not self.windowed:
            return _encode(self.text[cut:], self.tokenizer)
        span = need * _WINDOW_CHARS_PER_TOKEN
        while True:
            j = bisect_left(self.restarts, cut + span)
            end = self.restarts[j] if j < len(self.restarts) else len(self.text)
            ids = _encode(self.text[cut:end], self.tokenizer)
            if len(ids) >= need or end == len(self.text):
                return ids
            span *= 2


def make_prompts(docs: list[Document], n_prompts: int, prompt_len: int, gen_len: int, tokenizer=None,
                 min_prompt: int = 32, per_file: int = 1) -> list[Prompt]:
    """Pick ``n_prompts`` (prompt, continuation) pairs from ``docs``, at most ``per_file`` per file
    (distinct cut points; files are visited round-robin over categories, ``per_file`` rounds).

    The cut is the start of a line chosen by ``crc32(path)`` (and the round) among lines that leave ≥ ``gen_len``
    tokens after it and ≥ ``min_prompt`` tokens before it, and that no earlier round of the same file chose. A file
    that has no such line left gives no prompt in that round. ``tokenizer=None`` or a byte-level tokenizer
    (:func:`~workbench.tokenizer.is_byte_tokenizer`) → byte-level ids; pass the model's tokenizer always, so that
    a BPE model gets BPE prompts.

    Prefix-stable: the prompts for ``n_prompts = n`` (or ``per_file = r``) are the first ones for any larger
    value, which is what ``workbench collect --extend`` relies on.

    Raises :class:`~workbench.corpus.CorpusError` if no file is long enough.
    """
    if n_prompts <= 0 or prompt_len <= 0 or gen_len <= 0:
        raise CorpusError("n_prompts, prompt_len and gen_len must be positive")
    if tokenizer is not None and is_byte_tokenizer(tokenizer):
        tokenizer = None                     # the byte-level fast path, the same ids
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
    chosen: dict[int, set[int]] = defaultdict(set)      # cuts of each file taken by earlier rounds
    windowed = splits_at_whitespace(tokenizer)
    need_before = max(prompt_len - len(bos), min_prompt)
    texts: dict[int, _WindowedText] = {}
    for round_ in range(per_file):
        for i, d in enumerate(order):         # i, not the path, keys a file: a JSONL corpus's ids may repeat
            if len(out) == n_prompts:
                break
            if i not in texts:                 # found on a file's first visit, kept for later rounds
                texts[i] = _WindowedText(d.text, tokenizer, windowed)
            text = texts[i]
            cands = text.line_starts            # character offsets of line starts → candidate cuts
            if not cands:
                continue
            rng = np.random.default_rng((zlib.crc32(d.path.encode()), round_) if round_ else zlib.crc32(d.path.encode()))
            # the round's own order over all lines, then the first 8 not taken before: a file's non-repeated picks
            # are the same as without the exclusion
            for cut in [int(c) for c in rng.permutation(cands) if int(c) not in chosen[i]][:8]:
                # a window's ids are the tail (head) of the whole prefix's (suffix's), so the length checks and the
                # slices below give what whole-text encodes give
                before, after = text.before(cut, need_before), text.after(cut, gen_len)
                if len(after) >= gen_len and len(before) >= min_prompt:
                    chosen[i].add(cut)
                    # the tokenizer's own BOS convention (bos_prefix), then the end of the text before the cut
                    ids = bos + before[-(prompt_len - len(bos)):].tolist()
                    out.append(Prompt(len(out), d.path, d.category, tuple(ids), tuple(after[:gen_len].tolist())))
                    break
    if not out:
        raise CorpusError(f"no held-out file is long enough for a {min_prompt}+{gen_len}-token prompt")
    return out
