"""``workbench diffuspec proxy``: build CPS's causal 3-gram proxy (:mod:`workbench.diffuspec.ngram`) on the
corpus train split, tokenized with the target's tokenizer."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProxyConfig:
    """The n-gram proxy of DiffuSpec's CPS (arXiv:2510.02358 §4.2, §5: a 3-gram KenLM trained offline)."""

    model: str = "tiny"
    """Target whose tokenizer the proxy uses: 'tiny', a named model (smollm2-135m) or a checkpoint directory."""
    corpus: str = "stdlib"
    """Corpus: 'stdlib', a directory of source files, or a .txt / .jsonl file."""
    split: str = "train"
    """Corpus split ('train'; the test split holds the evaluation prompts)."""
    max_tokens: int = 2_000_000
    """Train on at most this many tokens (the first documents of the split)."""
    discount: float = 0.75
    """Kneser–Ney discount D in (0, 1]."""
    epsilon: float = 1e-6
    """Weight of the uniform floor in the unigram (every token gets a finite score)."""
    out_dir: str = "runs/diffuspec/proxy"
    """Output directory (proxy.arpa, proxy.json); written staged, replaced when it exists."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for a bad setting."""
        if self.split == "test":
            raise ValueError("the proxy must not see the test split (it holds the evaluation prompts)")
        if self.max_tokens < 3:
            raise ValueError(f"max_tokens must be >= 3, got {self.max_tokens}")


def train_sequences(cfg: ProxyConfig, tokenizer) -> list:
    """Token-id arrays of the split's documents, in corpus order, up to ``cfg.max_tokens`` tokens in all."""
    from ..corpus import by_split, load_corpus
    from ..evaluation.prompts import _encode
    from ..tokenizer import is_byte_tokenizer

    enc = None if is_byte_tokenizer(tokenizer) else tokenizer
    seqs, total = [], 0
    for doc in by_split(load_corpus(cfg.corpus), cfg.split):
        ids = _encode(doc.text, enc)[:cfg.max_tokens - total]
        seqs.append(ids)
        total += len(ids)
        if total >= cfg.max_tokens:
            break
    return seqs


def build(cfg: ProxyConfig) -> Path:
    """Build the proxy of ``cfg``; returns its directory. Raises ``ValueError`` / ProxyError for bad input."""
    from transformers import AutoTokenizer

    from ..model.named import resolve
    from .ngram import build_proxy

    cfg.validate()
    tok = AutoTokenizer.from_pretrained(resolve(cfg.model)[0])
    t0 = time.time()
    seqs = train_sequences(cfg, tok)
    out = build_proxy(seqs, tok, cfg.out_dir, cfg.discount, cfg.epsilon,
                      source=f"{cfg.corpus}:{cfg.split}, model {cfg.model}, {time.time() - t0:.0f} s")
    return out


def main(argv: list[str]) -> int:
    """``workbench diffuspec proxy [--model M] [--out_dir D] ...``."""
    import json

    from ..cli_args import parse_dataclass
    from .ngram import META

    cfg = parse_dataclass("workbench diffuspec proxy", ProxyConfig, argv)
    out = build(cfg)
    meta = json.loads((out / META).read_text())
    print(f"n-gram proxy: {meta['train_tokens']} tokens, {meta['trigrams']} trigrams -> {out}")
    return 0
