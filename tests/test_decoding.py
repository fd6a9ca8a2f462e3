"""Decoding: cache equivalence, confidence vs serial, real-context bookkeeping, counters."""
import pytest
import torch

from workbench.decoding import DecodeError, get_policy
from workbench.decoding.rules import confidence_rule, serial_rule
from workbench.evaluation.metrics import ar_nll

PROMPTS = [list(range(10, 30)), list(range(40, 52)), [7, 8, 9]]


def test_ar_cache_equals_no_cache(micro_model):
    for real in (None, [[1] * 16, [2] * 16, [3] * 16]):
        a = get_policy("ar_greedy")(micro_model, PROMPTS, 16, real_continuation=real, block_length=4)
        b = get_policy("ar_greedy")(micro_model, PROMPTS, 16, real_continuation=real, block_length=4, use_cache=False)
        assert a.tokens == b.tokens
        assert a.forwards == [16] * 3


def test_diffusion_cache_equals_no_cache(micro_model):
    """Diffusion logits over the KV-cached prefix equal a full forward without cache (decoded tokens and
    per-step commits identical), free-running and real-context."""
    for real in (None, [[1] * 16, [2] * 16, [3] * 16]):
        a = get_policy("confidence")(micro_model, PROMPTS, 16, block_length=8, threshold=0.05, real_continuation=real)
        b = get_policy("confidence")(micro_model, PROMPTS, 16, block_length=8, threshold=0.05, real_continuation=real,
                                     use_cache=False)
        assert a.tokens == b.tokens and a.committed_per_step == b.committed_per_step


