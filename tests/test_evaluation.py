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
