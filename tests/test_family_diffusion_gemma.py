"""DiffusionGemma as a workbench family: the adapter (workbench/model/families/diffusion_gemma.py) against the native
``DiffusionGemmaForBlockDiffusion`` forwards, and ``entropy_bound_decode`` (workbench/decoding/families/) against
transformers' ``generate`` token for token, on a tiny random model (text MoE, sliding window 16, canvas 8)."""
import pytest
import torch

from workbench.decoding.base import DecodeError, left_pad
from workbench.decoding.families.diffusion_gemma import entropy_bound_decode
from workbench.model.families.diffusion_gemma import TINY_TEXT, DiffusionGemmaLM, tiny_diffusion_gemma

LONG = list(range(5, 25))            # 20 tokens: longer than the sliding window (16)
SHORT = [30, 31, 32]


@pytest.fixture(scope="module")
def model() -> DiffusionGemmaLM:
    return tiny_diffusion_gemma(vocab_size=512, canvas_length=8, seed=0)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One math thread: the forwards are tiny, and two threads on two busy cores spin (3x slower, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_inductor_import(monkeypatch):
    """``generate`` calls ``torch.compiler.cudagraph_mark_step_begin()`` every step; outside CUDA graphs it only
    bumps a counter, but its first call imports torch._inductor (1-5 s on 2 cores, and a DeprecationWarning)."""
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)


def generate_new_tokens(model, prompts, gen_len, seed, **kw) -> torch.Tensor:
    """transformers' ``generate`` on the left-padded batch; returns its new tokens ``(N, k·C)``."""
    ids, valid = left_pad(prompts, 0, model.device)
    torch.manual_seed(seed)
    out = model.backbone.generate(ids, attention_mask=valid, max_new_tokens=gen_len, **kw)
    return out.sequences[:, ids.shape[1]:]


