"""Speculation metrics (hand-computed), the ss_linear / ss_quadratic registry entries, the evaluation
layer and the ``workbench speculate`` command."""
import json
import math

import pandas as pd
import pytest

from conftest import run_cli
from workbench.decoding import get_policy
from workbench.decoding.base import DecodeResult
from workbench.evaluation.prompts import Prompt
from workbench.speculative.evaluate import Method, default_methods, evaluate_speculation, summarize_speculation
from workbench.speculative.linear import linear_self_speculation
from workbench.speculative.metrics import (acceptance_length, cycles_accepting, max_accepted, pooled_metrics,
                                           real_tpf, row_metrics, share_accepting, tpf)


def _result():
    # row 0: 4 cycles emitting 3, 1, 9, 2 (= 15 tokens); row 1: 2 cycles emitting 1, 4 (= 5 tokens)
    return DecodeResult(tokens=[[0] * 15, [0] * 5], forwards=[4, 2], extra_forwards=[4, 2],
                        committed_per_step=[[3, 1, 9, 2], [1, 4]])


def test_metrics_hand_computed():
    e = [3, 1, 9, 2]
    assert acceptance_length(e) == 15 / 4
    assert max_accepted(e) == 8
    assert cycles_accepting(e, 8) == 1 and share_accepting(e, 8) == 0.25
    assert cycles_accepting(e, 2) == 2 and share_accepting(e, 9) == 0.0
    assert tpf(15, 4) == 3.75 and real_tpf(15, 4, 4) == 1.875
    assert math.isnan(acceptance_length([])) and max_accepted([]) == 0 and math.isnan(tpf(3, 0))
    r = row_metrics(_result(), 1)
    assert r == {"tokens": 5, "cycles": 2, "tau": 2.5, "max_accepted": 3, "cycles_accept_ge8": 0,
                 "share_accept_ge8": 0.0, "tpf": 2.5, "tpf_real": 1.25}
    pooled = pooled_metrics(_result())
    assert pooled["tau"] == 20 / 6 and pooled["max_accepted"] == 8 and pooled["share_accept_ge8"] == 1 / 6
    assert pooled["tpf"] == 20 / 6 and pooled["tpf_real"] == 20 / 12


def test_registry_maps_block_length_to_draft_length(micro_model):
    prompts = [[5, 6, 7, 8], [9, 10]]
    direct = linear_self_speculation(micro_model, prompts, 12, draft_length=4, pad_id=258)
    via = get_policy("ss_linear")(micro_model, prompts, 12, block_length=4, threshold=0.9, pad_id=258)
    assert via.tokens == direct.tokens and via.committed_per_step == direct.committed_per_step
    explicit = get_policy("ss_quadratic")(micro_model, prompts, 12, block_length=4, draft_length=2, pad_id=258,
                                          precision="fp32")
    assert explicit.tokens == direct.tokens and explicit.forwards != direct.forwards


def test_evaluate_speculation_rows_and_summary(micro_model, tokenizer):
    prompts = [Prompt(i, f"pkg{i % 2}/f{i}.py", f"pkg{i % 2}", tuple(range(40 + i, 60 + i)), tuple(range(70, 86)))
               for i in range(3)]
    methods = default_methods([2], [2], [1.0, 0.5]) + [Method("serial8", "serial", {"block_length": 8})]
    df = evaluate_speculation(micro_model, tokenizer, prompts, methods, ("real", "free"), block_length=8, batch_size=2)
    assert len(df) == 2 * 5 * 3
    ss = df[df["policy"].isin(["ss_linear"]) | (df["method"] == "quadratic_k2")]
    assert (ss["agree_ar"] == 1.0).all() and (ss["tokens"] == 16).all()          # greedy, λ = 1: lossless
    assert (df["tpf_real"] == df["tokens"] / (df["forwards"] + df["extra_forwards"])).all()
    assert (df.loc[df["method"] == "ar_greedy", "tau"] == 1.0).all()
    s = summarize_speculation(df)
    assert set(s["category"]) == {"all", "pkg0", "pkg1"}
    lin = df[(df["method"] == "linear_k2") & (df["mode"] == "free")]
    row = s[(s["method"] == "linear_k2") & (s["mode"] == "free") & (s["category"] == "all")].iloc[0]
    assert row["tau"] == pytest.approx(lin["tokens"].sum() / lin["cycles"].sum())
    assert row["n_prompts"] == 3
    ar = s[(s["method"] == "ar_greedy") & (s["category"] == "all")]
    assert (ar["speedup_vs_ar"] == 1.0).all()


def test_speculate_cli_writes_run_dir(cli, tmp_path, micro_checkpoint, small_corpus):
    out = tmp_path / "run"
    p = cli("speculate", "--model", str(micro_checkpoint), "--corpus", str(small_corpus), "--n_prompts", "2",
            "--prompt_len", "32", "--gen_len", "16", "--draft_lengths", "[2]", "--quadratic_draft_lengths", "[2]",
            "--block_length", "8", "--device", "cpu", "--out_dir", str(out), "--progress_bar", "false")
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == [".workbench-run", "config.json", "results.parquet", "run.json",
                                                     "summary.json", "summary.parquet"]
    df = pd.read_parquet(out / "results.parquet")
    assert set(df["method"]) == {"ar_greedy", "linear_k2", "quadratic_k2"} and set(df["mode"]) == {"real", "free"}
    assert json.loads((out / "config.json").read_text())["draft_lengths"] == [2]
    assert not (tmp_path / "run.partial").exists()


def test_speculate_cli_bad_adapter_is_one_line_error(cli, tmp_path, micro_checkpoint, small_corpus):
    out = tmp_path / "run"
    p = cli("speculate", "--model", str(micro_checkpoint), "--adapter", str(tmp_path / "nope"), "--corpus",
            str(small_corpus), "--device", "cpu", "--out_dir", str(out))
    assert p.returncode == 2
    lines = [l for l in p.stderr.strip().splitlines() if "error" in l]
    assert len(lines) == 1 and "adapter_config.json" in lines[0], p.stderr
    assert not out.exists() and not (tmp_path / "run.partial").exists()
