"""Linear and quadratic self-speculation (NLD §3.3, App. C): losslessness against AR greedy, exact
acceptance bookkeeping with an oracle drafter, the quadratic attention layout, the sampling
distribution, and the LoRA drafter / verifier split."""
import itertools

import numpy as np
import pytest
import torch

import workbench.speculative.driver as driver
from workbench.corpus import stdlib_root
from workbench.decoding.ar import ar_decode
from workbench.decoding.base import DecodeError
from workbench.model.masks import to_additive
from workbench.model.trimode import TriModeLM
from workbench.speculative.adapter import verifier_mode
from workbench.speculative.context import SpecContext
from workbench.speculative.linear import draft_forward, linear_self_speculation
from workbench.speculative.quadratic import quadratic_forward, quadratic_self_speculation
from workbench.speculative.quadratic_mask import quadratic_allowed, quadratic_mask, quadratic_offsets
from workbench.tokenizer import encode_bytes

from small_models import peaked_model

PAD = 258
METHODS = [linear_self_speculation, quadratic_self_speculation]


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 12, 1, 9)]


def _check_counters(res, gen_len, quadratic=False):
    for r in range(len(res.tokens)):
        assert len(res.tokens[r]) == gen_len and sum(res.committed_per_step[r]) == gen_len
        assert [t for step in res.step_tokens[r] for t in step] == res.tokens[r]
        assert all(c >= 1 for c in res.committed_per_step[r])
        cycles = len(res.committed_per_step[r])
        if quadratic:  # one forward per iteration + the initial draft; verification rides along
            assert res.forwards[r] == cycles + 1 and res.extra_forwards[r] == 0
        else:          # one draft + one verify forward per cycle
            assert res.forwards[r] == res.extra_forwards[r] == cycles
        assert res.tpf_real(r) == pytest.approx(gen_len / (res.forwards[r] + res.extra_forwards[r]))


@pytest.mark.parametrize("fn", METHODS)
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_equals_ar_micro(micro_model, fn, k):
    """Batched prompts of different lengths (one of a single token): tokens identical to AR greedy."""
    prompts = _prompts()
    ref = ar_decode(micro_model, prompts, 20, pad_id=PAD)
    res = fn(micro_model, prompts, 20, draft_length=k, pad_id=PAD)
    assert res.tokens == ref.tokens
    _check_counters(res, 20, quadratic=fn is quadratic_self_speculation)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_clean_prefix_layout_equals_ar_micro(micro_model, k):
    """NLD §3.3's draft input [x_1..x_n, m_1..m_k]: lossless free-running and in real context, with the same
    forward counts (one draft, one verify per cycle)."""
    prompts = _prompts()
    ref = ar_decode(micro_model, prompts, 20, pad_id=PAD)
    res = linear_self_speculation(micro_model, prompts, 20, draft_length=k, pad_id=PAD, layout="clean_prefix")
    assert res.tokens == ref.tokens
    _check_counters(res, 20)
    real = [list(range(30, 50))] * len(prompts)
    ref = ar_decode(micro_model, prompts, 20, pad_id=PAD, real_continuation=real, block_length=5)
    res = linear_self_speculation(micro_model, prompts, 20, draft_length=k, pad_id=PAD, layout="clean_prefix",
                                  real_continuation=real, block_length=5)
    assert res.tokens == ref.tokens


def test_clean_prefix_draft_is_the_diffusion_mode_after_the_last_token(micro_model):
    """The paper's layout drafts exactly what the diffusion mode gives for a block of k masks once x_{n+1} is in
    the cache (two separate forwards), and its AR logit at x_{n+1} is the verifier's for d_1."""
    ids = torch.tensor([_prompts()[1]])
    k = 4
    with torch.no_grad():
        ctx = SpecContext.prefill(micro_model, ids, torch.ones_like(ids, dtype=torch.bool))
        masks = torch.full((1, k), micro_model.mask_token_id)
        first, z = micro_model.extend_and_diffuse(ctx.last[:, None], masks, ctx.cache, ctx.with_new(k + 1))
        ref = SpecContext.prefill(micro_model, ids, torch.ones_like(ids, dtype=torch.bool))
        ar = micro_model.extend(ref.last[:, None], ref.cache, ref.with_new(1))
        valid = torch.cat([ref.valid, torch.ones((1, 1 + k), dtype=torch.bool)], 1)
        diff = micro_model.diffusion_logits(masks, ref.cache, valid)
    torch.testing.assert_close(z, diff, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, ar, rtol=1e-5, atol=1e-5)


