"""Forward counts after an EOS follow each family reference's own stopping rule (``get_policy(..., eos_id=...)``):
LLaDA's ``generate`` and Dream's ``diffusion_generate`` have none (every step runs and is counted), DiffusionGemma's
``generate`` finishes a row at its EOS and counts no forward after it. SDAR, Fast-dLLM v2, NLD and Fast-dLLM v1's
prefix cache are checked against their transcriptions in ``tests/test_dllm_reference_decoders.py``."""
from pathlib import Path

import pytest
import torch

from workbench.decoding import get_policy
from workbench.decoding.families.diffusion_gemma import entropy_bound_decode
from workbench.model.io import load_checkpoint

GOLDEN = Path(__file__).parent / "data" / "dllm_golden"
PROMPTS = [[145, 17, 5, 88, 42, 101], [145, 3, 64, 64, 120, 9]]


def _cut(row, eos):
    return row[:row.index(eos) + 1] if eos in row else row


@pytest.mark.parametrize("name,family,kw", [
    ("llada", "llada", dict(block_length=8, steps=8)),
    ("llada", "llada", dict(block_length=8, steps=8, temperature=1.0, remasking="random", seed=3)),
    ("dream_maskgit_plus", "dream", dict(steps=8)),
    ("dream_origin", "dream", dict(steps=8, seed=3))])
def test_without_an_eos_rule_every_step_runs(name, family, kw):
    model, _, _ = load_checkpoint(GOLDEN / family)
    free = get_policy(name)(model, PROMPTS, 16, **kw)
    eos = free.tokens[0][3]
    res = get_policy(name)(model, PROMPTS, 16, eos_id=eos, **kw)
    assert res.tokens == [_cut(t, eos) for t in free.tokens] and len(res.tokens[0]) <= 4
    assert res.forwards == free.forwards == [8, 8] and res.committed_per_step == free.committed_per_step


def test_diffusion_gemma_finishes_a_row_at_its_eos():
    """The registered decoder hands ``eos_id`` to ``generate``'s rule (the checkpoint's generation config has no
    EOS): a finished row's later canvases cost it nothing, as ``generate`` counts; the tokens end at the EOS."""
    from workbench.model.families.diffusion_gemma import tiny_diffusion_gemma

    torch.set_num_threads(1)
    model = tiny_diffusion_gemma(vocab_size=512, canvas_length=8, seed=0)
    prompts, kw = [list(range(5, 25)), [30, 31, 32]], dict(max_denoising_steps=4, seed=0)
    free = get_policy("diffusion_gemma")(model, prompts, 24, **kw)
    eos = free.tokens[0][2]
    res = get_policy("diffusion_gemma")(model, prompts, 24, eos_id=eos, **kw)
    want = entropy_bound_decode(model, prompts, 24, eos_token_id=eos, **kw)
    assert res.forwards == want.forwards and res.extra_forwards == want.extra_forwards
    assert res.forwards[0] < free.forwards[0]
    assert res.tokens[0] == free.tokens[0][:3]
    assert res.tokens[1] == _cut(want.tokens[1], eos)
