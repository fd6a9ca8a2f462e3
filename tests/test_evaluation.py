"""Evaluation harness: the degeneration metrics (hand-computed), AR-sampling runs next to greedy, and the
demo's free-running verdict."""
import math

import numpy as np
import pandas as pd
import pytest

from workbench.demo import TARGETS, _degeneration
from workbench.evaluation.harness import EvalConfig, default_runs, evaluate_model, summarize
from workbench.evaluation.metrics import identifier_words, known_words, oov_word_rate
from workbench.evaluation.prompts import Prompt
from workbench.tokenizer import encode_bytes


def test_identifier_words_and_oov_rate_hand_computed():
    text = "self.assertEquat(x, value)\n    return fooba"
    assert identifier_words(text) == ["self", "assertEquat", "value", "return", "fooba"]
    # the word touching the end may be cut by the token budget: not counted
    assert identifier_words(text, drop_last_partial=True) == ["self", "assertEquat", "value", "return"]
    known = known_words(["def f(self, value):\n    return self.assertEqual(value)\n"])
    assert known == {"self", "value", "return", "assertEqual"}
    assert oov_word_rate(text, known) == 1 / 4                         # only "assertEquat" is unseen
    assert oov_word_rate(text + " ", known) == 2 / 5                   # "fooba" now complete, and unseen
    assert math.isnan(oov_word_rate("x = 1\n", known))                 # no identifier of ≥ 4 characters
    assert identifier_words("_ab1 abc a2345", min_len=4) == ["_ab1", "a2345"]


def _prompts(n=3):
    """Prompts ending at a line boundary, as the harness makes them; real continuation 16 bytes."""
    lines = ["def function(value):\n", "    return value + 1\n"]
    out = []
    for i in range(n):
        text = "".join(lines * (i + 2))
        ids = [int(x) for x in encode_bytes(text)]
        out.append(Prompt(i, f"f{i}.py", "cat", tuple(ids[:len(ids) - 21]), tuple(ids[len(ids) - 21:][:16])))
    return out


def test_sample_runs_sit_next_to_greedy(micro_model, tokenizer):
    cfg = EvalConfig(block_lengths=[8], thresholds=[0.9], modes=["free"], gen_len=16, sample_temperatures=[1.0, 0.5],
                     precision="fp32", progress_bar=False)
    runs = default_runs(cfg)
    assert runs[-2:] == [("free", "ar_sample", None, 1.0), ("free", "ar_sample", None, 0.5)]
    known = {"function", "value", "return"}
    df = evaluate_model(micro_model, tokenizer, _prompts(), cfg, known=known)
    samp = df[df["policy"] == "ar_sample"]
    assert sorted(samp["temperature"].unique()) == [0.5, 1.0] and samp["threshold"].isna().all()
    assert df[df["policy"] != "ar_sample"]["temperature"].isna().all()
    conf = df[df["policy"] == "confidence"]
    assert (conf["threshold"] == 0.9).all()
    # whitespace share of every generated token, against the byte texts
    for _, r in df.iterrows():
        assert r["ws_share"] == pytest.approx(sum(c in " \t\n\r\x0b\x0c" for c in r["text"]) / 16)
    real = df[df["policy"] == "ar_greedy"]
    assert (real["real_oov_word_rate"] == 0).all()                      # the real text uses only known words
    for _, r in df.iterrows():                                          # free-running: the text's own rate
        assert r["oov_word_rate"] == pytest.approx(oov_word_rate(r["text"], known), nan_ok=True)
    real_cfg = EvalConfig(block_lengths=[8], thresholds=[0.9], modes=["real"], gen_len=16, precision="fp32",
                          progress_bar=False)
    real_ctx = evaluate_model(micro_model, tokenizer, _prompts(), real_cfg, known=known)
    assert real_ctx["oov_word_rate"].isna().all()                       # blocks after real text: no words of their own
    s = summarize(df)
    rows = s[s["policy"] == "ar_sample"]
    assert len(rows) == 2 and set(rows["temperature"]) == {0.5, 1.0} and (rows["n_prompts"] == 3).all()
    assert s[s["policy"] != "ar_sample"]["temperature"].isna().all()
    with pytest.raises(ValueError, match="temperature"):
        EvalConfig(sample_temperatures=[0.0]).validate()