def _oracle_drafter(model, prompts, ref_tokens, cutoffs):
    """Replace ``model.diffusion_logits`` by a drafter that proposes AR greedy's own tokens for the first
    ``c`` masks (``c`` read from ``cutoffs`` in turn, per call) and a wrong token after that."""
    lengths = torch.tensor([len(p) for p in prompts])
    calls = iter(cutoffs)

    def fake(block, cache, key_valid):
        n, b = block.shape
        c = next(calls)
        first = key_valid[:, : key_valid.shape[1] - b].sum(1) + 1 - lengths  # generated index of mask 1
        logits = torch.zeros(n, b, model.backbone.config.vocab_size)
        for r in range(n):
            for j in range(1, b):
                g = int(first[r]) + j - 1
                truth = ref_tokens[r][g] if g < len(ref_tokens[r]) else 0
                logits[r, j, truth if j <= c else (truth + 1) % 256] = 50.0
        return logits

    model.diffusion_logits = fake
    return fake


def test_linear_oracle_drafts_exact_acceptance(micro_model):
    """With drafts correct for exactly ``c`` positions, every cycle emits ``c + 1`` tokens (truncated at
    gen_len), rejected keys stay punched out of the cache, and the output still equals AR greedy."""
    prompts, k, gen_len = _prompts(), 4, 24
    ref = ar_decode(micro_model, prompts, gen_len, pad_id=PAD).tokens
    cutoffs = [4, 0, 2, 1, 3, 4, 0, 2, 4, 1, 3, 2] * 4
    _oracle_drafter(micro_model, prompts, ref, cutoffs)
    res = linear_self_speculation(micro_model, prompts, gen_len, draft_length=k, pad_id=PAD)
    assert res.tokens == ref
    expected, left = [], gen_len
    for c in cutoffs:
        if left == 0:
            break
        expected.append(min(c + 1, left))
        left -= expected[-1]
    assert all(row == expected for row in res.committed_per_step)
    _check_counters(res, gen_len)


@pytest.fixture(scope="module")
def tiny():
    from workbench.model.load import load_model

    model, _, _ = load_model("builtin:tiny", "cpu")
    texts = [(stdlib_root() / f).read_text() for f in ("json/encoder.py", "textwrap.py", "colorsys.py")]
    prompts = [encode_bytes(t[:600])[-160:].tolist() for t in texts]
    real = [encode_bytes(t[600:900])[:48].tolist() for t in texts]
    return model, prompts, real


@pytest.mark.parametrize("mode", ["free", "real"])
def test_greedy_equals_ar_on_trained_tiny(tiny, mode):
    """On the trained model drafts are often accepted (multi-token cycles, different per row), and both
    schemes still reproduce AR greedy, free-running and in real-context mode."""
    model, prompts, real = tiny
    kw = {"real_continuation": real, "block_length": 16} if mode == "real" else {}
    ref = ar_decode(model, prompts, 48, pad_id=PAD, **kw)
    lin = linear_self_speculation(model, prompts, 48, draft_length=6, pad_id=PAD, **kw)
    quad = quadratic_self_speculation(model, prompts, 48, draft_length=3, pad_id=PAD, **kw)
    assert lin.tokens == ref.tokens and quad.tokens == ref.tokens
    _check_counters(lin, 48)
    if mode == "free":
        _check_counters(quad, 48, quadratic=True)
    else:  # one initial draft per real-context segment
        assert all(f == len(c) + 3 for f, c in zip(quad.forwards, quad.committed_per_step))
    # NLD §3.3's draft input: its commit keeps d_1..d_a of k appended keys (x_{n+1} came with the draft forward)
    clean = linear_self_speculation(model, prompts, 48, draft_length=6, pad_id=PAD, layout="clean_prefix", **kw)
    assert clean.tokens == ref.tokens
    _check_counters(clean, 48)
    for res in (lin, quad, clean):
        assert max(c for row in res.committed_per_step for c in row) >= 3   # the acceptance paths ran


def test_ensemble_lambda_below_one_is_not_ar(tiny):
    """λ < 1 mixes in the diffusion verifier: the output departs from AR greedy (λ = 1 does not)."""
    model, prompts, _ = tiny
    ref = ar_decode(model, prompts, 32, pad_id=PAD).tokens
    assert quadratic_self_speculation(model, prompts, 32, draft_length=3, ensemble_lambda=1.0, pad_id=PAD).tokens == ref
    mixed = quadratic_self_speculation(model, prompts, 32, draft_length=3, ensemble_lambda=0.0, pad_id=PAD)
    assert mixed.tokens != ref
    _check_counters(mixed, 32, quadratic=True)


# ---------------------------------------------------------------- quadratic layout

