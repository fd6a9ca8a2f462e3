"""A command given a trained sampler decodes at the sampler's own block length unless told otherwise, and refuses a
block length the sampler was not trained at in one line (decode, sweep, leaderboard)."""
import json
import shutil

import pytest

from workbench.assets import ASSETS
from workbench.leaderboard.config import LeaderboardConfig
from workbench.sampler.block import trained_block_length
from workbench.sampler.network import SamplerError
from workbench.tune.sweep import SweepConfig

SAMPLER = str(ASSETS / "tiny-sampler")


@pytest.fixture
def sampler_b4(tmp_path):
    """A copy of tiny's sampler whose ``sampler.json`` says it was trained at B = 4."""
    out = tmp_path / "sampler"
    shutil.copytree(SAMPLER, out)
    meta = json.loads((out / "sampler.json").read_text())
    meta["block_length"] = 4
    (out / "sampler.json").write_text(json.dumps(meta))
    return str(out)


def test_the_trained_block_length_is_read_from_sampler_json(sampler_b4, tmp_path):
    assert trained_block_length(SAMPLER) == json.loads((ASSETS / "tiny-sampler" / "sampler.json").read_text())[
        "block_length"] == 8
    assert trained_block_length(sampler_b4) == 4
    assert trained_block_length(tmp_path / "nothing") is None and trained_block_length(None) is None


def test_sweep_defaults_to_the_samplers_block_length_and_refuses_another(sampler_b4):
    assert SweepConfig(policy="sampler", sampler=sampler_b4).block_lengths == [4]
    assert SweepConfig(policy="confidence", sampler=sampler_b4).block_lengths == [32]     # the sampler is not used
    assert SweepConfig().block_lengths == [32]
    SweepConfig(policy="sampler", sampler=sampler_b4, block_lengths=[4]).validate()
    for conflict in ([32], [4, 8]):               # every trial of a sampler sweep decodes with the sampler
        with pytest.raises(SamplerError, match=r"conflicts with --sampler .*trained at block length 4.*\[4\]"):
            SweepConfig(policy="sampler", sampler=sampler_b4, block_lengths=conflict, gen_len=64).validate()


def test_leaderboard_defaults_to_the_samplers_block_length_and_refuses_a_list_without_it(sampler_b4):
    assert LeaderboardConfig(sampler=sampler_b4).block_lengths == [4]
    assert LeaderboardConfig(sampler=sampler_b4, decoders=["confidence"]).block_lengths == [4, 8, 16, 32]
    assert LeaderboardConfig().block_lengths == [4, 8, 16, 32]
    LeaderboardConfig(sampler=sampler_b4, block_lengths=[4, 8]).validate()   # the other decoders also run at 8
    with pytest.raises(SamplerError, match="trained at block length 4"):
        LeaderboardConfig(sampler=sampler_b4, block_lengths=[8, 16]).validate()
    LeaderboardConfig(sampler=sampler_b4, block_lengths=[8, 16], decoders=["confidence"]).validate()


def test_the_commands_refuse_a_conflicting_block_length_in_one_line(cli, sampler_b4, tmp_path):
    for argv in (["sweep", "--policy", "sampler", "--sampler", sampler_b4, "--block_lengths", "[8]",
                  "--out_dir", str(tmp_path / "sweep")],
                 ["leaderboard", "--sampler", sampler_b4, "--block_lengths", "[8]", "--out_dir", str(tmp_path / "lb")],
                 ["decode", "--policy", "sampler", "--sampler", sampler_b4, "--block_length", "8", "--gen_len", "8"]):
        r = cli(*argv)
        assert r.returncode == 2 and r.stdout == "", (argv, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "trained at block length 4" in r.stderr, r.stderr
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "lb").exists()


def test_decode_decodes_at_the_samplers_block_length(cli):
    """tiny's trained block is 16 and its shipped sampler's 8: the sampler policy decodes at 8 (the policy itself
    refuses any other B), without --block_length."""
    from workbench.model.load import load_model

    assert getattr(load_model("tiny")[0], "block_size", None) != 8
    r = cli("decode", "--policy", "sampler", "--sampler", SAMPLER, "--gen_len", "16")
    assert r.returncode == 0, r.stderr
    assert "--- sampler: 16 tokens" in r.stdout
