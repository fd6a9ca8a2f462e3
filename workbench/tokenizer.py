"""Tokenizers: the byte-level tokenizer of the embedded presets, BPE training, and mask-token checks.

The byte-level tokenizer is a plain ``PreTrainedTokenizerFast`` (saved as ``tokenizer.json``) so any
tool loads it with ``AutoTokenizer.from_pretrained``. Token id ``b`` (0 ≤ b < 256) is the UTF-8 byte
``b``; the specials follow: ``[MASK]`` = 256, ``[SEP]`` = 257, ``[EOS]`` = 258 (also used as padding).
:func:`encode_bytes` is the fast NumPy path for corpora and gives exactly the same ids.
"""
from __future__ import annotations

import json

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

MASK_TOKEN, SEP_TOKEN, EOS_TOKEN = "[MASK]", "[SEP]", "[EOS]"
BYTE_VOCAB = 256
MASK_ID, SEP_ID, EOS_ID = 256, 257, 258


class TokenizerError(ValueError):
    """Raised for a tokenizer that cannot serve the workbench (e.g. no mask token)."""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-unicode map used by the ByteLevel pre-tokenizer."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level tokenizer: 256 byte tokens (id = byte value) + ``[MASK]``, ``[SEP]``, ``[EOS]``."""
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([AddedToken(t, special=True) for t in (MASK_TOKEN, SEP_TOKEN, EOS_TOKEN)])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, mask_token=MASK_TOKEN, sep_token=SEP_TOKEN,
                                   eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    if (fast.mask_token_id, fast.sep_token_id, fast.eos_token_id) != (MASK_ID, SEP_ID, EOS_ID):
        raise TokenizerError("byte tokenizer special ids changed; expected [MASK]=256, [SEP]=257, [EOS]=258")
    return fast


