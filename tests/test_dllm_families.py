"""Released diffusion LMs (issue 57): each registered family's tiny checkpoint, written in the family's on-disk
layout (``workbench.model.families.fixtures``), opens with no remote code, and its adapter's cached forwards equal
an uncached forward of the whole canvas under the attention mask written here from the family's own code:

* NLD (vLLM ``nemotron_dllm``, HF ``generate_with_prefix_cache_block_diff``): prefix rows causal, block rows see
  prefix and block; unshifted;
* SDAR (``generate.py``: ``tril(num_blocks)`` repeated by the block length, positions from 0) and Fast-dLLM v2
  (``q // bd_size >= kv // bd_size``, shifted);
* LLaDA (``generate.py``: the whole canvas with every future mask, no mask) and Dream (the same, shifted);
* I-DLM (strictly causal, shifted).

The batch is left-padded with prompts of different lengths, so SDAR's and Fast-dLLM v2's rows hold back different
numbers of prompt-tail tokens; a second block is compared after the first is committed. Bad input gets one line.
"""
import json
import shutil
import subprocess
import sys

import pytest
import torch

from workbench.decoding import get_policy
from workbench.decoding.base import DecodeError, left_pad
from workbench.model.families import FamilyError
from workbench.model.families.fixtures import RELEASED_CONFIGS, write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.masks import to_additive

FAMILIES = ["nld", "sdar", "llada", "dream", "fast_dllm_v2", "idlm"]
BLOCK = {"sdar": 4, "fast_dllm_v2": 4}          # small absolute blocks, so the prompts' tails are held back
PROMPTS = [[72, 101, 108, 108, 111, 32, 119], [100, 101, 102, 32, 102]]   # 7 and 5 tokens


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: write_family_checkpoint(f, root / f, block_size=BLOCK.get(f)) for f in [*FAMILIES, "diffusion_gemma"]}


