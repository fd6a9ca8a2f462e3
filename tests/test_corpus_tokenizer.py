"""Corpus splits, categories and the byte-level tokenizer."""
import json
import subprocess
import sys

import numpy as np
import pytest

from workbench.corpus import CorpusError, by_split, category_of, load_corpus, load_directory, split_of
from workbench.data import encode_documents
from workbench.tokenizer import EOS_ID, MASK_ID, SEP_ID, byte_tokenizer, encode_bytes, is_byte_tokenizer, \
    require_mask_token, TokenizerError


def test_split_is_stable_across_processes():
    paths = ["asyncio/tasks.py", "json/decoder.py", "os.py", "test/test_re.py"]
    here = [split_of(p) for p in paths]
    code = f"from workbench.corpus import split_of; print([split_of(p) for p in {paths!r}])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONHASHSEED": "123"})
    assert other.stdout.strip() == str(here)


def test_stdlib_corpus_splits_and_categories():
    docs = load_corpus("stdlib")
    assert len(docs) > 500
    counts = {s: len(by_split(docs, s)) for s in ("train", "validation", "test")}
    assert counts["train"] > 10 * counts["test"] > 0 and counts["validation"] > 0
    cats = {d.category for d in docs}
    assert {"asyncio", "email", "modules"} <= cats
    assert category_of("asyncio/tasks.py") == "asyncio" and category_of("os.py") == "modules"
    # no file in two splits
    assert len({d.path for d in docs}) == len(docs)


def test_local_corpora(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(40):
        (tmp_path / "src" / f"m{i}.py").write_text(f"x = {i}\n")
    docs = load_directory(tmp_path / "src")
    assert len(docs) == 40 and {d.split for d in docs} <= {"train", "validation", "test"}
    j = tmp_path / "c.jsonl"
    j.write_text("\n".join(json.dumps({"text": f"doc {i}", "category": "c"}) for i in range(30)))
    assert len(load_corpus(str(j))) == 30
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="is empty"):
        load_corpus(str(tmp_path / "empty"))
    with pytest.raises(CorpusError, match="neither"):
        load_corpus(str(tmp_path / "missing"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(CorpusError, match="'text' field"):
        load_corpus(str(bad))


def test_byte_tokenizer_ids_and_fast_path():
    tok = byte_tokenizer()
    assert (tok.mask_token_id, tok.sep_token_id, tok.eos_token_id) == (MASK_ID, SEP_ID, EOS_ID)
    text = "def f(x):\n\treturn 'é✓'  # ünïcode\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8")) == encode_bytes(text).tolist()
    assert tok.decode(ids) == text
    assert is_byte_tokenizer(tok)


def test_encode_documents_separates_with_eos(tokenizer):
    docs = [d for d in load_corpus("stdlib") if d.path in ("abc.py", "this.py")]
    arr = encode_documents(docs)
    assert (arr == EOS_ID).sum() == len(docs)
    slow = encode_documents(docs, tokenizer)
    assert np.array_equal(arr, slow)


def test_encode_documents_in_chunks_equals_one_by_one(tokenizer, monkeypatch):
    """Batched tokenizer calls, chunk boundaries included, give each document's own ids in order."""
    import workbench.data as data

    docs = load_corpus("stdlib")[:5]
    one_by_one = np.concatenate([np.asarray([*tokenizer(d.text, add_special_tokens=False)["input_ids"], EOS_ID])
                                 for d in docs])
    monkeypatch.setattr(data, "ENCODE_CHUNK", 2)
    assert np.array_equal(encode_documents(docs, tokenizer), one_by_one)
    assert len(encode_documents([], tokenizer)) == 0


def test_mask_token_required(tokenizer):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="[EOS]")
    tok.mask_token = None
    with pytest.raises(TokenizerError, match="--add_mask_token true"):
        require_mask_token(tok)
    assert require_mask_token(tok, add=True) == tok.mask_token_id


