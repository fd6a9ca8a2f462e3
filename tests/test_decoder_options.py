"""Every registered decoder says what it reproduces and which options it takes, and refuses any other option in one
line instead of dropping it (``DecoderSpec.reference``, ``DecoderSpec.options``, ``get_policy``)."""
import re

import pytest

from workbench.decoding import DecodeError, get_policy
from workbench.decoding.registry import load_decoders

DECODERS = load_decoders()
FAMILY_DECODERS = sorted(n for n, s in DECODERS.items() if s.reference_of)


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_every_decoder_names_its_source_and_its_options(name):
    spec = DECODERS[name]
    assert spec.accepted_options() is not None, f"{name} swallows unlisted options through **kwargs"
    assert spec.reference.startswith("own:") or re.search(r"arXiv:\d{4}\.\d{4,5}|\.py", spec.reference), name
    if spec.reference_of:                          # a family's own decoder: the upstream file and its function
        assert re.search(r"[\w/.-]+\.py: [\w.]+", spec.reference), spec.reference


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_an_unknown_option_is_refused_in_one_line(name):
    with pytest.raises(DecodeError, match=rf"decoder {name} has no option not_an_option; its options: "):
        get_policy(name)(object(), [[1, 2]], 4, not_an_option=1)


@pytest.mark.parametrize("name,option", [
    ("llada", "logits_eos_inf"), ("llada", "confidence_eos_eot_inf"), ("llada", "threshold"),
    ("dream_maskgit_plus", "threshold"), ("sdar", "temperature"), ("sdar", "top_k"), ("fast_dllm_v2", "top_p"),
    ("fast_dllm_v2", "temperature"), ("nld_ar_seeded", "temperature"), ("confidence_prefix_cache", "temperature"),
    ("confidence_prefix_cache", "remasking")])
def test_upstream_options_that_are_not_reproduced_are_refused(name, option):
    """An upstream option the decoder does not reproduce is refused, never ignored."""
    with pytest.raises(DecodeError, match=f"has no option {option}"):
        get_policy(name)(object(), [[1, 2]], 4, **{option: 1})


def test_family_decoders_take_their_upstream_options():
    takes = {"llada": {"cfg_scale", "remasking", "temperature", "seed", "steps", "block_length"},
             "dream_origin": {"temperature", "top_p", "top_k", "alg_temp", "eps", "steps", "seed"},
             "sdar": {"steps", "threshold"}, "fast_dllm_v2": {"sub_block", "threshold"},
             "nld_ar_seeded": {"threshold", "steps", "block_length"}, "diffusion_gemma": {"max_denoising_steps"}}
    for name, options in takes.items():
        assert options <= DECODERS[name].accepted_options(), name
    assert all(DECODERS[n].own_eos_rule for n in FAMILY_DECODERS)


def test_the_decode_cli_refuses_an_option_in_one_line(cli):
    """``workbench decode --policy dream_maskgit_plus --block_length 4``: Dream decodes its canvas as one block."""
    res = cli("decode", "--model", "builtin:tiny", "--policy", "dream_maskgit_plus", "--block_length", "4",
              "--gen_len", "8")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "drop --block_length" in res.stderr


def test_the_decode_cli_passes_decoder_options(cli, tmp_path):
    """``--decoder_options`` reaches the decoder (LLaDA's CFG and random remasking change its output, seeded), and an
    option the decoder does not have is refused in one line naming its options."""
    from workbench.model.families.fixtures import write_family_checkpoint

    ck = write_family_checkpoint("llada", tmp_path / "llada")
    base = ["decode", "--model", str(ck), "--policy", "llada", "--block_length", "8", "--gen_len", "8",
            "--prompt", "def f(x):"]
    plain = cli(*base)
    cfg = cli(*base, "--decoder_options", "{cfg_scale: 2.0, remasking: random, seed: 3}")
    assert plain.returncode == 0 and cfg.returncode == 0, cfg.stderr
    text = lambda p: p.stdout.split("--- llada")[0]                           # noqa: E731 (without the timings)
    assert "8 forwards" in cfg.stdout and text(plain) != text(cfg)
    again = cli(*base, "--decoder_options", "{cfg_scale: 2.0, remasking: random, seed: 3}")
    assert text(again) == text(cfg)                                            # seeded: the same tokens
    bad = cli(*base, "--decoder_options", "{alg_temp: 0.1}")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "has no option alg_temp; its options:" in lines[0], bad.stderr