def reference_logits(model, family: str, canvas: list[int], ctx_len: int, queries: range) -> torch.Tensor:
    """Logits ``(len(queries), V)`` predicting the canvas tokens at ``queries`` from one uncached forward of the
    whole canvas under the family's reference mask (``ctx_len``: committed tokens before the block)."""
    n = len(canvas)
    i = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    s = model.block_size or 1                  # (unused by the families without a block size)
    allowed = {"nld": (k <= i) | (i >= ctx_len),
               "idlm": k <= i,
               "sdar": k // s <= i // s,
               "fast_dllm_v2": k // s <= i // s,
               "llada": torch.ones(n, n, dtype=torch.bool),
               "dream": torch.ones(n, n, dtype=torch.bool)}[family]
    ids = torch.tensor([canvas])
    with torch.no_grad():
        out = model.backbone(input_ids=ids, position_ids=torch.arange(n)[None],
                             attention_mask=to_additive(allowed, torch.float32), use_cache=False).logits[0]
    rows = [q - 1 for q in queries] if model.family.shift else list(queries)
    return out[rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_forward_equals_the_reference_canvas(checkpoints, family):
    model, tok, meta = load_checkpoint(checkpoints[family])
    assert meta["family"]["family"] == family and model.mask_token_id == tok.mask_token_id == 257
    m, b, future = model.mask_token_id, 4, 4
    sees_future = family in ("llada", "dream")
    ids, valid = left_pad(PROMPTS, 256, "cpu")
    block = torch.full((2, b), m)
    block[0, 2], block[1, 0] = 65, 66                              # a partly unmasked canvas
    filled = torch.tensor([[67, 68, 69, 70], [71, 72, 73, 74]])
    with torch.no_grad():
        cache = model.new_cache()
        model.extend(ids, cache, valid, logits_to_keep=1)
        kv = torch.cat([valid, torch.ones(2, b, dtype=torch.bool)], 1)
        first = model.diffusion_logits(block, cache, kv, future_masks=future)
        model.extend(filled, cache, kv, logits_to_keep=1)
        kv2 = torch.cat([kv, torch.ones(2, b, dtype=torch.bool)], 1)
        second = model.diffusion_logits(block, cache, kv2, future_masks=future - b)
    assert first.shape == (2, b, model.vocab_size)
    for r, prompt in enumerate(PROMPTS):
        p = len(prompt)
        tail = [m] * future if sees_future else []
        ref1 = reference_logits(model, family, prompt + block[r].tolist() + tail, p, range(p, p + b))
        torch.testing.assert_close(first[r], ref1, atol=1e-5, rtol=1e-5)
        ctx = prompt + filled[r].tolist()
        ref2 = reference_logits(model, family, ctx + block[r].tolist(), len(ctx), range(len(ctx), len(ctx) + b))
        torch.testing.assert_close(second[r], ref2, atol=1e-5, rtol=1e-5)


def test_the_mask_semantics_differ_between_families(checkpoints):
    """The reference masks are not interchangeable: the same weights under another family's mask give other logits
    (so the equality above is a check of each family's own pattern)."""
    model, _, _ = load_checkpoint(checkpoints["sdar"])
    canvas = PROMPTS[0] + [257] * 4
    a = reference_logits(model, "sdar", canvas, 7, range(7, 11))
    b = reference_logits(model, "llada", canvas, 7, range(7, 11))
    assert (a - b).abs().max() > 1e-3


def test_future_masks_are_seen_only_by_full_attention_families(checkpoints):
    prompt = torch.tensor([PROMPTS[0]])
    valid = torch.ones_like(prompt, dtype=torch.bool)
    out = {}
    for family in ("llada", "sdar"):
        model, _, _ = load_checkpoint(checkpoints[family])
        block = torch.full((1, 4), model.mask_token_id)
        kv = torch.cat([valid, torch.ones(1, 4, dtype=torch.bool)], 1)
        with torch.no_grad():
            cache = model.new_cache()
            model.extend(prompt, cache, valid, logits_to_keep=1)
            out[family] = [model.diffusion_logits(block, cache, kv, future_masks=f) for f in (0, 8)]
    assert (out["llada"][0] - out["llada"][1]).abs().max() > 1e-4
    torch.testing.assert_close(out["sdar"][0], out["sdar"][1])


def test_commits_in_any_chunking_give_the_same_cache(checkpoints):
    """SDAR's held-back partial block: committing 11 tokens at once or as 3 + 5 + 3 leaves the same state."""
    model, _, _ = load_checkpoint(checkpoints["sdar"])
    seq = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]])
    block = torch.full((1, 4), model.mask_token_id)
    outs = []
    for cuts in ([11], [3, 5, 3]):
        cache, kv, start = model.new_cache(), torch.zeros((1, 0), dtype=torch.bool), 0
        for c in cuts:
            kv = torch.cat([kv, torch.ones((1, c), dtype=torch.bool)], 1)
            model.extend(seq[:, start:start + c], cache, kv)
            start += c
        with torch.no_grad():
            outs.append(model.diffusion_logits(block, cache, torch.cat([kv, torch.ones((1, 4), dtype=torch.bool)], 1)))
        assert cache.get_seq_length() - 0 >= 8 and int(cache.family_state.count) == 8   # two whole blocks cached
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_confidence_decoding_runs_on_every_family(checkpoints, family):
    model, tok, _ = load_checkpoint(checkpoints[family])
    res = get_policy("confidence")(model, PROMPTS, 8, block_length=4, threshold=0.5, pad_id=256)
    assert [len(t) for t in res.tokens] == [8, 8] and all(1 <= f <= 8 for f in res.forwards)
    assert all(model.mask_token_id not in t for t in res.tokens)
    assert res.extra_forwards == ([0, 0] if family in ("llada", "dream") else [2, 2])   # no KV commit to recompute


@pytest.mark.parametrize("family,has_ar", [("nld", True), ("idlm", True), ("sdar", False), ("llada", False),
                                           ("dream", False), ("fast_dllm_v2", False)])
def test_ar_decoders_need_an_ar_mode(checkpoints, family, has_ar):
    model, _, _ = load_checkpoint(checkpoints[family])
    if has_ar:
        ar = get_policy("ar_greedy")(model, PROMPTS[:1], 4)
        logits = model.causal_logits(torch.tensor([PROMPTS[0]]))
        assert ar.tokens[0][0] == int(logits[0, -1].argmax())       # the AR mode is the causal next-token head
    else:
        with pytest.raises(DecodeError, match=f"needs the ar mode, which the {family} family does not have"):
            get_policy("ar_greedy")(model, PROMPTS[:1], 4)
        with pytest.raises(FamilyError, match="does not have"):
            model.causal_logits(torch.tensor([PROMPTS[0]]))


