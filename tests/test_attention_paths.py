"""Attention paths (issue 24 §2): SDPA with boolean masks and FlexAttention block masks give the dense additive
reference's logits and gradients, for the training dual stream and for block-diffusion decoding."""
import pytest
import torch
from transformers import LlamaForCausalLM

from workbench.model.attention import dual_stream_block_mask, dual_stream_mask_mod, set_attention_path
from workbench.model.masks import dual_stream_allowed
from workbench.model.noise import mask_blocks
from workbench.model.presets import preset_config
from workbench.model.trimode import TriModeLM
from workbench.tokenizer import MASK_ID


def _model(path: str) -> TriModeLM:
    torch.manual_seed(0)
    m = TriModeLM(LlamaForCausalLM(preset_config("micro")), MASK_ID)
    set_attention_path(m, path)
    return m


def _dual_stream(m, seed=0, grad=True, device="cpu"):
    m.to(device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 250, (2, 32), generator=g)
    noisy, _, _ = mask_blocks(x, 8, MASK_ID, 1e-3, g)
    x, noisy = x.to(device), noisy.to(device)
    with torch.set_grad_enabled(grad):
        ar, diff = m.dual_stream_logits(x, noisy, 8)
    if not grad:
        return ar.cpu(), diff.cpu(), None
    (ar.float().square().mean() + diff.float().square().mean()).backward()
    grads = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    return ar.detach().cpu(), diff.detach().cpu(), grads.cpu()


def _decode_block(m):
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 250, (2, 20), generator=g)
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, :5] = False                                     # a left-padded row
    block = torch.full((2, 8), MASK_ID)
    block[:, 2] = 7
    with torch.no_grad():
        cache = m.new_cache()
        m.extend(prefix, cache, valid)
        return m.diffusion_logits(block, cache, torch.cat([valid, torch.ones(2, 8, dtype=torch.bool)], 1))


@pytest.mark.parametrize("causal_in_block", [False, True])
def test_dual_stream_mask_mod_is_the_dense_rule(causal_in_block):
    """The FlexAttention mask_mod reproduces dual_stream_allowed everywhere (hand-checked against the dense
    builder, which tests/test_masks.py checks against NLD Fig. 3)."""
    L, b = 24, 4
    q = torch.arange(2 * L)[:, None].expand(2 * L, 2 * L)
    k = torch.arange(2 * L)[None, :].expand(2 * L, 2 * L)
    got = dual_stream_mask_mod(L, b, causal_in_block)(0, 0, q, k)
    assert torch.equal(got, dual_stream_allowed(L, b, causal_in_block=causal_in_block))


def test_sdpa_bool_path_equals_dense(monkeypatch):
    """Boolean masks reach SDPA on the sdpa_bool path (float masks on dense), with the same logits and
    gradients."""
    import torch.nn.functional as F

    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kw):
        seen.append(None if attn_mask is None else attn_mask.dtype)
        return sdpa(*args, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    ref_ar, ref_diff, ref_g = _dual_stream(_model("dense"))
    assert seen and all(d is not None and d != torch.bool for d in seen)
    seen.clear()
    ar, diff, g = _dual_stream(_model("sdpa_bool"))
    assert seen and all(d == torch.bool for d in seen)
    torch.testing.assert_close(ar, ref_ar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(diff, ref_diff, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g, ref_g, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(_decode_block(_model("sdpa_bool")), _decode_block(_model("dense")), atol=1e-5,
                               rtol=1e-5)


def test_flex_block_masks_equal_the_dense_masks_on_cpu():
    """The flex path's BlockMasks (the dual stream's from its rule, a decoding mask from its tensor) give the
    attention of the dense boolean masks, and the training BlockMask skips the fully blocked tiles.

    Run through FlexAttention's unfused reference: on CPU, PyTorch 2.13 cannot run the model's compiled flex path
    (inductor's CPU flex template fails to build here, "cur_kvSplitSize4 was not declared", and there is no
    FlexAttention backward on CPU), so the model end to end, gradients included, is the GPU test below."""
    import warnings

    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    from workbench.model.attention import to_path
    from workbench.model.masks import cached_allowed, to_additive

    g = torch.Generator().manual_seed(0)
    L, b = 64, 8
    q, k, v = (torch.randn(2, 4, 2 * L, 16, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                     # "flex_attention called without torch.compile()"
        got = flex_attention(q, k, v, block_mask=dual_stream_block_mask(L, b, "cpu"))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dual_stream_allowed(L, b))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    valid = torch.ones(2, 40, dtype=torch.bool)
    valid[1, :7] = False
    allowed = cached_allowed(valid, 8, causal=False)          # a decoding block after a 32-token cache
    q2 = torch.randn(2, 4, 8, 16, generator=g)
    k2, v2 = torch.randn(2, 4, 40, 16, generator=g), torch.randn(2, 4, 40, 16, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got2 = flex_attention(q2, k2, v2, block_mask=to_path(to_additive(allowed), "flex"))
    ref2 = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=allowed[:, None])
    torch.testing.assert_close(got2, ref2, atol=1e-5, rtol=1e-5)
    assert dual_stream_block_mask(1024, 16, "cpu").sparsity() > 60.0     # percent of tiles skipped (68.75)


def test_flex_path_forward_equals_dense_on_cpu(monkeypatch):
    """The model on the flex path, forward only, on CPU: dual-stream logits and a cached decoding block equal the
    dense reference. transformers compiles FlexAttention, which inductor cannot build here (see above), so the
    test hands the model FlexAttention's eager kernel instead; a spy checks every layer ran it with a BlockMask.
    Gradients need the GPU test below (PyTorch has no FlexAttention backward on CPU)."""
    import warnings

    import transformers.integrations.flex_attention as hf_flex
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    calls = []

    def eager_flex(*args, **kwargs):
        calls.append(isinstance(kwargs.get("block_mask"), BlockMask))
        return flex_attention(*args, **kwargs)

    monkeypatch.setattr(hf_flex.WrappedFlexAttention, "__call__", lambda self: eager_flex)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                     # "flex_attention called without torch.compile()"
        ar, diff, _ = _dual_stream(_model("flex"), grad=False)
        block = _decode_block(_model("flex"))
    layers = preset_config("micro").num_hidden_layers
    assert len(calls) == 3 * layers and all(calls)          # dual stream, prefix extend, decoding block
    ref_ar, ref_diff, _ = _dual_stream(_model("dense"), grad=False)
    torch.testing.assert_close(ar, ref_ar, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(diff, ref_diff, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(block, _decode_block(_model("dense")), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
def test_flex_path_equals_dense_on_gpu():
    """The model on the compiled flex path: dual-stream logits and gradients equal the dense reference."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref_ar, ref_diff, ref_g = _dual_stream(_model("dense"), device="cuda")
    ar, diff, g = _dual_stream(_model("flex"), device="cuda")
    torch.testing.assert_close(ar, ref_ar, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(diff, ref_diff, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(g, ref_g, atol=1e-4, rtol=1e-3)


def test_unknown_path_and_flex_on_sliding_window_are_refused():
    with pytest.raises(ValueError, match="valid: dense, sdpa_bool, flex"):
        set_attention_path(_model("dense"), "xformers")
    from transformers import MistralConfig, MistralForCausalLM

    m = TriModeLM(MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                   sliding_window=8)), 63)
    with pytest.raises(ValueError, match="sliding-window"):
        set_attention_path(m, "flex")
