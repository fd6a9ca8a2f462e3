"""``workbench leaderboard``: every registered decoder against the SOL ceilings on one prompt set."""
import pandas as pd
import pytest

from conftest import run_cli
from workbench.decoding import DecodeError
from workbench.decoding.registry import DECODERS, DecoderSpec, register_decoder
from workbench.leaderboard import LeaderboardConfig
from workbench.leaderboard.run import run_leaderboard


def _cfg(ckpt, corpus, out, **kw):
    base = dict(model=str(ckpt), corpus=str(corpus), n_prompts=3, prompt_len=48, gen_len=16, block_lengths=[4, 8],
                thresholds=[0.9], precision="fp32", batch_size=4, out_dir=str(out), progress_bar=False,
                skip_missing=True, sol_budget=200)
    return LeaderboardConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def board(micro_checkpoint, small_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("lb") / "board"
    df, path = run_leaderboard(_cfg(micro_checkpoint, small_corpus, out))
    return df, path


def test_table_files_and_rows(board):
    df, out = board
    for f in ("leaderboard.parquet", "leaderboard.md", "leaderboard.png", "ceilings.parquet", "config.json"):
        assert (out / f).is_file(), f
    assert not (out.parent / "board.partial").exists()
    ok = df[df["status"] == "ok"]
    assert set(ok["mode"]) == {"real", "free"}
    assert {"ar_greedy", "ar_sample", "confidence", "serial", "ss_linear", "ss_quadratic"} <= set(ok["decoder"])
    # every decoder that claims to be lossless is lossless in fp32
    claims = ok[ok["claims_lossless"]]
    assert len(claims) and claims["lossless"].all(), claims[["decoder", "mode", "block_length", "agree_ar"]]
    # AR is the unit of both TPFs; no row beats B (B + 1 for a cycle with its bonus token)
    ar = ok[ok["decoder"] == "ar_greedy"]
    assert (ar["tpf"] == 1.0).all() and (ar["cost_tpf"] == 1.0).all() and (ar["speedup"] == 1.0).all()
    diff = ok[ok["family"] == "diffusion"]
    assert (diff["tpf"] <= diff["block_length"] + 1e-9).all()
    spec = ok[ok["family"] == "speculative"]
    assert (spec["tpf"] <= spec["block_length"] + 1 + 1e-9).all() and spec["tau"].notna().all()
    # missing artefacts are rows that say how to make them
    missing = df[df["status"].str.startswith("missing")]
    assert set(missing["decoder"]) == {"sampler", "deer", "simsd", "diffuspec", "diffuspec_cps"}
    assert missing["status"].str.contains("workbench train|workbench diffuspec proxy").all()


def test_ceilings_on_the_same_prompts(board):
    df, out = board
    c = pd.read_parquet(out / "ceilings.parquet")
    assert set(c["ceiling"]) == {"serial", "ar_greedy"} and set(c["block_length"]) == {4, 8}
    assert (c["greedy"] <= c["sol"] + 1e-9).all() and (c["sol"] <= c["block_length"]).all()
    free = df[(df["status"] == "ok") & (df["mode"] == "free") & df["ceiling"].notna()]
    assert set(free["ceiling"]) == {"serial", "ar_greedy"}
    assert (free["distance"] == free["tpf"] / free["ceiling_tpf"]).all()
    # the serial decoder reproduces the serial target: its ceiling is at least its own tpf of 1
    assert (free[free["decoder"] == "serial"]["distance"] <= 1.0 + 1e-9).all()


def test_a_decoder_registered_later_appears_without_an_edit(micro_checkpoint, small_corpus, tmp_path):
    def twice(model, prompts, gen_len, **kw):
        return DECODERS["ar_greedy"].decode(model, prompts, gen_len, **kw)

    register_decoder(DecoderSpec("test_ar_copy", twice, family="ar", lossless=True))
    try:
        df, _ = run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "b", decoders=["ar_greedy", "test_ar_copy"],
                                     modes=["free"], sol=False))
    finally:
        del DECODERS["test_ar_copy"]
    row = df[df["decoder"] == "test_ar_copy"].iloc[0]
    assert row["status"] == "ok" and row["lossless"]


