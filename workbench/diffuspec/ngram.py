"""CPS's causal proxy (DiffuSpec, arXiv:2510.02358 §4.2, Eq. 7; the paper uses "a 3-gram KenLM trained offline"): an
interpolated Kneser–Ney n-gram model over token ids, queried with **kenlm**.

Library choice:

* queries: ``kenlm`` (the maintained C++ library the paper names; its pip package builds the query module only):
  1.5 µs per query from Python, against 359 µs for ``nltk.lm.KneserNeyInterpolated`` on the same 100 k byte
  tokens (``benchmarks/bench_diffuspec_proxy.py``; nltk scans every higher-order n-gram for its continuation
  counts, 15 ms per query with a 2,000-token vocabulary). A CPS step of beam 3, ~5 candidates and 8 positions
  makes ~120 queries.
* estimation: kenlm's estimator ``lmplz`` is a separate C++ binary (Boost) that pip does not ship, and nltk's
  model is too slow to export. So the counts and Kneser–Ney probabilities are
  computed here with numpy, **exactly** nltk's ``KneserNeyInterpolated`` formulas (tested against nltk on a
  small corpus), and written as a standard ARPA file that kenlm loads.

Interpolated Kneser–Ney of order 3 with discount D (as nltk.lm.smoothing.KneserNey):

* p₁(w) = N₁₊(·w) / N₁₊(··)                      (continuation unigram);
* p(w|b) = max(N₁₊(·bw) − D, 0) / N₁₊(·b·) + D·N₁₊(b·)/N₁₊(·b·) · p₁(w);
* p(w|ab) = max(c(abw) − D, 0) / c(ab·) + D·N₁₊(ab·)/c(ab·) · p(w|b);

a context without counts passes its lower order through unchanged. In ARPA form a seen n-gram stores its
interpolated probability and a context stores its γ as back-off weight, which reproduces the interpolation
exactly for unseen continuations. Words are token ids written as decimal strings. The unigram is mixed with a
uniform distribution over the tokenizer's vocabulary with weight ``epsilon`` (default 1e-6), so every token
(one unseen in training maps to kenlm's ``<unk>``) gets a finite score; ``epsilon = 0`` is nltk's model.

Files of a proxy directory: ``proxy.arpa.gz`` (gzip-compressed ARPA, which kenlm reads directly) and ``proxy.json`` (order, discount, epsilon, training tokens,
vocabulary size and the tokenizer's vocabulary fingerprint, which :func:`load_proxy` checks).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ARPA = "proxy.arpa.gz"
META = "proxy.json"
BUILD_HINT = "workbench diffuspec proxy --model <target> --out_dir <dir>"
_LOG10_ZERO = -99.0


class ProxyError(ValueError):
    """A missing, foreign or unreadable n-gram proxy."""


def _vocab_items(tokenizer) -> list:
    from ..tokenizer import MASK_TOKEN

    return sorted(((t, i) for t, i in tokenizer.get_vocab().items() if t != MASK_TOKEN), key=lambda kv: kv[1])


def vocab_fingerprint(tokenizer) -> str:
    """sha256 (16 hex digits) of the tokenizer's token → id map, without the workbench's ``[MASK]`` (added to
    a pretrained model for diffusion mode; never a text token): a proxy is only valid for the same ids."""
    return hashlib.sha256(json.dumps(_vocab_items(tokenizer)).encode()).hexdigest()[:16]


def vocab_size(tokenizer) -> int:
    """Tokens of the tokenizer without the workbench's ``[MASK]``."""
    return len(_vocab_items(tokenizer))


@dataclass
class KneserNeyCounts:
    """Kneser–Ney 3-gram tables from token-id sequences (each sequence counted separately, no padding).

    Attributes (numpy arrays; ids are int64):
        tri: ``(T, 3)`` distinct trigrams ``(a, b, w)``; tri_count ``(T,)`` their counts.
        bi: ``(G, 2)`` distinct bigrams ``(b, w)``; bi_cont ``(G,)`` N₁₊(·bw) (distinct a).
        uni: ``(U,)`` distinct tokens that follow another token; uni_cont ``(U,)`` N₁₊(·w).
    """

    tri: np.ndarray
    tri_count: np.ndarray
    bi: np.ndarray
    bi_cont: np.ndarray
    uni: np.ndarray
    uni_cont: np.ndarray