def _summary(greedy_rep, greedy_ws, diff_rep, diff_ws, real_rep=0.1, real_ws=0.25):
    base = dict(mode="free", real_repetition=real_rep, real_ws_share=real_ws, real_oov_word_rate=0.1,
                oov_word_rate=0.05, ws_share_multi=np.nan, temperature=np.nan, threshold=np.nan, block_length=0)
    return pd.DataFrame([
        {**base, "policy": "ar_greedy", "repetition": greedy_rep, "ws_share": greedy_ws},
        {**base, "policy": "confidence", "block_length": 16, "threshold": 0.9, "repetition": diff_rep,
         "ws_share": diff_ws, "ws_share_multi": 0.4},
        {**base, "policy": "ar_sample", "temperature": 1.0, "repetition": 0.11, "ws_share": 0.26},
    ])


def test_degeneration_verdict():
    k = TARGETS["free_running_ratio"]
    d = _degeneration(_summary(0.1 * k, 0.25 * k, 0.12, 0.3))
    assert d["met"] and d["met_by_policy"] == {"AR greedy": True, "diffusion B=16 τ=0.9": True}
    assert d["rows"]["AR sampling T=1"]["repetition"] == 0.11
    d = _degeneration(_summary(0.55, 0.3, 0.12, 0.3))                  # greedy loops
    assert not d["met"] and d["met_by_policy"]["AR greedy"] is False
    d = _degeneration(_summary(0.12, 0.3, 0.12, 0.25 * k + 0.01))      # diffusion commits mostly whitespace
    assert not d["met"] and d["met_by_policy"] == {"AR greedy": True, "diffusion B=16 τ=0.9": False}
    assert _degeneration(_summary(0.1, 0.2, 0.1, 0.2).assign(mode="real")) is None


def test_decode_cache_reuses_runs_across_calls(micro_model, tokenizer, monkeypatch):
    """A second evaluation sharing ``decode_cache`` decodes only the runs the first did not (the demo's
    sampler frontier after the main sweep), and its rows for the shared runs are the first call's; a policy
    given ``policy_kwargs`` is always decoded; other prompts are never served from the cache."""
    from workbench.evaluation import harness

    calls = []
    real_decode = harness.decode_prompts
    monkeypatch.setattr(harness, "decode_prompts", lambda m, policy, ps, mode, *a, **kw:
                        calls.append((mode, policy, kw["block_length"], kw.get("threshold"), len(ps)))
                        or real_decode(m, policy, ps, mode, *a, **kw))
    cfg = EvalConfig(block_lengths=[8], thresholds=[0.5, 0.9], modes=["real"], gen_len=16, precision="fp32",
                     batch_size=2, progress_bar=False)
    prompts, cache = _prompts(), {}
    first = evaluate_model(micro_model, tokenizer, prompts, cfg, decode_cache=cache)
    assert calls[0] == ("real", "ar_greedy", 8, None, 2)                # the untimed warm-up: one batch
    assert len(calls) == 1 + 4                                           # ar_greedy, serial, τ = 0.5, τ = 0.9
    calls.clear()
    runs = [("real", "ar_greedy", 8, None), ("real", "serial", 8, None), ("real", "confidence", 8, 0.9),
            ("real", "confidence", 8, 0.7)]
    second = evaluate_model(micro_model, tokenizer, prompts, cfg, runs=runs, decode_cache=cache,
                            policy_kwargs={"serial": {}})
    assert calls == [("real", "serial", 8, None, 3), ("real", "confidence", 8, 0.7, 3)]  # no warm-up: cached
    cols = ["policy", "threshold", "text", "tpf", "tokens_per_s", "agree_serial"]

    def reused(df):                                                     # ar_greedy and τ = 0.9: from the cache
        return df[(df["policy"] == "ar_greedy") | (df["threshold"] == 0.9)][cols].reset_index(drop=True)

    pd.testing.assert_frame_equal(reused(second), reused(first))       # decode time included
    serial = [df[df["policy"] == "serial"]["text"].tolist() for df in (first, second)]
    assert serial[0] == serial[1]                                       # decoded again, same output
    calls.clear()
    evaluate_model(micro_model, tokenizer, prompts[:2], cfg, runs=runs[:1], decode_cache=cache)
    assert [c[1] for c in calls] == ["ar_greedy", "ar_greedy"]         # other prompts: warm-up and decode