def test_bad_input(cli, micro_checkpoint, small_corpus, tmp_path):
    with pytest.raises(DecodeError, match="valid: .*ar_greedy"):
        run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "x", decoders=["nope"]))
    with pytest.raises(ValueError, match="workbench train sampler"):
        run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "y", decoders=["sampler"], skip_missing=False))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    r = cli("leaderboard", "--model", str(micro_checkpoint), "--decoders", "[nope]", "--out_dir", str(tmp_path / "z"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "valid:" in r.stderr
    assert not (tmp_path / "z").exists()


def test_interrupted_run_leaves_nothing(micro_checkpoint, small_corpus, tmp_path, monkeypatch):
    import workbench.leaderboard.run as lb

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(lb, "leaderboard_markdown", boom, raising=False)
    monkeypatch.setattr("workbench.leaderboard.report.leaderboard_markdown", boom)
    with pytest.raises(KeyboardInterrupt):
        run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "out", decoders=["ar_greedy"], sol=False))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_introspective_acceptance(board):
    """I-DLM §2: AR decoders draw from the causal distribution itself, so α = 1 (up to float rounding between the
    step forward and the one-pass introspection forward); every other decoder that records q gets a value in (0, 1]."""
    df, _ = board
    ok = df[df["status"] == "ok"]
    ar = ok[ok["family"] == "ar"]
    assert ar["introspective_acceptance"].tolist() == pytest.approx([1.0] * len(ar), abs=1e-5)
    rest = ok[ok["family"] != "ar"]["introspective_acceptance"]
    assert rest.notna().all() and ((rest > 0) & (rest <= 1.0)).all()


def test_introspective_acceptance_hand_value():
    import math

    from workbench.evaluation.metrics import introspective_acceptance

    q = [[0.5, 0.25], [1.0]]
    logp = [[math.log(0.25), math.log(0.5)], [math.log(0.2)]]
    # min(1, .25/.5) = .5, min(1, .5/.25) = 1, min(1, .2/1) = .2 -> mean 1.7 / 3
    assert introspective_acceptance(q, logp) == pytest.approx(1.7 / 3)


def test_a_separate_drafters_forwards_count_in_tpf_real_and_cost():
    """SimSD's drafter forwards (``DecodeResult.drafter_forwards``) are forwards of a model: ``tpf_real`` counts
    them, and ``cost_tpf`` charges each B tokens at the drafter's share of the target's parameters."""
    from workbench.decoding.base import DecodeResult
    from workbench.decoding.registry import get_decoder, load_decoders
    from workbench.leaderboard.columns import row_columns

    load_decoders()
    spec = get_decoder("simsd")
    # 8 tokens, B = 4: 3 target forwards (verify + finishing), 2 KV commits, 8 drafter forwards
    res = DecodeResult(tokens=[[1, 2, 3, 4, 5, 6, 7, 8]], forwards=[3], extra_forwards=[2],
                       committed_per_step=[[4, 1, 3]], step_tokens=[[[1, 2, 3, 4], [5], [6, 7, 8]]],
                       drafter_forwards=[8])
    cols = row_columns(spec, 4, res, None, None, set(), drafter_ratio=0.25)
    assert cols["tpf"] == 8 / 3
    assert cols["tpf_real"] == 8 / (3 + 2 + 8)
    assert cols["cost_tpf"] == pytest.approx(8 / (3 * 8 + 2 * 4 + 8 * 0.25 * 4))
    res.drafter_forwards = []                                # none recorded: the columns without a drafter
    assert row_columns(spec, 4, res, None, None, set(), drafter_ratio=0.25)["tpf_real"] == 8 / 5