def count_ngrams(sequences: list[np.ndarray] | list[list[int]]) -> tuple[KneserNeyCounts, np.ndarray]:
    """Count the trigram, bigram-continuation and unigram-continuation tables of ``sequences`` (token ids);
    also returns the distinct bigram types ``(G, 2)``.

    Raises :class:`ProxyError` when no sequence has three tokens."""
    tris, bis = [], []
    for s in sequences:
        s = np.asarray(s, dtype=np.int64)
        if len(s) >= 2:
            bis.append(np.stack([s[:-1], s[1:]], 1))
        if len(s) >= 3:
            tris.append(np.stack([s[:-2], s[1:-1], s[2:]], 1))
    if not tris:
        raise ProxyError("the n-gram proxy needs sequences of at least 3 tokens")
    tri, tri_count = np.unique(np.concatenate(tris), axis=0, return_counts=True)
    bigram_types = np.unique(np.concatenate(bis), axis=0)
    bi, bi_cont = np.unique(tri[:, 1:], axis=0, return_counts=True)
    uni, uni_cont = np.unique(bigram_types[:, 1], return_counts=True)
    return KneserNeyCounts(tri, tri_count.astype(np.int64), bi, bi_cont.astype(np.int64), uni,
                           uni_cont.astype(np.int64)), bigram_types


