"""The in-place KV cache layer (workbench.model.kv_cache) holds exactly what transformers' DynamicLayer holds."""
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from workbench.model.kv_cache import GrowableLayer, use_growable_layers


def _states(n, q, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, q, 4, generator=g).to(dtype), torch.randn(n, 2, q, 4, generator=g).to(dtype)


def _script():
    """(operation, argument) pairs: prefill, steps, crops (real-context resets, draft rejections), a batch
    selection, a dtype change (autocast), all of which the decoders do."""
    return [("update", (3, 7)), ("update", (3, 1)), ("update", (3, 1)), ("crop", -2), ("update", (3, 4)),
            ("update", (3, 9)), ("crop", -5), ("select", torch.tensor([2, 0])), ("update", (2, 3)),
            ("update_bf16", (2, 2)), ("crop", -1), ("update", (2, 40)), ("update", (2, 1))]


def test_growable_layer_equals_dynamic_layer_through_updates_crops_and_selects():
    ref, new = DynamicLayer(), GrowableLayer()
    for i, (op, arg) in enumerate(_script()):
        if op.startswith("update"):
            k, v = _states(*arg, dtype=torch.bfloat16 if op == "update_bf16" else torch.float32, seed=i)
            rk, rv = ref.update(k, v)
            nk, nv = new.update(k, v)
            assert torch.equal(rk, nk) and torch.equal(rv, nv) and rk.dtype == nk.dtype, (i, op)
        elif op == "crop":
            ref.crop(arg)
            new.crop(arg)
        else:
            ref.batch_select_indices(arg)
            new.batch_select_indices(arg)
        assert new.get_seq_length() == ref.get_seq_length()
        assert torch.equal(new.keys, ref.keys) and torch.equal(new.values, ref.values), (i, op)


def test_growable_layer_appends_in_place_and_grows_when_full():
    layer = GrowableLayer()
    layer.update(*_states(2, 5))
    assert layer._buf_k.shape[-2] == 5                   # the first update allocates what it needs
    layer.update(*_states(2, 1, seed=1))                 # 6 > 5 columns: reallocated at max(1.5 · 5, 6 + 64) = 70
    assert layer._buf_k.shape[-2] == 70 and layer.keys.shape[-2] == 6
    grown = layer.keys.data_ptr()
    for s in range(64):                                  # 7 … 70 columns fit: no copy, the same storage
        layer.update(*_states(2, 1, seed=2 + s))
        assert layer.keys.data_ptr() == grown
    layer.crop(-3)                                       # crop shortens the view; the next update reuses the columns
    layer.update(*_states(2, 3, seed=99))
    assert layer.keys.data_ptr() == grown and layer.keys.shape[-2] == 70
    layer.update(*_states(2, 1, seed=100))               # full: max(1.5 · 70, 71 + 64) = 135
    assert layer._buf_k.shape[-2] == 135 and layer.keys.data_ptr() != grown
    grown = layer.keys.data_ptr()
    k, v = _states(2, 2, dtype=torch.bfloat16, seed=101)  # narrower states are cast up in place, as cat promotes
    keys, _ = layer.update(k, v)
    assert keys.data_ptr() == grown and keys.dtype == torch.float32 and torch.equal(keys[:, :, -2:], k.float())


def test_states_that_need_grad_are_concatenated_and_backpropagate():
    layer = GrowableLayer()
    k, v = _states(1, 3)
    k.requires_grad_(True)
    keys, values = layer.update(k, v)
    keys.sum().backward()
    assert torch.equal(k.grad, torch.ones_like(k))


def test_use_growable_layers_replaces_only_plain_dynamic_layers():
    cache = use_growable_layers(DynamicCache())           # lazily replicated layers
    cache.update(*_states(1, 2), layer_idx=0)
    assert type(cache.layers[0]) is GrowableLayer
    sliding = type("Sliding", (DynamicLayer,), {})()
    cache = DynamicCache()
    cache.layers = [DynamicLayer(), sliding]
    use_growable_layers(cache)
    assert type(cache.layers[0]) is GrowableLayer and cache.layers[1] is sliding


def test_extend_with_logits_to_keep_gives_the_last_rows_and_the_same_cache(micro_model):
    """A prefill that reads only its last logits (AR decoding, the KV-commit forward) runs the LM head on those
    positions only; the logits and the cache it leaves are the full forward's."""
    torch.manual_seed(0)
    ids = torch.randint(0, 200, (3, 11))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, :4] = False                                   # a left-padded row
    with torch.no_grad():
        full_cache, last_cache = micro_model.new_cache(), micro_model.new_cache()
        full = micro_model.extend(ids, full_cache, valid)
        last = micro_model.extend(ids, last_cache, valid, logits_to_keep=1)
        assert last.shape == (3, 1, full.shape[-1])
        torch.testing.assert_close(last[:, 0], full[:, -1], rtol=1e-5, atol=1e-5)
        for a, b in zip(full_cache.layers, last_cache.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        step = torch.randint(0, 200, (3, 1))
        kv = torch.cat([valid, torch.ones((3, 1), dtype=torch.bool)], 1)
        torch.testing.assert_close(micro_model.extend(step, last_cache, kv, logits_to_keep=1),
                                   micro_model.extend(step, full_cache, kv), rtol=1e-5, atol=1e-5)
        # the LM head reads the kept rows as a contiguous copy (a slice keeps the sequence's batch stride, which
        # sends matmul down a path that copies the whole head per row), and more rows than Q keep all of them
        seen = []
        hook = micro_model.backbone.get_output_embeddings().register_forward_pre_hook(
            lambda mod, args: seen.append(args[0].is_contiguous()))
        try:
            three = micro_model.extend(ids, micro_model.new_cache(), valid, logits_to_keep=3)
            more = micro_model.extend(ids, micro_model.new_cache(), valid, logits_to_keep=20)
        finally:
            hook.remove()
        assert seen == [True, True]
        torch.testing.assert_close(three, full[:, -3:], rtol=1e-5, atol=1e-5)
        assert more.shape == full.shape
