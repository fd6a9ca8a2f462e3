"""Mask visibility: changing a token a position must not see leaves its logits unchanged, for every mask."""
import torch

from workbench.model.masks import cached_allowed, dual_stream_allowed, to_additive


def _perturb_check(forward, n_tokens, allowed, vocab=256, tol=1e-5):
    """For every position j, perturb token j and check which output positions change.

    ``forward(ids) -> (S, V)`` logits; ``allowed`` (S, S) bool: query i may see key j.
    Positions that cannot see j (directly or through attention chains) must be unchanged. Because
    attention composes over layers, visibility is the transitive closure of ``allowed``.
    """
    reach = allowed.clone()
    for _ in range(n_tokens):
        reach = reach | ((reach.float() @ reach.float()) > 0)
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (n_tokens,))
    base = forward(ids)
    for j in range(n_tokens):
        pert = ids.clone()
        pert[j] = (pert[j] + 17) % vocab
        diff = (forward(pert) - base).abs().amax(dim=-1)
        for i in range(n_tokens):
            if not reach[i, j]:
                assert diff[i] <= tol, f"position {i} changed when hidden token {j} changed"
        # sanity: a visible change does propagate somewhere (the check can fail)
        assert diff[j] > tol or not allowed[j, j]


def test_dual_stream_rules():
    a = dual_stream_allowed(8, 4)
    # noisy block 1 (positions 4..7) sees its own block and clean block 0 (8..11), not clean block 1
    assert a[5, 4:8].all() and a[5, 8:12].all() and not a[5, 12:16].any() and not a[5, 0:4].any()
    # clean stream is strictly causal and never sees noisy
    assert not a[8:, :8].any()
    assert torch.equal(a[8:, 8:], torch.tril(torch.ones(8, 8, dtype=torch.bool)))


def test_dual_stream_mask_visibility(micro_model):
    seq_len, b = 8, 4
    allowed = dual_stream_allowed(seq_len, b)
    pos = torch.arange(seq_len).repeat(2)[None]
    mask = to_additive(allowed)

    def fwd(ids):
        with torch.no_grad():
            return micro_model.backbone(input_ids=ids[None], position_ids=pos, attention_mask=mask).logits[0]

    _perturb_check(fwd, 2 * seq_len, allowed)


def test_cached_masks_visibility(micro_model):
    # 6 keys: 2 left-padding, 4 real; query = last 3 (bidirectional block or causal)
    valid = torch.tensor([[False, False, True, True, True, True, True, True]])
    for causal in (True, False):
        allowed_q = cached_allowed(valid, 3, causal)[0]  # (3, 8)
        full = torch.zeros(8, 8, dtype=torch.bool)
        full[:5, :5] = torch.tril(torch.ones(5, 5, dtype=torch.bool)) & valid[0, :5][None]
        full[:5] |= torch.eye(8, dtype=torch.bool)[:5]
        full[5:] = allowed_q
        mask = to_additive(full)
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)

        def fwd(ids):
            with torch.no_grad():
                return micro_model.backbone(input_ids=ids[None], position_ids=pos, attention_mask=mask).logits[0]

        _perturb_check(fwd, 8, full)
        if not causal:
            assert allowed_q[:, 5:].all()  # the block sees itself bidirectionally
        else:
            assert not allowed_q[0, 6] and allowed_q[2, 5]


def test_clean_stream_equals_causal_forward(micro_model):
    torch.manual_seed(0)
    x = torch.randint(0, 256, (3, 16))
    noisy = x.clone()
    noisy[:, ::3] = micro_model.mask_token_id
    with torch.no_grad():
        ar, _ = micro_model.dual_stream_logits(x, noisy, 4)
        ref = micro_model.causal_logits(x)
    torch.testing.assert_close(ar, ref, atol=1e-5, rtol=1e-5)


def test_diffusion_stream_equals_cached_block(micro_model):
    """The training forward's noisy block b equals inference: diffusion logits of the block over a
    KV cache of the clean prefix (same weights, same positions)."""
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 16))
    noisy = x.clone()
    noisy[:, 8:12] = micro_model.mask_token_id
    with torch.no_grad():
        _, d = micro_model.dual_stream_logits(x, noisy, 4)
        cache = micro_model.new_cache()
        valid = torch.ones(2, 8, dtype=torch.bool)
        micro_model.extend(x[:, :8], cache, valid)
        blk = micro_model.diffusion_logits(noisy[:, 8:12], cache, torch.ones(2, 12, dtype=torch.bool))
    torch.testing.assert_close(blk, d[:, 8:12], atol=1e-5, rtol=1e-5)