def test_sampled_batches_draw_independent_samples(micro_model):
    """Identical prompts decoded in different batches at T = 1 must not replay one random stream; greedy
    decoding of the same batches stays identical."""
    from workbench.evaluation.harness import decode_prompts

    ids = tuple(int(t) for t in encode_bytes("def f(x):\n    "))
    prompts = [Prompt(prompt_id=0, path="p", category="c", prompt=ids, real=tuple(range(32, 48)))] * 2
    sampled = decode_prompts(micro_model, "ar_sample", prompts, "free", 1, 0, temperature=1.0)
    assert sampled.tokens[0] != sampled.tokens[1]
    again = decode_prompts(micro_model, "ar_sample", prompts, "free", 1, 0, temperature=1.0)
    assert again.tokens == sampled.tokens                  # still reproducible from the seed
    greedy = decode_prompts(micro_model, "ar_greedy", prompts, "free", 1, 0)
    assert greedy.tokens[0] == greedy.tokens[1]


def test_evaluate_reports_introspective_acceptance(micro_model, tokenizer, small_corpus):
    """I-DLM §2 as an evaluate column: AR greedy and AR sampling draw from the causal distribution itself (α = 1
    up to the rounding between step and one-pass forwards); diffusion decoders record q and get α in (0, 1]."""
    from workbench.corpus import by_split, load_corpus
    from workbench.evaluation.prompts import make_prompts

    prompts = make_prompts(by_split(load_corpus(str(small_corpus)), "test"), 3, 32, 8)
    cfg = EvalConfig(n_prompts=3, gen_len=8, block_lengths=[4], thresholds=[0.9], sample_temperatures=[0.8],
                     precision="fp32", progress_bar=False)
    df = evaluate_model(micro_model, tokenizer, prompts, cfg)
    ar = df[df["policy"].str.startswith("ar_")]["introspective_acceptance"]
    assert ar.tolist() == pytest.approx([1.0] * len(ar), abs=1e-5)
    other = df[~df["policy"].str.startswith("ar_")]["introspective_acceptance"]
    assert other.notna().all() and ((other > 0) & (other <= 1)).all()


def test_prompts_per_file_are_distinct_cuts_and_prefix_stable():
    """Three 40-line files, 24 rounds: no (file, cut) repeats (the rounds used to draw a taken cut again: 18 of 72
    prompts were repeats), a file runs out of cuts instead, and the prompts for fewer prompts or rounds are the first
    ones of the larger plan (what `collect --extend` relies on)."""
    from workbench.corpus import Document
    from workbench.evaluation.prompts import make_prompts

    docs = [Document(f"p{i}/m.py", f"p{i}", "train", "".join(f"line_{i}_{j} = {j * j}\n" for j in range(40)))
            for i in range(3)]
    many = make_prompts(docs, 1000, 64, 32, per_file=24, min_prompt=16)
    keys = [(p.path, p.prompt, p.real) for p in many]
    assert len(set(keys)) == len(keys) and len(keys) > 3 * 8
    for n, rounds in ((5, 24), (len(many), 2), (10, 3)):
        fewer = make_prompts(docs, n, 64, 32, per_file=rounds, min_prompt=16)
        assert [(p.path, p.prompt) for p in fewer] == [(p.path, p.prompt) for p in many[:len(fewer)]]


def test_prompts_of_files_sharing_a_path_come_from_their_own_text():
    """A JSONL corpus's ids may repeat: each prompt's text (prompt, then its continuation) is a piece of its own
    document that starts the continuation at a line start (a per-path cache once served one document's text for
    both)."""
    from workbench.corpus import Document
    from workbench.evaluation.prompts import make_prompts

    docs = [Document("dup", "alpha", "test", "".join(f"alpha_{i} = {i}\n" for i in range(60))),
            Document("dup", "beta", "test", "".join(f"beta{i}()\n" for i in range(60)))]
    text_of = {d.category: d.text for d in docs}
    ps = make_prompts(docs, 8, 20, 8, None, min_prompt=8, per_file=4)
    assert {p.category for p in ps} == {"alpha", "beta"}
    for p in ps:
        prompt, real = bytes(p.prompt).decode(), bytes(p.real).decode()
        at = text_of[p.category].find(prompt + real)
        assert at >= 0 and text_of[p.category][at + len(prompt) - 1] == "\n", (p.category, prompt, real)
