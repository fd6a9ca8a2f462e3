"""The sampler decoding policy: threshold extremes, live features, registry."""
import numpy as np
import pytest
import torch

from workbench.decoding import get_policy
from workbench.decoding.sampler_policy import LoadedSampler
from workbench.sampler.network import SamplerNet, sampler_preset, save_sampler

PROMPTS = [list(range(10, 30)), list(range(40, 52))]


@pytest.fixture
def sampler(tmp_path):
    torch.manual_seed(0)
    cfg = sampler_preset("micro")
    d = save_sampler(SamplerNet(cfg).eval(), cfg, tmp_path / "s", {"feature_spec": {"feature_dim": cfg.feature_dim}})
    np.save(d / "token_pca.npy", np.random.default_rng(0).standard_normal((264, 44)).astype(np.float16))
    return LoadedSampler.load(d)


def test_threshold_zero_commits_everything(micro_model, sampler):
    r = get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.0, sampler=sampler)
    assert r.forwards == [2, 2] and all(c == [8, 8] for c in r.committed_per_step)


def test_threshold_above_one_commits_one_per_step(micro_model, sampler):
    r = get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=1.5, sampler=sampler)
    assert r.forwards == [16, 16] and all(c == [1] * 16 for c in r.committed_per_step)
    assert r.sampler_calls == 16 and r.sampler_seconds > 0


def test_sampler_policy_needs_a_sampler(micro_model):
    from workbench.decoding import DecodeError

    with pytest.raises(DecodeError, match="--sampler"):
        get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5)


def test_missing_token_pca_is_a_clear_error(tmp_path):
    cfg = sampler_preset("micro")
    d = save_sampler(SamplerNet(cfg), cfg, tmp_path / "s", {})
    with pytest.raises(FileNotFoundError, match="token_pca"):
        LoadedSampler.load(d)