def test_cached_diffusion_logits_match_full_forward(micro_model):
    torch.manual_seed(3)
    prefix = torch.randint(0, 256, (2, 12))
    block = torch.full((2, 4), micro_model.mask_token_id)
    block[:, 1] = 5
    with torch.no_grad():
        cache = micro_model.new_cache()
        micro_model.extend(prefix, cache, torch.ones(2, 12, dtype=torch.bool))
        cached = micro_model.diffusion_logits(block, cache, torch.ones(2, 16, dtype=torch.bool))
        assert cache.get_seq_length() == 12  # the diffusion forward did not grow the cache
        fresh = micro_model.new_cache()
        full = micro_model._cached_forward(torch.cat([prefix, block], 1), fresh, torch.ones(2, 16, dtype=torch.bool),
                                           causal=False)[:, 12:]
    # the full forward lets the prefix see the block; rebuild with prefix causal instead
    with torch.no_grad():
        from workbench.model.masks import to_additive
        s = torch.zeros(16, 16, dtype=torch.bool)
        s[:12, :12] = torch.tril(torch.ones(12, 12, dtype=torch.bool))
        s[12:, :] = True
        ref = micro_model.backbone(input_ids=torch.cat([prefix, block], 1), position_ids=torch.arange(16)[None],
                                   attention_mask=to_additive(s)).logits[:, 12:]
    torch.testing.assert_close(cached, ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(full, ref)  # the prefix-causal mask matters (the check can fail)


def test_unreachable_threshold_equals_serial(micro_model):
    ser = get_policy("serial")(micro_model, PROMPTS, 16, block_length=8)
    conf = get_policy("confidence")(micro_model, PROMPTS, 16, block_length=8, threshold=1.0)
    assert conf.tokens == ser.tokens
    assert ser.forwards == [16] * 3 and all(c == [1] * 16 for c in ser.committed_per_step)
    assert ser.extra_forwards == [2] * 3 and ser.tpf_real(0) == pytest.approx(16 / 18)


def test_commit_rules_hand_built():
    probs = torch.tensor([[[0.95, 0.05], [0.6, 0.4], [0.92, 0.08], [0.5, 0.5]]])
    masked = torch.tensor([[True, True, False, True]])
    assert confidence_rule(probs, masked, 0.9).tolist() == [[True, False, False, False]]
    # nothing reaches the threshold: commit the single most confident masked position
    assert confidence_rule(probs, masked, 0.99).tolist() == [[True, False, False, False]]
    assert confidence_rule(probs, torch.tensor([[False, True, True, True]]), 0.99).tolist() == [[False, False, True, False]]
    assert serial_rule(probs, masked).sum().item() == 1


def test_padding_does_not_change_outputs(micro_model):
    alone = get_policy("confidence")(micro_model, [PROMPTS[2]], 16, block_length=4, threshold=0.05)
    batch = get_policy("confidence")(micro_model, PROMPTS, 16, block_length=4, threshold=0.05)
    assert alone.tokens[0] == batch.tokens[2]


def test_real_context_nll_matches_naive(micro_model):
    prompts = PROMPTS[:2]
    gen = [[5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 6, 7, 8]]
    real = [[20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34, 35, 36, 37]]
    got = ar_nll(micro_model, prompts, gen, real, block_length=4)
    for r in range(2):
        tot = 0.0
        for s in (0, 4):
            seq = torch.tensor([prompts[r] + real[r][:s] + gen[r][s:s + 4]])
            with torch.no_grad():
                lp = torch.log_softmax(micro_model.causal_logits(seq)[0].float(), -1)
            ctx = len(prompts[r]) + s
            tot += sum(-lp[ctx - 1 + k, gen[r][s + k]].item() for k in range(4))
        assert got[r] == pytest.approx(tot / 8, rel=1e-4)
    free = ar_nll(micro_model, prompts, gen)
    assert free[0] != pytest.approx(got[0])
    for r in range(2):                                   # free-running: the prompt and g_<i
        with torch.no_grad():
            lp = torch.log_softmax(micro_model.causal_logits(torch.tensor([prompts[r] + gen[r]]))[0].float(), -1)
        naive = -sum(lp[len(prompts[r]) - 1 + k, gen[r][k]].item() for k in range(8)) / 8
        assert free[r] == pytest.approx(naive, rel=1e-4)


@pytest.mark.parametrize("kw, msg", [
    (dict(block_length=0), "block length must be positive"),
    (dict(block_length=-4), "block length must be positive"),
    (dict(block_length=2048), "larger than the model context"),
    (dict(block_length=5), "does not divide"),
    (dict(block_length=4, threshold=0.0), r"threshold must be in \(0, 1\]"),
    (dict(block_length=4, threshold=1.5), r"threshold must be in \(0, 1\]"),
])
def test_bad_decoding_arguments(micro_model, kw, msg):
    with pytest.raises(DecodeError, match=msg):
        get_policy("confidence")(micro_model, PROMPTS, 16, **kw)


def test_unknown_policy_lists_valid_names():
    import re

    from workbench.decoding import load_decoders

    names = sorted(load_decoders())
    assert {"ar_greedy", "confidence", "serial", "sampler", "isd", "llada", "sdar", "diffusion_gemma"} <= set(names)
    with pytest.raises(DecodeError, match=re.escape("valid: " + ", ".join(names))):
        get_policy("nope")


def test_real_context_ar_without_block_length_is_one_segment(micro_model):
    """Real-context AR decoding with no block length treats the whole generation as one segment (as
    ``ar_nll`` does) instead of crashing on ``range(..., None)``."""
    real = [list(range(60, 76))] * len(PROMPTS)
    a = get_policy("ar_greedy")(micro_model, PROMPTS, 16, real_continuation=real)
    b = get_policy("ar_greedy")(micro_model, PROMPTS, 16, real_continuation=real, block_length=16)
    assert a.tokens == b.tokens and a.forwards == b.forwards


def test_ar_greedy_stops_at_eos_like_generate(ar_checkpoint):
    """ar_greedy equals transformers' generate(do_sample=False) token for token, up to and including EOS."""
    from workbench.model.load import load_model

    model, tok, _ = load_model(str(ar_checkpoint))
    prompt = tok("def f(x):\n    return", add_special_tokens=False)["input_ids"]
    free = get_policy("ar_greedy")(model, [prompt], 24).tokens[0]
    eos = free[6]                      # a token greedy decoding does emit, used as the end-of-sequence id
    got = get_policy("ar_greedy")(model, [prompt], 24, eos_id=eos)
    ref = model.backbone.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=eos,
                                  pad_token_id=eos)[0, len(prompt):].tolist()
    assert got.tokens[0] == ref == free[:free.index(eos) + 1]
    assert got.forwards[0] == len(got.tokens[0])


