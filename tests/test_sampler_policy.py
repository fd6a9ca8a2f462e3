"""The sampler decoding policy: threshold extremes, live features, registry."""
import numpy as np
import pytest
import torch

from workbench.decoding import get_policy
from workbench.sampler.policy import LoadedSampler
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


def _with_meta(sampler, **meta):
    return LoadedSampler(sampler.net, sampler.token_pca, sampler.feature_dim, {**sampler.meta, **meta})


def test_sampler_trained_at_another_block_length_is_refused(micro_model, sampler):
    from workbench.decoding import DecodeError

    s = _with_meta(sampler, block_length=8)
    get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5, sampler=s)
    with pytest.raises(DecodeError, match="trained at block length 8, not 4"):
        get_policy("sampler")(micro_model, PROMPTS, 16, block_length=4, threshold=0.5, sampler=s)


def test_sampler_trained_on_another_model_is_refused(micro_model, sampler):
    from workbench.decoding import DecodeError
    from workbench.model.fingerprint import model_fingerprint

    same = _with_meta(sampler, model_fingerprint=model_fingerprint(micro_model))
    get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5, sampler=same)
    with pytest.raises(DecodeError, match="trajectories of model 0123456789abcdef"):
        get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5,
                              sampler=_with_meta(sampler, model_fingerprint="0123456789abcdef"))


def test_sampler_forward_stays_fp32_under_bf16_decoding(micro_model, sampler):
    """The sampler is trained in fp32; the decode's bf16 autocast must not reach its forward."""
    seen = []
    hook = sampler.net.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5, sampler=sampler,
                              precision="bf16")
    finally:
        hook.remove()
    assert seen and all(d == torch.float32 for d in seen)


def test_confidence_fallback_above_every_probability_is_the_serial_decode(micro_model, sampler):
    """NLD §3.2 labels a position correct when it matches the serial (k = 1) decode; with the default fallback a
    threshold no sampler probability reaches commits serial decoding's position each forward, token for token."""
    serial = get_policy("serial")(micro_model, PROMPTS, 16, block_length=8)
    r = get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=1.5, sampler=sampler)
    assert r.tokens == serial.tokens and r.forwards == serial.forwards
    # the control: the sampler's own top position leaves serial order, and here the tokens change with it
    own = get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=1.5, sampler=sampler,
                                fallback="sampler")
    assert own.tokens != serial.tokens


def test_sampler_fallback_commits_the_samplers_top_position(sampler):
    """``fallback="sampler"`` commits the sampler's own argmax; the default commits the model's most confident
    position. A stub network scores position 3 highest (all below τ), the model is most confident elsewhere."""
    from dataclasses import replace

    from workbench.sampler.policy import SamplerRule

    class Stub(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))        # the rule reads the device off a parameter

        def forward(self, feats):                                   # (N, B, F) -> (N, B) logits, all < 0
            return torch.tensor([-3.0, -3, -3, -1, -3, -3, -3, -3]).expand(feats.shape[0], 8)

    stub = replace(sampler, net=Stub())
    probs = torch.softmax(torch.randn(2, 8, 264, generator=torch.Generator().manual_seed(0)) * 4, dim=-1)
    masked = torch.ones(2, 8, dtype=torch.bool)
    model_top = probs.max(-1).values.argmax(1)
    assert (model_top != 3).all() and (model_top != 2).all()
    assert torch.equal(SamplerRule(stub, 0.9, "confidence")(probs, masked),
                       torch.nn.functional.one_hot(model_top, 8).bool())
    assert SamplerRule(stub, 0.9, "sampler")(probs, masked).nonzero()[:, 1].tolist() == [3, 3]
    # where a position passes τ, only the passing positions are committed, under either fallback
    stub.net.forward = lambda feats: torch.tensor([-3.0, -3, 3, -1, -3, -3, -3, -3]).expand(feats.shape[0], 8)
    for fallback in ("confidence", "sampler"):
        assert SamplerRule(stub, 0.9, fallback)(probs, masked).nonzero()[:, 1].tolist() == [2, 2]


def test_unknown_fallback_lists_the_valid_names(micro_model, sampler):
    from workbench.decoding import DecodeError

    with pytest.raises(DecodeError, match="valid: confidence, sampler"):
        get_policy("sampler")(micro_model, PROMPTS, 16, block_length=8, threshold=0.5, sampler=sampler, fallback="x")


def test_decode_cli_passes_threshold_and_fallback_to_the_sampler(micro_checkpoint, sampler, tmp_path, capsys):
    """`workbench decode --policy sampler` decoded at τ = 0.5 whatever --threshold said; it now passes τ and
    --sampler_fallback: τ = 1.5 is serial decoding, τ = 0 commits a block per forward, and an unknown fallback is a
    one-line error listing the valid names."""
    from workbench.cli import main

    def run(*args) -> list[str]:
        assert main(["decode", "--model", str(micro_checkpoint), "--gen_len", "16", "--block_length", "8",
                     "--sampler", str(tmp_path / "s"), *args]) == 0
        return capsys.readouterr().out.splitlines()

    serial = run("--policy", "serial")
    one = run("--policy", "sampler", "--threshold", "1.5")
    assert one[:-1] == serial[:-1] and " 16 forwards" in one[-1]
    assert " 2 forwards" in run("--policy", "sampler", "--threshold", "0")[-1]
    assert main(["decode", "--model", str(micro_checkpoint), "--gen_len", "16", "--block_length", "8", "--policy",
                 "sampler", "--sampler", str(tmp_path / "s"), "--sampler_fallback", "bogus"]) == 2
    assert "valid: confidence, sampler" in capsys.readouterr().err