def test_shipped_artefacts_of_a_model(tmp_path, monkeypatch):
    """An artefact shipped for a model (``assets/<model>-sampler``, ``-deer-drafter``) is found by the model's
    name; it is not itself listed as a model; an unknown kind names the valid ones."""
    import workbench.assets as assets

    for d in ("m", "m-sampler", "m-deer-drafter"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text("{}")
    monkeypatch.setattr(assets, "ASSETS", tmp_path)
    assert assets.shipped_models() == ["m"]
    assert assets.shipped_artefact("builtin:m", "sampler") == tmp_path / "m-sampler"
    assert assets.shipped_artefact("m", "drafter") == tmp_path / "m-deer-drafter"
    assert assets.shipped_artefact("other", "sampler") is None
    assert assets.shipped_artefact("runs/x/model", "sampler") is None
    with pytest.raises(ValueError, match="valid: sampler, drafter"):
        assets.shipped_artefact("m", "adapter")


def test_tiny_leaderboard_runs_its_shipped_sampler_and_drafter(small_corpus, tmp_path):
    """With defaults, the shipped model's own sampler and DEER drafter give rows (no --sampler / --drafter)."""
    from workbench.assets import shipped_artefact

    if shipped_artefact("tiny", "sampler") is None or shipped_artefact("tiny", "drafter") is None:
        pytest.fail("workbench/assets/tiny-sampler and tiny-deer-drafter must ship with the package")
    df, _ = run_leaderboard(_cfg("builtin:tiny", small_corpus, tmp_path / "b", decoders=["sampler", "deer"],
                                 skip_missing=False, modes=["free"], block_lengths=[8], n_prompts=2, sol=False))
    assert set(df["decoder"]) == {"ar_greedy", "serial", "sampler", "deer"} and (df["status"] == "ok").all()
    df = df[df["decoder"].isin(["sampler", "deer"])]
    assert (df["tpf"] >= 1.0).all() and df[df["decoder"] == "deer"]["lossless"].all()


def test_reuses_the_sweeps_decodes(micro_checkpoint, small_corpus, tmp_path, monkeypatch):
    """The demo's leaderboard shares ``decode_cache`` with its sweep: a run the sweep decoded on the same prompts,
    precision and batch size is not decoded again (nor warmed up), and its row equals a run without the cache."""
    import torch

    import workbench.leaderboard.run as lb
    from workbench.corpus import by_split, load_corpus
    from workbench.evaluation.harness import EvalConfig, evaluate_model
    from workbench.evaluation.prompts import make_prompts
    from workbench.model.load import load_model

    model, tok, _ = load_model(str(micro_checkpoint), torch.device("cpu"), False)
    prompts = make_prompts(by_split(load_corpus(str(small_corpus)), "test"), 3, 48, 16, tok)
    cache: dict = {}
    evaluate_model(model, tok, prompts, EvalConfig(block_lengths=[8], thresholds=[0.9], gen_len=16, precision="fp32",
                                                   batch_size=4, sample_temperatures=[1.0], progress_bar=False),
                   decode_cache=cache)
    calls = []
    real = lb.decode_prompts
    monkeypatch.setattr(lb, "decode_prompts", lambda m, policy, ps, mode, *a, **k:
                        calls.append((policy, mode)) or real(m, policy, ps, mode, *a, **k))
    kw = dict(decoders=["ar_greedy", "serial", "confidence", "ss_linear", "ar_sample"], block_lengths=[8], sol=False)
    shared, _ = run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "a", **kw), model, tok, cache)
    # the sweep's runs (its free-running ar_sample at T = 1 included) are served from the cache
    assert sorted(calls) == [("ar_sample", "real"), ("ss_linear", "free"), ("ss_linear", "real")]
    calls.clear()
    alone, _ = run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "b", **kw), model, tok)
    assert len(calls) == 1 + 10                                         # warm-up + every row
    cols = ["decoder", "mode", "tpf", "agree_ar", "agree_serial", "lossless", "repetition"]
    pd.testing.assert_frame_equal(shared[cols], alone[cols])
    shorter = make_prompts(by_split(load_corpus(str(small_corpus)), "test"), 3, 40, 16, tok)
    assert [(p.prompt_id, len(p.real)) for p in shorter] == [(p.prompt_id, len(p.real)) for p in prompts] \
        and shorter != prompts                      # what the key held before: the same, for other tokens
    for i, other in enumerate([{"n_prompts": 2}, {"prompt_len": 40}]):  # other prompts: nothing reused, also
        calls.clear()                                                   # with the same ids and lengths
        run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / f"c{i}", **kw, **other), model, tok, cache)
        assert len(calls) == 1 + 10
    calls.clear()                                   # a top-k filter is another sampling setting: decoded afresh
    run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "d", **kw, top_k=5), model, tok, cache)
    assert sorted(c for c in calls if c[0] == "ar_sample") == [("ar_sample", "free"), ("ar_sample", "real")]


def test_real_context_rows_for_named_decoders(micro_checkpoint, small_corpus, tmp_path):
    """``real_context_decoders``: only the named decoders (and the references) get real-context rows; an unknown
    name is refused in one line listing the valid ones."""
    df, _ = run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "a", block_lengths=[8], sol=False,
                                 decoders=["confidence", "ss_linear", "ss_quadratic"],
                                 real_context_decoders=["ss_linear"]))
    real = df[(df["status"] == "ok") & (df["mode"] == "real")]
    free = df[(df["status"] == "ok") & (df["mode"] == "free")]
    assert set(real["decoder"]) == {"ar_greedy", "serial", "ss_linear"}
    assert set(free["decoder"]) == {"ar_greedy", "serial", "confidence", "ss_linear", "ss_quadratic"}
    with pytest.raises(DecodeError, match="valid: .*ar_greedy"):
        run_leaderboard(_cfg(micro_checkpoint, small_corpus, tmp_path / "x", real_context_decoders=["nope"]))
    assert not (tmp_path / "x").exists()