def test_stop_at_eos_recounts_forwards():
    from workbench.decoding.base import DecodeResult, stop_at_eos

    # speculative: cycles emit 3, 2, 4 tokens; EOS (9) is token 5 -> two cycles kept, each with its verify forward
    spec = DecodeResult(tokens=[[1, 2, 3, 4, 9, 5, 6, 7, 8]], forwards=[3], extra_forwards=[3],
                        committed_per_step=[[3, 2, 4]], step_tokens=[[[1, 2, 3], [4, 9], [5, 6, 7, 8]]])
    r = stop_at_eos(spec, 9)
    assert r.tokens == [[1, 2, 3, 4, 9]] and r.forwards == [2] and r.extra_forwards == [2]
    # block diffusion, B = 4: EOS at position 2 of block 0 -> block 0's three forwards and its KV commit
    blk = DecodeResult(tokens=[[1, 2, 9, 3, 4, 5, 6, 7]], forwards=[5], extra_forwards=[2],
                       committed_per_step=[[1, 2, 1, 3, 1]], step_tokens=[[[1], [2, 9], [3], [4, 5, 6], [7]]])
    r = stop_at_eos(blk, 9, block_length=4)
    assert r.tokens == [[1, 2, 9]] and r.forwards == [3] and r.extra_forwards == [1]
    # no EOS: unchanged
    assert stop_at_eos(blk, 99, 4).tokens == blk.tokens
    # a separate drafter's forwards (SimSD: B per block) are kept with their blocks or cycles
    blk.drafter_forwards, spec.drafter_forwards = [8], [6]
    assert stop_at_eos(blk, 9, block_length=4).drafter_forwards == [4]     # 1 of 2 blocks
    assert stop_at_eos(spec, 9).drafter_forwards == [4]                    # 2 of 3 cycles
    assert stop_at_eos(blk, 99, 4).drafter_forwards == [8]
    assert stop_at_eos(blk, 9, block_length=4).tpf_real(0) == 3 / (3 + 1 + 4)


def test_auto_precision_follows_native_bf16(monkeypatch):
    import warnings

    from workbench.decoding import base
    from workbench.decoding.base import NATIVE_BF16_ENV, DecodeError, autocast_for, native_bf16, resolve_precision

    cpu = torch.device("cpu")
    monkeypatch.delenv(NATIVE_BF16_ENV, raising=False)
    # 'auto' follows oneDNN's own check on this machine, and the explicit names pass through unchanged
    assert native_bf16(cpu) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert resolve_precision("auto", cpu) == ("bf16" if native_bf16(cpu) else "fp32")
    assert [resolve_precision(p, "cpu") for p in ("fp32", "bf16", "bf16-true")] == ["fp32", "bf16", "bf16-true"]
    with pytest.raises(DecodeError, match="valid: fp32, bf16, bf16-true"):
        resolve_precision("fp16", cpu)
    # both kinds of CPU, whatever this one is: through the environment override and by patching the check
    for native, want in (("1", "bf16"), ("0", "fp32")):
        monkeypatch.setenv(NATIVE_BF16_ENV, native)
        assert native_bf16(cpu) is (native == "1") and resolve_precision("auto", cpu) == want
        with warnings.catch_warnings(record=True) as seen:      # bf16 chosen by the user: no notice on either kind
            warnings.simplefilter("always")
            assert isinstance(autocast_for(cpu, "bf16"), torch.autocast)
            assert not isinstance(autocast_for(cpu, "fp32"), torch.autocast)
        assert seen == []
    monkeypatch.delenv(NATIVE_BF16_ENV)
    for native, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(base, "native_bf16", lambda device, native=native: native)
        assert resolve_precision("auto", cpu) == want
