"""LLaDA and Dream against their own reference code: the tiny checkpoints in ``tests/data/dllm_golden/{llada,dream}``
were saved by the families' modeling files, and their logits and ``generate`` outputs computed by that code under
transformers 4.57.6 (``PROVENANCE.md`` in each folder; ``scripts/golden/make_dllm_golden.py``). Here the workbench
opens the same folders natively (Llama / Qwen2 classes, no remote code) and must reproduce the logits (≤ 1e-5,
fp32) and the generated tokens exactly: every case, LLaDA's classifier-free guidance, random remasking and
Gumbel sampling and Dream's ``origin``, sampling, ``top_p`` / ``top_k`` and ``alg_temp`` included. The seeded
cases were drawn after ``torch.manual_seed(seed)``; the decoders make the same draws from a generator seeded with
``seed`` (CPU: the same stream)."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.decoding import get_policy
from workbench.model.io import load_checkpoint

GOLDEN = Path(__file__).parent / "data" / "dllm_golden"
PROMPT = 6                    # the logits inputs hold 6 prompt columns, then 10 canvas positions


def _load(family):
    ref = json.loads((GOLDEN / family / "reference.json").read_text())
    model, tok, meta = load_checkpoint(GOLDEN / family)
    assert meta["family"]["family"] == family and model.mask_token_id == ref["mask_token_id"]
    return model, tok, ref


def _valid(case, shape):
    am = case.get("attention_mask_2d", case.get("attention_mask"))
    return torch.tensor(am, dtype=torch.bool) if isinstance(am, list) else torch.ones(shape, dtype=torch.bool)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_equal_the_reference_model(family):
    model, _, ref = _load(family)
    logits = load_file(str(GOLDEN / family / "reference_logits.safetensors"))
    for name, case in ref["logits_inputs"].items():
        ids = torch.tensor(case["input_ids"])
        valid = _valid(case, ids.shape)
        with torch.no_grad():
            cache = model.new_cache()
            model.extend(ids[:, :PROMPT], cache, valid[:, :PROMPT])
            got = model.diffusion_logits(ids[:, PROMPT:], cache, valid)
        want = logits[name][:, PROMPT - 1:-1] if family == "dream" else logits[name][:, PROMPT:]   # Dream: shifted
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"{family} {name}: {m}")


def _cases(family):
    return json.loads((GOLDEN / family / "reference.json").read_text())["generate"]


def _prompts(case):
    out = []
    for r, row in enumerate(case["prompt"]):
        am = case.get("attention_mask")
        out.append([t for t, v in zip(row, am[r] if am else [1] * len(row)) if v])
    return out


@pytest.mark.parametrize("case", _cases("llada"), ids=lambda c: c["name"])
def test_llada_generate_token_for_token(case):
    model, _, _ = _load("llada")
    res = get_policy("llada")(model, _prompts(case), case["gen_length"], block_length=case["block_length"],
                              steps=case["steps"], temperature=case["temperature"], cfg_scale=case["cfg_scale"],
                              remasking=case["remasking"], seed=case.get("torch_manual_seed", 0), pad_id=145)
    width = len(case["prompt"][0])
    assert res.tokens == [row[width:] for row in case["output"]]


@pytest.mark.parametrize("case", _cases("dream"), ids=lambda c: c["name"])
def test_dream_generate_token_for_token(case):
    model, _, _ = _load("dream")
    res = get_policy(f"dream_{case['alg']}")(model, _prompts(case), case["max_new_tokens"], steps=case["steps"],
                                              top_p=case["top_p"], top_k=case["top_k"],
                                              temperature=case["temperature"], alg_temp=case["alg_temp"],
                                              seed=case.get("torch_manual_seed", 0), pad_id=144)
    width = len(case["prompt"][0])
    assert res.tokens == [row[width:] for row in case["output"]]