@pytest.mark.parametrize("prompts,gen_len,seed,kw", [
    # batch 1, gen_len a multiple of the canvas, generate's default temperatures and thresholds
    ([LONG[:7]], 16, 0, dict(max_denoising_steps=4)),
    # left-padded batch 2, gen_len not a multiple of the canvas; cold temperatures make several positions
    # pass the entropy bound and the rows stop denoising at different steps (a stopped row is frozen)
    ([LONG, SHORT], 12, 0, dict(max_denoising_steps=8, t_min=0.01, t_max=0.02)),
    # stop on confidence alone (no stability), at a temperature where a row that went on would still change
    ([LONG, SHORT], 16, 0, dict(max_denoising_steps=8, t_min=0.02, t_max=0.04, stability_threshold=0,
                                confidence_threshold=0.3)),
])
def test_entropy_bound_decode_equals_generate(model, prompts, gen_len, seed, kw):
    ref = generate_new_tokens(model, prompts, gen_len, seed, **kw)
    res = entropy_bound_decode(model, prompts, gen_len, seed=seed, **kw)
    assert ref.shape[1] == -(-gen_len // model.canvas_length) * model.canvas_length
    assert res.tokens == ref[:, :gen_len].tolist()
    assert all(len(t) == gen_len for t in res.tokens)
    assert [len(s) for s in res.committed_per_step] == res.forwards
    assert res.extra_forwards == [len(ref[0]) // model.canvas_length - 1] * len(prompts)
    if "t_min" in kw:                       # the setting covers early stopping, freezing and multi-token acceptance
        steps = kw["max_denoising_steps"] * 2
        assert min(res.forwards) < steps and res.forwards[0] != res.forwards[1]
        assert max(max(s) for s in res.committed_per_step) > 1


def test_entropy_bound_decode_eos_and_pad_equal_generate(model):
    """EOS handling as ``generate`` does it: a row whose canvas holds an EOS is finished (pad after the EOS, all pad
    in later canvases); when every row has finished, decoding stops and the tail is pad."""
    prompts, gen_len, kw = [LONG, SHORT], 24, dict(max_denoising_steps=6, t_min=0.01, t_max=0.02)
    first = entropy_bound_decode(model, prompts, 8, seed=1, **kw).tokens          # the first canvas of each row
    eos_row0 = next(t for t in first[0][2:] if t not in first[1] and t != 0)
    ref = generate_new_tokens(model, prompts, gen_len, 1, eos_token_id=eos_row0, pad_token_id=0, **kw)
    res = entropy_bound_decode(model, prompts, gen_len, seed=1, eos_token_id=eos_row0, pad_token_id=0, **kw)
    assert ref.shape[1] == gen_len and res.tokens == ref.tolist()
    row0 = res.tokens[0]
    assert row0[row0.index(eos_row0) + 1:] == [0] * (gen_len - row0.index(eos_row0) - 1)
    assert res.extra_forwards == [0, 2]                  # row 0 finished in its first canvas

    both = [eos_row0, first[1][3]]                       # every row finishes in the first canvas
    ref = generate_new_tokens(model, prompts, gen_len, 1, eos_token_id=both, pad_token_id=0, **kw)
    res = entropy_bound_decode(model, prompts, gen_len, seed=1, eos_token_id=both, pad_token_id=0, **kw)
    assert ref.shape[1] == model.canvas_length           # generate stopped after one canvas
    assert res.tokens == [r + [0] * (gen_len - len(r)) for r in ref.tolist()]


@pytest.mark.parametrize("padded", [False, True])
def test_canvas_logits_equal_native_decoder_forward(model, padded):
    prompts = [LONG, SHORT] if padded else [LONG, LONG[::-1]]
    ids, valid = left_pad(prompts, 0, model.device)
    cache = model.new_cache()
    p = ids.shape[1]
    model.extend(ids, cache, valid)
    g = torch.Generator().manual_seed(0)
    canvas = torch.randint(0, model.vocab_size, (2, model.canvas_length), generator=g)
    sc = torch.randn((2, model.canvas_length, model.vocab_size), generator=g) * 3
    kv = torch.cat([valid, torch.ones_like(canvas, dtype=torch.bool)], dim=1)
    pos = torch.arange(p, p + model.canvas_length).unsqueeze(0)
    with torch.no_grad():
        for cond in (None, sc):
            mine = model.canvas_logits(canvas, cache, kv, cond)
            native = model.backbone(decoder_input_ids=canvas, cache=cache, self_conditioning_logits=cond,
                                    decoder_position_ids=pos, decoder_attention_mask=kv if padded else None).logits
            assert mine.shape == (2, model.canvas_length, model.vocab_size)
            assert (mine - native).abs().max().item() <= 1e-5
        generic = model.diffusion_logits(canvas, cache, kv)        # no virtual mask in a random canvas: the same
        assert (generic[..., :-1] - model.canvas_logits(canvas, cache, kv)).abs().max() == 0
        assert torch.isinf(generic[..., -1]).all()
        assert (model.canvas_logits(canvas, cache, kv, sc) - model.canvas_logits(canvas, cache, kv)).abs().max() > 1e-3


def test_extend_grows_cache_and_canvas_logits_does_not(model):
    assert model.has_mask_token and model.mask_token_id == model.vocab_size      # the virtual mask id
    assert model.vocab_size == 512 and model.canvas_length == 8
    ids, valid = left_pad([LONG, SHORT], 0, model.device)
    cache = model.new_cache()
    with torch.no_grad():
        logits = model.extend(ids, cache, valid)
        assert logits.shape == (2, 20, 512) and cache.get_seq_length() == 20
        kv = torch.cat([valid, torch.ones((2, 8), dtype=torch.bool)], dim=1)
        block = torch.arange(40, 48).repeat(2, 1)
        keys = [layer.keys.clone() for layer in cache.layers]
        a = model.canvas_logits(block, cache, kv)
        b = model.canvas_logits(block, cache, kv)
        assert cache.get_seq_length() == 20 and torch.equal(a, b)
        assert all(torch.equal(k, layer.keys) for k, layer in zip(keys, cache.layers))
        last = model.extend(block, cache, kv, logits_to_keep=1)
        assert last.shape == (2, 1, 512) and cache.get_seq_length() == 28
        with pytest.raises(ValueError, match="key_valid"):
            model.extend(block, cache, kv)                     # key_valid one canvas short


def test_encoder_logits_are_a_gemma4_causal_lm(model):
    """The encoder with the tied lm_head and the soft-cap is exactly ``Gemma4ForCausalLM`` (MoE, keys = values on
    full layers, no per-layer inputs) with the same weights: ``extend``'s logits are next-token logits in form, also
    when committed in two chunks across the sliding window (the weights being trained as AR is not checkable)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    g4 = Gemma4ForCausalLM(Gemma4TextConfig(vocab_size=512, **TINY_TEXT, hidden_size_per_layer_input=0,
                                            attention_k_eq_v=True, enable_moe_block=True,
                                            final_logit_softcapping=30.0)).eval()
    state = {"model." + k: w for k, w in model.backbone.model.encoder.language_model.state_dict().items()}
    state["lm_head.weight"] = model.backbone.lm_head.weight
    g4.load_state_dict(state, strict=True)
    ids = torch.tensor([LONG + [50, 51, 52, 53, 54, 55]])                # 26 tokens
    cache = model.new_cache()
    with torch.no_grad():
        ref = g4(input_ids=ids).logits
        first = model.extend(ids[:, :18], cache, torch.ones((1, 18), dtype=torch.bool))
        second = model.extend(ids[:, 18:], cache, torch.ones((1, 26), dtype=torch.bool))
    assert (torch.cat([first, second], 1) - ref).abs().max().item() <= 1e-5


def test_entropy_bound_decode_rejects_bad_settings(model):
    with pytest.raises(DecodeError, match="t_min < t_max"):
        entropy_bound_decode(model, [SHORT], 8, t_min=0.8, t_max=0.4)
    with pytest.raises(DecodeError, match="vocabulary"):
        entropy_bound_decode(model, [[600]], 8)
    with pytest.raises(TypeError):
        DiffusionGemmaLM(torch.nn.Linear(2, 2))