def encode_bytes(text: str) -> np.ndarray:
    """Byte-level token ids of ``text`` as ``(len(text.encode()),)`` uint16 (same ids as :func:`byte_tokenizer`)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def train_bpe_tokenizer(texts, vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (``tokenizers``) on an iterable of strings, with the same specials."""
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[MASK_TOKEN, SEP_TOKEN, EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, mask_token=MASK_TOKEN, sep_token=SEP_TOKEN,
                                   eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def splits_at_whitespace(tok: PreTrainedTokenizerBase | None) -> bool:
    """Whether the encoding of a text restarts at the **start of every whitespace run**: at every position ``a``
    with a non-whitespace character at ``a - 1`` and one of ``" \\t\\n\\r\\f\\v"`` at ``a``,

    - ``encode(text[:c])`` ends with ``encode(text[a:c])`` for every ``c > a``, and
    - ``encode(text[c:])`` starts with ``encode(text[c:a])`` for every ``c < a``,

    so :func:`~workbench.evaluation.prompts.make_prompts` can encode a window around a cut instead of a whole file.

    True for ``tok=None`` (the byte-level ids of :func:`encode_bytes`) and for GPT-2-style tokenizers (SmolLM2's,
    :func:`train_bpe_tokenizer`'s): no normaliser, a ByteLevel pre-tokenizer with its regex and no prefix space,
    added tokens that neither strip neighbours nor hold whitespace, and no BPE dropout (random merges). BPE never
    merges across the regex's pieces (``'s``, `` ?\\p{L}+``, `` ?\\p{N}+``, `` ?[^\\s\\p{L}\\p{N}]+``,
    ``\\s+(?!\\S)``, ``\\s+``): a piece that holds a non-whitespace character ends at the first whitespace after
    it, whatever follows, and the regex has no lookbehind, so the pieces from ``a`` on depend only on the text from
    ``a`` on. Added tokens are split off before the regex runs and hold no whitespace, so none spans ``a``. False
    for anything else (e.g. Gemma's SentencePiece-style BPE, whose merges cross whitespace)."""
    if tok is None:
        return True
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return False
    cfg = json.loads(backend.to_str())
    pre = cfg.get("pre_tokenizer") or {}
    added_ok = all(not a.get("lstrip") and not a.get("rstrip") and not any(ch.isspace() for ch in a.get("content", ""))
                   for a in cfg.get("added_tokens") or [])
    return (cfg.get("normalizer") is None and pre.get("type") == "ByteLevel" and bool(pre.get("use_regex", True))
            and not pre.get("add_prefix_space", False) and added_ok and not (cfg.get("model") or {}).get("dropout"))


def bos_prefix(tok: PreTrainedTokenizerBase | None) -> list[int]:
    """The ids ``tok`` puts before a text by its own convention (what ``add_special_tokens=True`` prepends):
    ``[bos_id]`` for tokenizers that add BOS (Llama-2 / 3 style), ``[]`` for those that do not (GPT-2 style,
    SmolLM2's, the byte-level tiny tokenizer, ``tok=None``). Prompts, training documents and ``decode`` inputs start
    with these ids, so a model sees text the way it was pretrained on it."""
    if tok is None:
        return []
    probe = "x = 1"
    with_ = list(tok(probe)["input_ids"])
    bare = list(tok(probe, add_special_tokens=False)["input_ids"])
    for k in range(len(with_) - len(bare) + 1):
        if with_[k:k + len(bare)] == bare:
            return with_[:k]
    return []


def is_byte_tokenizer(tok: PreTrainedTokenizerBase) -> bool:
    """True if ``tok`` maps text to UTF-8 byte ids like :func:`byte_tokenizer` (enables the fast path)."""
    try:
        probe = "déf x():\n\treturn 1  # ✓"
        return tok.mask_token_id == MASK_ID and tok(probe, add_special_tokens=False)["input_ids"] == encode_bytes(probe).tolist()
    except Exception:
        return False


def check_tokenizer_fits(tok: PreTrainedTokenizerBase, rows: int, where) -> None:
    """Check that every id ``tok`` can produce has an embedding row in a model with ``rows`` of them: ``len(tok)``
    tokens at most (a model may have more rows than tokens, padding rows), and every special token (bos, eos, pad,
    unk, mask, the additional ones) inside the embedding, so a tokenizer of another model is refused before it
    decodes garbage or indexes past the embedding.

    Raises :class:`TokenizerError` (one line naming ``where``, the model folder, both sizes or the bad id, and the fix).
    """
    fix = f"the tokenizer files in {where} belong to another model; restore the model's own tokenizer"
    if len(tok) > rows:
        raise TokenizerError(f"the tokenizer in {where} has {len(tok)} tokens but the model's embedding has {rows} "
                             f"rows; {fix}")
    for token, i in zip(tok.all_special_tokens, tok.all_special_ids):
        if i is None or not 0 <= i < rows:
            raise TokenizerError(f"the tokenizer in {where} gives its special token {token!r} the id {i}, outside "
                                 f"the model's embedding of {rows} rows; {fix}")


def require_mask_token(tok: PreTrainedTokenizerBase, add: bool = False) -> int:
    """Return the tokenizer's mask token id.

    Raises :class:`TokenizerError` when the tokenizer has no mask token and ``add`` is false, or cannot add
    one; with ``add=True`` a ``[MASK]`` special token is added (the caller must then resize the model's
    embeddings to ``len(tok)``).
    """
    if tok.mask_token_id is not None:
        return int(tok.mask_token_id)
    if not add:
        raise TokenizerError("the tokenizer has no mask token; rerun with --add_mask_token true to add [MASK] "
                             "(the model's embeddings are resized; decode, evaluate, speculate, demo and train lm "
                             "have it), or train lm --add_mask_token true once and use the saved model")
    try:
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
    except Exception as e:                      # a tokenizer whose vocabulary is fixed (e.g. a slow one)
        raise TokenizerError(f"the {type(tok).__name__} tokenizer cannot add a {MASK_TOKEN} token ({e}); use a "
                             "checkpoint whose tokenizer has a mask token, or a fast tokenizer") from None
    if tok.mask_token_id is None:
        raise TokenizerError(f"the {type(tok).__name__} tokenizer did not add a {MASK_TOKEN} token; use a "
                             "checkpoint whose tokenizer has a mask token, or a fast tokenizer")
    return int(tok.mask_token_id)
