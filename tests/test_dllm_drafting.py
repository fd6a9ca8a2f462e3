"""The drafting papers' own settings with released diffusion LMs (issue 57 §4): DiffuSpec drafts with a released
dLLM for an AR target of the same tokenizer (its paper: Dream-7B for Qwen2.5), losslessly at temperature 0; a
drafter of another tokenizer is refused in one line."""
import pytest

from conftest import bpe_tokenizer
from small_models import ar_target_checkpoint
from workbench.decoding import get_policy
from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
from workbench.diffuspec.evaluate import load_drafter
from workbench.model.families.fixtures import fixture_tokenizer, write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.load import AdapterMismatchError

PROMPTS = [[72, 101, 108, 108, 111, 32, 119], [100, 101, 102, 32, 102]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafting")
    dream = write_family_checkpoint("dream", root / "dream")
    target = ar_target_checkpoint(root / "target", fixture_tokenizer("<|mask|>"), 264)
    other = ar_target_checkpoint(root / "other", bpe_tokenizer(), 320)
    return dream, target, other


def test_diffuspec_drafts_with_a_released_dllm_losslessly(folders):
    dream, target_dir, _ = folders
    target, tok, _ = load_checkpoint(target_dir)
    drafter, kind, sep = load_drafter(str(dream), target, tok)
    assert kind == "trimode" and drafter.family.name == "dream" and drafter is not target
    res = diffuspec_decode(target, drafter, PROMPTS, 12, DiffuSpecConfig(cps=False, adl=False, k_fixed=4),
                           drafter_kind=kind, sep_id=sep)
    ar = get_policy("ar_greedy")(target, PROMPTS, 12, pad_id=256)
    assert res.tokens == ar.tokens                                    # lossless: greedy verification
    assert res.forwards[0] > 0                                        # the drafter drafted


def test_a_drafter_of_another_tokenizer_is_refused(folders):
    dream, _, other_dir = folders
    target, tok, _ = load_checkpoint(other_dir)
    with pytest.raises(AdapterMismatchError, match=r"does not speak the target's tokenizer \(token .+ is id \d+ in "
                                                   r"the target but .+ in the drafter\)"):
        load_drafter(str(dream), target, tok)


def test_simsd_refuses_a_target_whose_forward_its_layout_does_not_reproduce(tmp_path):
    """SimSD's paired verification layout reproduces NLD's and SDAR's forwards (tests/test_simsd_sdar.py); a shifted
    block-causal target (Fast-dLLM v2) is refused in one line, not run silently under the wrong alignment."""
    from workbench.decoding.base import DecodeError
    from workbench.simsd.decode import simsd_decode

    fast, _, _ = load_checkpoint(write_family_checkpoint("fast_dllm_v2", tmp_path / "fast", block_size=4))
    with pytest.raises(DecodeError, match="the fast_dllm_v2 family's forward is block_causal-attention"):
        simsd_decode(fast, fast, PROMPTS, 8, block_length=4)