def _group(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct rows of ``keys`` with the sum of ``values`` and the number of rows per group."""
    uk, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    return uk, np.bincount(inv, weights=values), np.bincount(inv)


def _lookup(table_keys: np.ndarray, query: np.ndarray, base: int) -> np.ndarray:
    """Row index in ``table_keys`` (distinct, any order) of every row of ``query`` (all present)."""
    def flat(a):
        a = np.atleast_2d(a.T).T if a.ndim == 1 else a
        out = np.zeros(len(a), dtype=np.int64)
        for c in range(a.shape[1]):
            out = out * base + a[:, c]
        return out
    k, q = flat(table_keys), flat(query)
    order = np.argsort(k)
    pos = np.searchsorted(k[order], q)
    return order[pos]


@dataclass
class KneserNeyModel:
    """Interpolated Kneser–Ney probabilities of every seen n-gram and the back-off weights (γ) of every
    context, ready for ARPA. Probabilities are natural numbers in [0, 1] (not logs)."""

    uni: np.ndarray
    uni_p: np.ndarray
    uni_gamma: np.ndarray        # γ of the unigram context b (NaN: no continuation counts)
    bi: np.ndarray
    bi_p: np.ndarray
    bi_gamma: np.ndarray         # γ of the bigram context (a, b) (NaN: not a trigram context)
    tri: np.ndarray
    tri_p: np.ndarray


def kneser_ney(sequences, discount: float = 0.75, vocab_size: int | None = None,
               epsilon: float = 0.0) -> KneserNeyModel:
    """Estimate the interpolated Kneser–Ney 3-gram model of ``sequences`` (nltk's formulas, see module doc).

    Args:
        sequences: token-id sequences. discount: D in (0, 1]. vocab_size: the tokenizer's vocabulary (needed
            when ``epsilon`` > 0). epsilon: weight of the uniform floor mixed into the unigram.

    Raises :class:`ProxyError` for D outside (0, 1], a negative epsilon, or sequences too short.
    """
    if not 0 < discount <= 1:
        raise ProxyError(f"Kneser-Ney discount must be in (0, 1], got {discount}")
    if epsilon < 0 or (epsilon > 0 and not vocab_size):
        raise ProxyError("epsilon must be >= 0 and needs vocab_size")
    c, bigram_types = count_ngrams(sequences)
    base = int(max(c.tri.max(), bigram_types.max())) + 1
    d = discount
    # unigram: continuation probability, with an optional uniform floor
    uni_p = c.uni_cont / len(bigram_types)
    if epsilon:
        uni_p = (1 - epsilon) * uni_p + epsilon / vocab_size
    # bigram level: context b over trigram middles
    ctx_b, tot_b, _ = _group(c.bi[:, :1], c.bi_cont.astype(float))          # N₁₊(·b·)
    types_b, _, n_types_b = _group(bigram_types[:, :1], np.ones(len(bigram_types)))  # N₁₊(b·)
    tot = np.zeros(len(types_b))
    tot[_lookup(types_b, ctx_b, base)] = tot_b
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma_b = np.where(tot > 0, d * n_types_b / tot, np.nan)                 # per bigram-type context b
    p1_floor = epsilon / vocab_size if epsilon else 0.0

    def p1(w):
        return _gather(c.uni, uni_p, w, p1_floor)

    # p(w|b) for every seen bigram type (b, w)
    b_idx = _lookup(types_b, bigram_types[:, :1], base)
    cont = _gather(_flat2(c.bi, base), c.bi_cont.astype(float), _flat2(bigram_types, base), 0.0)
    t = tot[b_idx]
    g = gamma_b[b_idx]
    p_lo = p1(bigram_types[:, 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        bi_p = np.where(t > 0, np.maximum(cont - d, 0) / t + g * p_lo, p_lo)
    # trigram level: context (a, b) with raw counts
    ctx_ab, c_ab, n_ab = _group(c.tri[:, :2], c.tri_count.astype(float))
    ab_idx = _lookup(ctx_ab, c.tri[:, :2], base)
    p_bw = bi_p[_lookup(bigram_types, c.tri[:, 1:], base)]
    gamma_ab = d * n_ab / c_ab
    tri_p = np.maximum(c.tri_count - d, 0) / c_ab[ab_idx] + gamma_ab[ab_idx] * p_bw
    # γ of every bigram entry (a, b) that is a trigram context; NaN otherwise
    bi_gamma = np.full(len(bigram_types), np.nan)
    is_ctx = np.isin(_flat2(bigram_types, base), _flat2(ctx_ab, base))
    bi_gamma[is_ctx] = gamma_ab[_lookup(ctx_ab, bigram_types[is_ctx], base)]
    uni_gamma = _gather(types_b[:, 0], gamma_b, c.uni, np.nan)
    extra = np.setdiff1d(types_b[:, 0], c.uni)           # tokens seen only at sequence starts
    uni = np.concatenate([c.uni, extra])
    uni_p = np.concatenate([uni_p, np.full(len(extra), p1_floor)])
    uni_gamma = np.concatenate([uni_gamma, _gather(types_b[:, 0], gamma_b, extra, np.nan)])
    return KneserNeyModel(uni, uni_p, uni_gamma, bigram_types, bi_p, bi_gamma, c.tri, tri_p)


def _gather(keys: np.ndarray, values: np.ndarray, query: np.ndarray, default: float) -> np.ndarray:
    """``values`` at the position of each ``query`` in the sorted distinct ``keys``; ``default`` where absent."""
    pos = np.clip(np.searchsorted(keys, query), 0, max(len(keys) - 1, 0))
    hit = keys[pos] == query if len(keys) else np.zeros(len(query), dtype=bool)
    return np.where(hit, values[pos] if len(keys) else default, default).astype(float)


def _flat2(a: np.ndarray, base: int) -> np.ndarray:
    return a[:, 0] * base + a[:, 1]


def _log10(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        out = np.log10(p)
    return np.where(np.isfinite(out), out, _LOG10_ZERO)


def write_arpa(model: KneserNeyModel, path: str | os.PathLike, unk_prob: float) -> None:
    """Write ``model`` as a gzip-compressed ARPA file (log10 probabilities, γ as back-off weights) with ``<s>``, ``</s>``
    and ``<unk>`` entries (``<s>``/``</s>`` never occur: sequences are scored from a null context)."""
    lines1 = [f"{_LOG10_ZERO:.6f}\t<s>", f"{_LOG10_ZERO:.6f}\t</s>",
              f"{math.log10(unk_prob) if unk_prob > 0 else _LOG10_ZERO:.6f}\t<unk>"]
    lp, bo = _log10(model.uni_p), model.uni_gamma
    for w, p, g in zip(model.uni.tolist(), lp.tolist(), bo.tolist()):
        lines1.append(f"{p:.6f}\t{w}" + ("" if math.isnan(g) else f"\t{math.log10(g):.6f}"))
    lp2 = _log10(model.bi_p)
    lines2 = [f"{p:.6f}\t{b} {w}" + ("" if math.isnan(g) else f"\t{math.log10(g):.6f}")
              for (b, w), p, g in zip(model.bi.tolist(), lp2.tolist(), model.bi_gamma.tolist())]
    lp3 = _log10(model.tri_p)
    lines3 = [f"{p:.6f}\t{a} {b} {w}" for (a, b, w), p in zip(model.tri.tolist(), lp3.tolist())]
    with gzip.open(path, "wt", compresslevel=6) as f:
        f.write(f"\\data\\\nngram 1={len(lines1)}\nngram 2={len(lines2)}\nngram 3={len(lines3)}\n\n")
        for n, lines in ((1, lines1), (2, lines2), (3, lines3)):
            f.write(f"\\{n}-grams:\n")
            f.write("\n".join(lines))
            f.write("\n\n")
        f.write("\\end\\\n")


class _quiet_stderr:
    """Silence file descriptor 2 (C++ libraries' own printing) inside the block."""

    def __enter__(self):
        import sys

        sys.stderr.flush()
        self._saved = os.dup(2)
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 2)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.close(self._null)


class NgramProxy:
    """A loaded proxy: natural-log scores of a token after a context, through kenlm states.

    Use :meth:`state` to start from the last tokens of a prefix and :meth:`score` to extend a state by one
    token (``(ln p, new_state)``).
    """

    def __init__(self, path: str | os.PathLike, meta: dict):
        import kenlm

        self.path, self.meta = Path(path), meta
        with _quiet_stderr():                      # kenlm prints a loading progress bar to fd 2
            self.model = kenlm.Model(str(self.path / ARPA))
        self._kenlm = kenlm
        self.order = int(meta.get("order", 3))

    def state(self, context: list[int]):
        """kenlm state after the last ``order − 1`` tokens of ``context`` (null context: no ``<s>``)."""
        st = self._kenlm.State()
        self.model.NullContextWrite(st)
        for t in context[-(self.order - 1):]:
            out = self._kenlm.State()
            self.model.BaseScore(st, str(int(t)), out)
            st = out
        return st

    def score(self, state, token: int):
        """``(ln p(token | state), next_state)``."""
        out = self._kenlm.State()
        lp10 = self.model.BaseScore(state, str(int(token)), out)
        return lp10 * math.log(10.0), out


def build_proxy(sequences, tokenizer, out_dir: str | os.PathLike, discount: float = 0.75,
                epsilon: float = 1e-6, source: str = "") -> Path:
    """Estimate the 3-gram proxy on ``sequences`` (token ids of the train split), write ``proxy.arpa`` and
    ``proxy.json`` into ``out_dir`` (staged: nothing half-written on failure) and return it."""
    from ..utils import staged_dir

    seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
    vocab = vocab_size(tokenizer)
    model = kneser_ney(seqs, discount, vocab, epsilon)
    out = Path(out_dir)
    with staged_dir(out) as tmp:
        write_arpa(model, tmp / ARPA, epsilon / vocab)
        meta = {"order": 3, "discount": discount, "epsilon": epsilon, "train_tokens": int(sum(len(s) for s in seqs)),
                "trigrams": int(len(model.tri)), "vocab_size": vocab, "vocab_fingerprint": vocab_fingerprint(tokenizer),
                "source": source, "library": "kenlm (queries); Kneser-Ney estimated with numpy as nltk.lm"}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
    return out


def load_proxy(path: str | os.PathLike, tokenizer) -> NgramProxy:
    """Load the proxy in ``path`` for ``tokenizer``.

    Raises :class:`ProxyError` (one line, naming the command that builds one) when the directory is missing
    or incomplete, or when the proxy was built for another vocabulary."""
    p = Path(path)
    if not (p / ARPA).is_file() or not (p / META).is_file():
        raise ProxyError(f"no n-gram proxy in {p} (needs {ARPA} and {META}); build one with `{BUILD_HINT}`")
    try:
        meta = json.loads((p / META).read_text())
    except json.JSONDecodeError as e:
        raise ProxyError(f"{p / META} is not valid JSON ({e}); rebuild it with `{BUILD_HINT}`") from None
    want, got = meta.get("vocab_fingerprint"), vocab_fingerprint(tokenizer)
    if want != got or meta.get("vocab_size") != vocab_size(tokenizer):
        raise ProxyError(f"the n-gram proxy in {p} was built for another vocabulary ({meta.get('vocab_size')} tokens, "
                         f"fingerprint {want}; this tokenizer: {vocab_size(tokenizer)}, {got}); rebuild it with "
                         f"`{BUILD_HINT}`")
    return NgramProxy(p, meta)