def test_layout_and_fields_are_the_families_own(checkpoints):
    from safetensors import safe_open

    def keys(f):
        with safe_open(str(checkpoints[f] / "model.safetensors"), "pt") as h:
            return set(h.keys())

    assert "model.transformer.blocks.0.ff_proj.weight" in keys("llada") and "lm_head.weight" not in keys("llada")
    assert "encoder.layers.0.self_attn.q_proj.weight" in keys("nld") and "diffusion_head.weight" in keys("nld")
    assert "model.layers.0.self_attn.q_norm.weight" in keys("sdar")
    cfg = {f: json.loads((checkpoints[f] / "config.json").read_text()) for f in FAMILIES}
    assert cfg["llada"]["model_type"] == "llada" and "d_model" in cfg["llada"] and "hidden_size" not in cfg["llada"]
    assert cfg["fast_dllm_v2"]["bd_size"] == 4 and "mask_token_id" not in cfg["fast_dllm_v2"]   # the token's id
    assert cfg["idlm"]["model_type"] == "sdar" and cfg["idlm"]["block_size"] == 3     # I-DLM-8B's stride 4
    assert all("auto_map" in c for c in cfg.values())                  # remote code named, never run
    for f in FAMILIES:                                                  # the release's fields, training-only included
        assert set(cfg[f]) == set(RELEASED_CONFIGS[f]), f
    assert cfg["sdar"]["attn_implementation"] == cfg["idlm"]["attn_implementation"] == "flex_attention"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True)


def test_bad_checkpoints_get_one_line(checkpoints, tmp_path):
    # another family's weights under LLaDA's config
    bad = tmp_path / "mixed"
    shutil.copytree(checkpoints["llada"], bad)
    shutil.copy(checkpoints["dream"] / "model.safetensors", bad / "model.safetensors")
    with pytest.raises(FamilyError, match=r"do not fit the llada layout \(\d+ missing \(first: .+\); \d+ unexpected"):
        load_checkpoint(bad)
    # a mask id outside the vocabulary, a bad block size
    for name, field, value, msg in (("mask", "mask_token_id", 10_000, "outside the vocabulary"),
                                    ("block", "block_size", 0, "not a positive block size")):
        d = tmp_path / name
        shutil.copytree(checkpoints["sdar"], d)
        raw = json.loads((d / "config.json").read_text())
        raw[field] = value
        (d / "config.json").write_text(json.dumps(raw))
        with pytest.raises(FamilyError, match=msg):
            load_checkpoint(d)
    # an unregistered model_type that ships only remote code
    d = tmp_path / "remote"
    shutil.copytree(checkpoints["sdar"], d)
    raw = json.loads((d / "config.json").read_text())
    raw["model_type"] = "mystery_dlm"
    (d / "config.json").write_text(json.dumps(raw))
    res = _cli("models", "inspect", str(d))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "ships only remote code" in lines[0] and "llada" in lines[0] and "Dream" in lines[0]


def test_models_inspect_and_list(checkpoints):
    res = _cli("models", "inspect", str(checkpoints["fast_dllm_v2"]))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "family:      fast_dllm_v2" in out and "mask id:     257" in out and "block size:  4" in out
    assert "shifted" in out and "modes:       diffusion" in out
    listing = _cli("models", "list").stdout
    for family in [*FAMILIES, "diffusion_gemma"]:
        assert f"\n{family} " in listing
    gemma = _cli("models", "inspect", str(checkpoints["diffusion_gemma"]))
    assert gemma.returncode == 0 and "mask id:     none (open positions hold random tokens)" in gemma.stdout


