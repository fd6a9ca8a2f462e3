"""Every command on every released family's tiny checkpoint (issue 57 §4), in-process through ``workbench.cli.main``
(one import for all): collect → store verify → SOL → train sampler → sampler decoding → evaluate → sweep →
leaderboard, and for the families with an AR mode (NLD, I-DLM) speculate and train lora. Families without an AR mode run them without their AR rows (the leaderboard says why); the store
records the family's semantics, and a sampler trained on one family's store is refused on another's model.
DiffusionGemma, which has no mask token, runs them through its virtual mask (a fixed noise canvas)."""
import json

import pytest

from workbench.cli import main
from workbench.model.families.fixtures import write_family_checkpoint

FAMILIES = ["nld", "sdar", "llada", "dream", "fast_dllm_v2", "idlm", "diffusion_gemma"]
SMALL = ["--n_prompts", "2", "--prompt_len", "12", "--gen_len", "8", "--block_lengths", "[4]"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("pipeline")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_command_runs_on_the_family(root, family, capsys):
    ck = write_family_checkpoint(family, root / f"ck_{family}", block_size=4 if family in ("sdar", "fast_dllm_v2")
                                 else None)
    out = root / family
    steps = [
        ["collect", "--model", str(ck), "--out", f"{out}/store", "--n_prompts", "4", "--block_lengths", "[4]",
         "--blocks_per_prompt", "1", "--context_len", "24", "--batch_size", "4", "--progress_bar", "false"],
        ["store", "verify", "--store", f"{out}/store", "--model", str(ck)],
        ["sol", "--model", str(ck), *SMALL, "--budget", "10", "--out_dir", f"{out}/sol", "--progress_bar", "false",
         "--device", "cpu"],
        ["train", "sampler", "--store", f"{out}/store", "--block_length", "4", "--out_dir", f"{out}/sampler",
         "--max_steps", "2", "--preset", "micro", "--progress_bar", "false", "--accelerator", "cpu",
         "--val_fraction", "0.25"],
        ["decode", "--model", str(ck), "--policy", "sampler", "--sampler", f"{out}/sampler/sampler", "--gen_len", "8",
         "--block_length", "4"],
        ["evaluate", "--model", str(ck), *SMALL, "--thresholds", "[0.5]", "--out_dir", f"{out}/eval",
         "--progress_bar", "false", "--device", "cpu"],
        ["sweep", "--model", str(ck), "--n_trials", "2", *SMALL, "--out_dir", f"{out}/sweep"],
        ["leaderboard", "--model", str(ck), *SMALL, "--thresholds", "[0.5]", "--out_dir", f"{out}/lb",
         "--progress_bar", "false", "--device", "cpu", "--sol", "false"],
    ]
    if family in ("nld", "idlm"):                                   # the AR families: self-speculation, LoRA drafter
        steps += [
            ["speculate", "--model", str(ck), *SMALL[:-2], "--draft_lengths", "[4]", "--quadratic_draft_lengths", "[2]",
             "--block_length", "4", "--out_dir", f"{out}/spec", "--progress_bar", "false", "--device", "cpu"],
            ["train", "lora", "--init_from", str(ck), "--out_dir", f"{out}/lora", "--max_steps", "2", "--batch_size",
             "2", "--draft_length", "4", "--rank", "2", "--progress_bar", "false", "--accelerator", "cpu",
             "--val_every", "2", "--val_windows", "2"],
        ]
    for argv in steps:
        assert main(argv) == 0, f"{family}: workbench {' '.join(argv[:2])} failed: {capsys.readouterr().err[-500:]}"
    attrs = json.loads((out / "store" / "zarr.json").read_text())["attributes"]
    assert attrs["model_family"]["family"] == family and attrs["model_family"]["block_size"] in (None, 4, 8, 32)
    import pandas as pd

    lb = pd.read_parquet(out / "lb" / "leaderboard.parquet")
    ran = set(lb.loc[lb["status"] == "ok", "decoder"])
    assert {"serial", "confidence"} <= ran
    own = {"llada": "llada", "dream": "dream_maskgit_plus", "sdar": "sdar", "fast_dllm_v2": "fast_dllm_v2",
           "nld": "nld_ar_seeded", "idlm": None, "diffusion_gemma": "diffusion_gemma"}[family]
    assert own is None or own in ran                                 # the family's own decoder is on its board
    if family in ("llada", "dream"):                                 # the prefix cache: its own row, vs the exact
        approx = lb[(lb["decoder"] == "confidence_prefix_cache") & (lb["status"] == "ok")]
        assert len(approx) and approx["agree_exact"].between(0, 1).all()
        assert lb.loc[lb["decoder"] == "confidence", "agree_exact"].isna().all()
    if family in ("nld", "idlm"):
        assert {"ar_greedy", "isd"} <= ran
    else:
        why = lb.loc[lb["decoder"] == "ar_greedy", "status"].iloc[0]
        assert why.startswith(f"not run: decoder ar_greedy needs the ar mode, which the {family} family does not have")


def test_a_sampler_of_another_familys_store_is_refused(root, capsys):
    for family in ("sdar", "llada"):
        if not (root / family / "sampler" / "sampler").is_dir():
            pytest.skip("needs the pipeline test's samplers (run the module)")
    rc = main(["decode", "--model", str(root / "ck_llada"), "--policy", "sampler", "--sampler",
               str(root / "sdar" / "sampler" / "sampler"), "--gen_len", "8", "--block_length", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "train a sampler on a store collected from this model" in err[0]