def test_quadratic_layout_hand_built():
    """k = 1: anchors S0 = x_{n+1}, S1 = d_1; groups of G = 2 masks after each anchor."""
    expected = torch.tensor([
        # S0 S1 g0a g0b g1a g1b
        [1, 0, 0, 0, 0, 0],   # S0: itself
        [1, 1, 0, 0, 0, 0],   # S1: causal over S
        [1, 0, 1, 1, 0, 0],   # group 0: anchor S0 + its own group
        [1, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 1],   # group 1: anchors S0, S1 + its own group
        [1, 1, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(quadratic_allowed(2, 2), expected)
    assert quadratic_offsets(2, 2).tolist() == [0, 1, 1, 2, 2, 3]
    valid = torch.tensor([[False, True, True]])
    mask = quadratic_mask(valid, 2, 2)
    assert mask.shape == (1, 1, 6, 9)
    assert (mask[0, 0, :, 0] < 0).all() and (mask[0, 0, :, 1:3] == 0).all()   # padding never seen, prefix always
    assert torch.equal(mask[0, 0, :, 3:] == 0, expected)


def test_quadratic_visibility_by_perturbation(micro_model):
    """Changing new token j changes exactly the outputs that can reach it through the mask (transitive
    over layers), entry by entry, for k = 2 after a 3-token prefix."""
    a, g, p = 3, 3, 3
    q = a + a * g
    new = quadratic_allowed(a, g)
    allowed = torch.zeros(p + q, p + q, dtype=torch.bool)
    allowed[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
    allowed[p:, :p] = True
    allowed[p:, p:] = new
    reach = allowed.clone()
    for _ in range(4):
        reach = reach | ((reach.float() @ reach.float()) > 0)
    pos = torch.cat([torch.arange(p), p + quadratic_offsets(a, g)])[None]
    torch.manual_seed(0)
    ids = torch.randint(0, 250, (p + q,))

    def fwd(x):
        with torch.no_grad():
            return micro_model.backbone(input_ids=x[None], position_ids=pos, attention_mask=to_additive(allowed)).logits[0]

    base = fwd(ids)
    for j in range(p, p + q):
        pert = ids.clone()
        pert[j] = (pert[j] + 17) % 250
        changed = (fwd(pert) - base).abs().amax(-1) > 1e-5
        assert torch.equal(changed[p:], reach[p:, j]), f"token {j}"


def test_quadratic_forward_matches_separate_forwards(micro_model):
    """The single forward equals: AR logits of an extend over ``S``, and for each group ``j`` the
    diffusion logits of ``G`` masks over the prefix + ``S_0..S_j`` (punched-out keys honoured)."""
    torch.manual_seed(2)
    n, k = 2, 2
    prefix = torch.randint(0, 256, (n, 7))
    valid = torch.ones(n, 7, dtype=torch.bool)
    valid[0, :2] = False
    valid[1, 4] = False                                   # a punched-out (rejected) key
    spec = torch.randint(0, 256, (n, k + 1))
    with torch.no_grad():
        ctx = SpecContext(micro_model.new_cache(), valid, spec[:, 0])
        micro_model.extend(prefix, ctx.cache, valid)
        ar, diff = quadratic_forward(micro_model, ctx, spec, k + 1, keep_spec=True)
        assert ctx.cache.get_seq_length() == 7 + k + 1
        ref_cache = micro_model.new_cache()
        kv = torch.cat([valid, torch.ones(n, k + 1, dtype=torch.bool)], 1)
        ref_ar = micro_model.extend(torch.cat([prefix, spec], 1), ref_cache, kv)[:, 7:]
        torch.testing.assert_close(ar, ref_ar.float(), atol=1e-5, rtol=1e-5)
        for j in range(k + 1):
            c = micro_model.new_cache()
            kvj = kv[:, : 8 + j]
            micro_model.extend(torch.cat([prefix, spec[:, : j + 1]], 1), c, kvj)
            masks = torch.full((n, k + 1), micro_model.mask_token_id)
            ref = micro_model.diffusion_logits(masks, c, torch.cat([kvj, torch.ones(n, k + 1, dtype=torch.bool)], 1))
            ref[..., micro_model.mask_token_id] = float("-inf")
            torch.testing.assert_close(diff[:, j], ref.float(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- sampling

def _sampling_model():
    """1-layer Llama, vocabulary of 6 tokens + [MASK] = 6, peaked distributions (LM head × 8)."""
    return peaked_model(8.0)


def _exact_ar_distribution(model, prompt, length):
    seqs = torch.tensor(list(itertools.product(range(7), repeat=length)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        lp = torch.log_softmax(model.causal_logits(ids).float(), -1)
    p = len(prompt)
    logp = sum(lp[:, p - 1 + t].gather(1, seqs[:, t:t + 1]).squeeze(1) for t in range(length))
    return logp.exp().double().numpy()


def _histogram(tokens, length):
    idx = (np.asarray(tokens) * (7 ** np.arange(length)[::-1])).sum(1)
    return np.bincount(idx, minlength=7 ** length) / len(tokens)


@pytest.mark.parametrize("fn", METHODS)
def test_sampling_matches_ar_distribution(fn, monkeypatch):
    """At temperature 1 the distribution of whole 3-token continuations equals AR sampling: total
    variation to the exact AR distribution within the 99.9 % quantile of the TV of N exact draws. A
    wrong rule (accept every draft) is far outside that bound, so the test can fail."""
    model, prompt, length, n = _sampling_model(), [1, 2, 3], 3, 12000
    p = _exact_ar_distribution(model, prompt, length)
    rng = np.random.default_rng(0)
    null = [0.5 * np.abs(rng.multinomial(n, p / p.sum()) / n - p).sum() for _ in range(1000)]
    bound = float(np.quantile(null, 0.999))
    res = fn(model, [prompt] * n, length, draft_length=2, temperature=1.0, seed=3)
    assert 0.5 * np.abs(_histogram(res.tokens, length) - p).sum() < bound
    assert max(c for row in res.committed_per_step for c in row) == 3   # fully accepted drafts occur

    right = driver.speculative_accept

    def accept_all(draft, q, probs, generator):
        out = right(draft, q, probs, generator)
        out.accepted[:] = draft.shape[1]
        out.next_token = torch.multinomial(probs[:, -1], 1, generator=generator).squeeze(1)
        return out

    monkeypatch.setattr(driver, "speculative_accept", accept_all)
    wrong = fn(model, [prompt] * n, length, draft_length=2, temperature=1.0, seed=3)
    assert 0.5 * np.abs(_histogram(wrong.tokens, length) - p).sum() > 3 * bound


# ---------------------------------------------------------------- LoRA drafter

def test_lora_adapter_changes_drafts_not_output(micro_model):
    """With a LoRA adapter (random non-zero B on o_proj) the drafts change but greedy output still equals
    AR greedy of the adapter-free verifier, for both schemes."""
    from peft import LoraConfig, get_peft_model

    prompts = _prompts()
    ref = ar_decode(micro_model, prompts, 16, pad_id=PAD).tokens
    torch.manual_seed(5)
    micro_model.backbone = get_peft_model(micro_model.backbone, LoraConfig(r=4, lora_alpha=16, target_modules=["o_proj"],
                                                                           init_lora_weights=False)).eval()
    with torch.no_grad():
        for name, w in micro_model.backbone.named_parameters():
            if "lora_B" in name:
                assert w.abs().sum() > 0
    with verifier_mode(micro_model):
        assert ar_decode(micro_model, prompts, 16, pad_id=PAD).tokens == ref
    assert ar_decode(micro_model, prompts, 16, pad_id=PAD).tokens != ref    # the adapter is live on the AR path
    for fn in METHODS:
        assert fn(micro_model, prompts, 16, draft_length=3, pad_id=PAD).tokens == ref
    ids = torch.tensor([prompts[1]])
    with torch.no_grad():
        ctx = SpecContext.prefill(micro_model, ids, torch.ones_like(ids, dtype=torch.bool))
        with_adapter = draft_forward(micro_model, ctx, 4)
        with verifier_mode(micro_model):
            without = draft_forward(micro_model, ctx, 4)
    assert not torch.allclose(with_adapter, without)

    seen = []
    orig = micro_model.diffusion_logits

    def spy(*args):
        seen.append(orig(*args))
        return seen[-1]

    micro_model.diffusion_logits = spy
    linear_self_speculation(micro_model, prompts[1:2], 4, draft_length=4, pad_id=PAD)
    first = seen[0][:, 1:].float().clone()
    first[..., micro_model.mask_token_id] = float("-inf")
    torch.testing.assert_close(first, with_adapter)      # the decode drafted with the adapter on


@pytest.mark.parametrize("fn,kw,msg", [
    (linear_self_speculation, {"draft_length": 0}, "draft length"),
    (quadratic_self_speculation, {"ensemble_lambda": 1.5}, "ensemble_lambda"),
    (linear_self_speculation, {"temperature": -1.0}, "temperature"),
    (quadratic_self_speculation, {"draft_length": 600}, "lookahead"),
])
def test_bad_arguments(micro_model, fn, kw, msg):
    with pytest.raises(DecodeError, match=msg):
        fn(micro_model, [[1, 2, 3]], 8, pad_id=PAD, **kw)


def test_draft_layout_refusals(micro_model):
    from peft import LoraConfig, get_peft_model

    with pytest.raises(DecodeError, match="valid: in_block, clean_prefix"):
        linear_self_speculation(micro_model, [[1, 2, 3]], 8, pad_id=PAD, layout="prefix")
    micro_model.backbone = get_peft_model(micro_model.backbone, LoraConfig(r=4, target_modules=["o_proj"])).eval()
    with pytest.raises(DecodeError, match="gated LoRA or no adapter"):     # a plain adapter would write x_{n+1}'s keys
        linear_self_speculation(micro_model, [[1, 2, 3]], 8, pad_id=PAD, layout="clean_prefix")