def test_diffusion_gemma_opens_from_its_folder_with_a_virtual_mask(checkpoints):
    """DiffusionGemma has no mask token: its own decoder runs, and the mask-based decoders run over a fixed noise
    canvas (undecided positions marked by a virtual id one past the vocabulary, never predicted)."""
    model, tok, meta = load_checkpoint(checkpoints["diffusion_gemma"])
    assert meta["family"]["family"] == "diffusion_gemma" and meta["family"]["mask_token_id"] is None
    v = model.vocab_size
    assert model.mask_token_id == v
    res = get_policy("diffusion_gemma")(model, PROMPTS, 12, max_denoising_steps=3)
    assert [len(t) for t in res.tokens] == [12, 12] and all(1 <= f <= 6 for f in res.forwards)
    ids, valid = left_pad(PROMPTS, 256, "cpu")
    block = torch.full((2, 4), v)
    block[:, 1] = 65
    with torch.no_grad():
        cache = model.new_cache()
        model.extend(ids, cache, valid)
        kv = torch.cat([valid, torch.ones(2, 4, dtype=torch.bool)], 1)
        got = model.diffusion_logits(block, cache, kv)
        p = ids.shape[1]
        noise = model.noise_tokens(torch.arange(p, p + 4))
        want = model.canvas_logits(torch.where(block == v, noise, block), cache, kv)
    assert got.shape == (2, 4, v + 1) and torch.isinf(got[..., v]).all()
    torch.testing.assert_close(got[..., :v], want)
    conf = get_policy("confidence")(model, PROMPTS, 8, block_length=4, threshold=0.5, pad_id=256)
    assert all(v not in t and len(t) == 8 for t in conf.tokens)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_the_prefix_cache_is_an_explicit_approximation(checkpoints, family):
    """Fast-dLLM v1's prefix cache: a block's first forward is the exact one; later forwards reuse the prefix's keys
    from it (computed when the block was all masks), so they differ from the exact recompute."""
    model, _, _ = load_checkpoint(checkpoints[family])
    m = model.mask_token_id
    prompt = torch.tensor([PROMPTS[0]])
    valid = torch.ones_like(prompt, dtype=torch.bool)
    kv = torch.cat([valid, torch.ones(1, 4, dtype=torch.bool)], 1)
    first, later = torch.full((1, 4), m), torch.tensor([[m, 70, m, 71]])
    outs = {}
    for approx in (False, True):
        cache = model.new_cache()
        model.extend(prompt, cache, valid)
        with torch.no_grad(), (model.approximate_prefix_cache() if approx else torch.enable_grad()):
            outs[approx] = [model.diffusion_logits(x, cache, kv, future_masks=4) for x in (first, later)]
    torch.testing.assert_close(outs[True][0], outs[False][0])               # the block's first forward: exact
    assert (outs[True][1] - outs[False][1]).abs().max() > 1e-4              # then the stale prefix keys show
    res = get_policy("confidence_prefix_cache")(model, PROMPTS, 8, block_length=4, threshold=0.5, pad_id=256)
    assert [len(t) for t in res.tokens] == [8, 8]
    with pytest.raises(DecodeError, match="has an exact cache"):
        get_policy("confidence_prefix_cache")(load_checkpoint(checkpoints["sdar"])[0], PROMPTS, 8, block_length=4)


def test_a_family_can_be_forced_on_a_folder(checkpoints):
    """I-DLM ships in SDAR's format: ``idlm:<folder>`` opens an SDAR-format folder with I-DLM's semantics."""
    from workbench.model.load import load_model

    model, _, meta = load_model(f"idlm:{checkpoints['sdar']}")
    assert meta["family"]["family"] == "idlm" and meta["family"]["model_type"] == "sdar" and "ar" in model.modes
    assert load_model(str(checkpoints["sdar"]))[2]["family"]["family"] == "sdar"


@pytest.mark.parametrize("fields,family", [({"block_size": 1}, "idlm"), ({"block_size": 3}, "idlm"),
                                           ({"block_size": 7}, "idlm"), ({"block_size": 4}, "sdar"),
                                           ({"block_size": 64}, "sdar"), ({"block_size": 5}, "sdar"),
                                           ({"block_size": 4, "use_regular_causal": True}, "idlm")])
def test_sdar_or_idlm_is_always_a_named_guess(fields, family):
    """SDAR and I-DLM share a format: the evidence (an I-DLM block size, ``use_regular_causal``) picks one, and the
    choice is a guess whose line names the prefix of the other; a prefix, or a format of one family, is no guess."""
    from workbench.model.families.registry import choose_family

    raw = {"model_type": "sdar", **fields}
    choice = choose_family(raw, "ck")
    other = {"idlm": "sdar", "sdar": "idlm"}[family]
    assert choice.spec.name == family and choice.guessed and choice.others == (other,)
    line = choice.line("ck")
    assert f"opened as {family}" in line and f"{other}:ck opens it as {other}" in line and "\n" not in line
    assert not choose_family(raw, "ck", name=other).guessed and choose_family(raw, "ck", name=other).spec.name == other
    assert not choose_family({"model_type": "Dream"}, "ck").guessed


def test_sharded_checkpoints_and_bf16_open(checkpoints, tmp_path):
    """A checkpoint sharded with a safetensors index (as the 3–14 B releases ship) opens strictly, in bf16 too."""
    from safetensors.torch import load_file, save_file

    src = checkpoints["llada"]
    d = tmp_path / "sharded"
    shutil.copytree(src, d)
    (d / "model.safetensors").unlink()
    state = load_file(str(src / "model.safetensors"))
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(d / name), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}))
    a, _, _ = load_checkpoint(src)
    b, _, _ = load_checkpoint(d)
    for (ka, va), (kb, vb) in zip(sorted(a.backbone.state_dict().items()), sorted(b.backbone.state_dict().items())):
        assert ka == kb and torch.equal(va, vb)
    half, _, _ = load_checkpoint(d, dtype=torch.bfloat16)
    assert half.mask_dtype == torch.bfloat16
    res = get_policy("confidence")(half, PROMPTS, 8, block_length=4, threshold=0.5, pad_id=256)
    assert [len(t) for t in res.tokens] == [8, 8]