def test_encode_documents_uses_the_tokenizers_own_eos(tokenizer):
    """A non-byte tokenizer separates documents with its own end-of-sequence id, not the byte id 258."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from workbench.corpus import CorpusError

    vocab = {"[UNK]": 0, "[EOS]": 1, **{c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="[EOS]", unk_token="[UNK]")
    docs = [d for d in load_corpus("stdlib") if d.path in ("abc.py", "this.py")]
    arr = encode_documents(docs, tok)
    assert (arr == 1).sum() == len(docs) and arr[-1] == 1 and arr.max() < len(vocab)
    tok.eos_token = None
    with pytest.raises(CorpusError, match="end-of-sequence"):
        encode_documents(docs, tok)


def test_bos_convention_is_the_tokenizer_s_own(small_corpus):
    """Prompts, training documents and decode inputs start with what the tokenizer itself prepends (issue 24 §1):
    a BOS for a Llama-style tokenizer that adds one, nothing for one that does not (SmolLM2, GPT-2, tiny)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from workbench.corpus import load_corpus
    from workbench.data import encode_documents
    from workbench.evaluation.prompts import make_prompts
    from workbench.tokenizer import bos_prefix, byte_tokenizer

    docs = load_corpus(str(small_corpus))[:20]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.train_from_iterator([d.text for d in docs], trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos_id = raw.token_to_id("<s>")
    plain = PreTrainedTokenizerFast(tokenizer_object=raw.__class__.from_str(raw.to_str()), bos_token="<s>",
                                    eos_token="</s>")
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos_id)])
    with_bos = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
    assert bos_prefix(with_bos) == [bos_id] and bos_prefix(plain) == [] and bos_prefix(None) == []
    assert bos_prefix(byte_tokenizer()) == []
    ps = make_prompts(docs, 3, 40, 16, with_bos)
    assert all(p.prompt[0] == bos_id and len(p.prompt) <= 40 and bos_id not in p.prompt[1:] for p in ps)
    assert all(p.prompt[0] != bos_id for p in make_prompts(docs, 3, 40, 16, plain))
    stream = encode_documents(docs[:3], with_bos)
    assert stream[0] == bos_id and (stream == bos_id).sum() == 3      # one BOS at the start of every document
    # the model's tokenizer picks the ids: a BPE prompt decodes to the text before its cut, and a byte-level
    # tokenizer gives the byte path's prompts (callers pass the model's tokenizer whatever it is)
    from tokenizers import decoders

    plain.backend_tokenizer.decoder = decoders.ByteLevel()
    p = make_prompts(docs, 1, 40, 16, plain)[0]
    text = next(d.text for d in docs if d.path == p.path)
    assert max(p.prompt) >= 256 and plain.decode(list(p.prompt) + list(p.real)) in text
    assert make_prompts(docs, 5, 40, 16, byte_tokenizer()) == make_prompts(docs, 5, 40, 16)


def test_windowed_prompt_encoding_equals_whole_file_encoding(small_corpus, monkeypatch):
    """make_prompts encodes windows around a cut instead of whole files where the tokenizer restarts at every
    whitespace run (GPT-2-style byte-level BPE, bytes). A window's ids are a tail (head) of the whole prefix's
    (suffix's), and the prompts equal those of whole-file encodes, token for token, on real files and on text built
    to trip the windows (blank lines, trailing spaces, tabs, CRLF, contractions, Unicode spaces, characters Python
    calls whitespace and the tokenizer does not, a file of two lines). Gemma-style BPE keeps whole-file encodes."""
    import re

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from workbench.corpus import Document, load_corpus
    from workbench.evaluation import prompts as P
    from workbench.tokenizer import splits_at_whitespace, train_bpe_tokenizer

    docs = load_corpus(str(small_corpus))[:60]
    tok = train_bpe_tokenizer([d.text for d in docs[:30]], vocab_size=600)
    tricky = "".join(f"def f_{j}(x):  \n\n\n    return x + {j}\t\n\r\n  \n# c{j} it's {j}'ll\u00a0 x\x1c\x1c y "
                     f"café\u2003{j}.5e-3\n\n" for j in range(80))
    docs = docs + [Document("t/tricky.py", "t", "train", tricky),
                   Document("t/one.py", "t", "train", "x = 1 " * 400 + "\n" + "y = 2 " * 400)]
    assert splits_at_whitespace(tok) and splits_at_whitespace(None)
    gemma_like = Tokenizer(models.BPE())
    gemma_like.normalizer = normalizers.Replace(" ", "▁")
    gemma_like.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    from transformers import PreTrainedTokenizerFast
    assert not splits_at_whitespace(PreTrainedTokenizerFast(tokenizer_object=gemma_like))

    # the property itself, on small windows: a window's ids are a tail (head) of the whole prefix's (suffix's)
    text = tricky[:3000]
    wt = P._WindowedText(text, tok, True)
    for cut in [m.end() for m in re.finditer("\n", text)][:-1]:
        whole_before, whole_after = P._encode(text[:cut], tok), P._encode(text[cut:], tok)
        for need in (1, 3, 9):
            b, a = wt.before(cut, need), wt.after(cut, need)
            assert len(b) >= min(need, len(whole_before)) and len(a) >= min(need, len(whole_after))
            assert whole_before[len(whole_before) - len(b):].tolist() == b.tolist()
            assert whole_after[:len(a)].tolist() == a.tolist()

    for t, plen, glen in ((tok, 96, 48), (None, 64, 40)):
        windowed = P.make_prompts(docs, 400, plen, glen, t, min_prompt=24, per_file=4)
        with monkeypatch.context() as m:
            m.setattr(P, "splits_at_whitespace", lambda _: False)
            whole = P.make_prompts(docs, 400, plen, glen, t, min_prompt=24, per_file=4)
        assert len(windowed) > 150 and any(p.path == "t/tricky.py" for p in whole)
        assert [(p.path, p.prompt, p.real) for p in windowed] == [(p.path, p.prompt, p.real) for p in whole]
