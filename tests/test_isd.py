"""Introspective strided decoding (I-DLM §3.2, Algorithm 1, Eq. 3)."""
import math

import pytest
import torch

from workbench.decoding import DecodeError, get_policy
from workbench.idlm.isd import isd_decode, isd_tpf
from workbench.idlm.synthetic import SyntheticStrided


def test_eq3_hand_values():
    assert isd_tpf([0.0, 0.0, 0.0]) == pytest.approx(1.0)                  # p = 0: AR
    assert isd_tpf([1.0] * 5) == pytest.approx(6.0)                         # p = 1: N
    assert isd_tpf([0.85, 0.85]) == pytest.approx((2 + 0.85) / (2 - 0.85 ** 2))
    with pytest.raises(ValueError):
        isd_tpf([])


@pytest.mark.parametrize("stride", [2, 3, 5])
def test_greedy_isd_equals_ar_greedy_on_random_weights(micro_model, stride):
    prompts = [list(range(5, 25)), list(range(40, 52)), list(range(60, 90))]
    want = get_policy("ar_greedy")(micro_model, prompts, 24).tokens
    assert isd_decode(micro_model, prompts, 24, stride=stride).tokens == want
    real = [list(range(100, 124))] * 3
    want_real = get_policy("ar_greedy")(micro_model, prompts, 24, real_continuation=real, block_length=8).tokens
    assert isd_decode(micro_model, prompts, 24, stride=stride, real_continuation=real, block_length=8).tokens == want_real


def test_isd_hides_an_added_mask_token_as_ar_does(micro_model):
    """A mask token added to a pretrained AR model is hidden from every AR forward (``hide_mask_column``), so
    ISD's anchors must hide it too, or their argmax may be a token AR greedy can never emit."""
    import copy

    model = copy.deepcopy(micro_model)
    mask = model.mask_token_id
    model.set_added_mask_token(mask)
    with torch.no_grad():
        model.backbone.get_output_embeddings().weight[mask] *= 50.0       # the mask column would win everywhere
    prompts = [list(range(5, 25)), list(range(40, 52))]
    want = get_policy("ar_greedy")(model, prompts, 16).tokens
    assert mask not in {t for row in want for t in row}
    for n in (2, 3):
        assert isd_decode(model, prompts, 16, stride=n).tokens == want


def test_gated_r_isd_is_lossless_against_the_base(ar_checkpoint):
    from test_gated_lora import _gated
    from workbench.model.load import load_model

    model, _ = _gated(ar_checkpoint)
    base, _, _ = load_model(str(ar_checkpoint))
    prompts = [list(range(5, 25)), list(range(40, 52))]
    want = get_policy("ar_greedy")(base, prompts, 24).tokens
    for n in (2, 4):
        assert get_policy("isd")(model, prompts, 24, draft_length=n).tokens == want


def test_all_accepted_gives_n_tokens_per_forward():
    """p = 1: one propose-only step, then every step accepts N − 1 proposals and adds the bonus token."""
    m = SyntheticStrided(1.0)
    for n in (2, 4, 8):
        r = isd_decode(m, [[1, 2, 3]], 1 + 10 * n, stride=n)
        assert r.forwards == [11] and r.committed_per_step[0] == [1] + [n] * 10
        assert r.tokens == get_policy("ar_greedy")(SyntheticStrided(1.0), [[1, 2, 3]], 1 + 10 * n).tokens


@pytest.mark.parametrize("stride", [2, 3, 4, 6, 8])
def test_tpf_matches_eq3_on_the_measured_acceptance(stride):
    m = SyntheticStrided(0.85, seed=stride)
    r = isd_decode(m, [[1, 2, 3]] * 32, 256, stride=stride)
    tpf = sum(len(t) for t in r.tokens) / sum(r.forwards)
    acc = [a if not math.isnan(a) else 0.85 for a in r.slot_acceptance]
    assert all(abs(a - 0.85) < 0.05 for a in acc)
    # the pooled rate is accepted over verified proposals across the slots, not the mean of the slots' rates
    assert r.acceptance_rate == pytest.approx(sum(r.slot_accepted) / sum(r.slot_verified))
    assert sum(r.slot_verified) > 0 and abs(r.acceptance_rate - 0.85) < 0.03
    # the first propose-only step and the truncated last step cost a little: within 3 %
    assert tpf == pytest.approx(isd_tpf(acc), rel=0.03)


def test_sampled_proposals_keep_the_anchor_distribution():
    """proposal="sample" (d ~ q, the speculative-sampling rule) is lossless: at T = 1 the tokens at proposal
    positions follow softmax(anchor) (chi-square over 3,000 rows of a 6-token vocabulary)."""
    m = SyntheticStrided(0.7, vocab=6, margin=1.0, seed=3)
    n_rows = 3000
    r = isd_decode(m, [[1, 2]] * n_rows, 4, stride=3, temperature=1.0, seed=5, proposal="sample")
    pos = 3                                                    # absolute position of generated token 2
    target = int(m.token_at(torch.tensor(pos)))
    p = torch.full((6,), 1.0)
    p[target] = math.e
    p[5] = 0.0                                                 # the mask token is never emitted
    p /= p.sum()
    counts = torch.bincount(torch.tensor([t[1] for t in r.tokens]), minlength=6).float()
    expected = p * n_rows
    chi2 = float((((counts - expected) ** 2) / expected.clamp_min(1e-9))[:5].sum())
    assert counts[5] == 0 and chi2 < 20.5                      # 4 degrees of freedom: p < 0.0004 beyond


def engine_verify(clean_logits, draft_logits, specs, bonus_logits, temperature, top_k, top_p, alpha, gen):
    """Transcription of the I-DLM engine's verification (thuEcstasy/I-DLM
    inference/sglang/sglang/srt/dllm/algorithm/idlm_blockN.py, IDLMBlockN.run: "Standard verify" over all
    requests' specs at once, then the clean (bonus) token by _batched_sample's manual fallback), one request per
    row: ``clean_logits`` (n, k, V) verify the specs ``specs`` (n, k) drafted from ``draft_logits`` (n, k, V), whose
    scaled logits the engine stores and softmaxes at verification. Returns each row's emitted tokens."""
    n, k, v = clean_logits.shape
    all_clean_logits = clean_logits.reshape(n * k, v)
    if temperature != 1.0:
        all_clean_logits = all_clean_logits / temperature
    all_clean_probs = torch.softmax(all_clean_logits, dim=-1)
    stored = draft_logits.reshape(n * k, v) if temperature == 1.0 else draft_logits.reshape(n * k, v) / temperature
    all_draft_probs_t = torch.softmax(stored, dim=-1)
    all_spec_vals_t = specs.reshape(n * k)
    all_p = all_clean_probs.gather(1, all_spec_vals_t.unsqueeze(1)).squeeze(1)
    all_q = all_draft_probs_t.gather(1, all_spec_vals_t.unsqueeze(1)).squeeze(1)
    scaled_q = all_q * alpha
    all_ratios = torch.where(scaled_q > 0, all_p / scaled_q, torch.zeros_like(all_p))
    all_rands = torch.rand(n * k, generator=gen)
    all_accepted = (all_ratios >= 1.0) | (all_rands < all_ratios)
    corrected_dist = torch.clamp(all_clean_probs - all_draft_probs_t, min=0)
    corrected_sums = corrected_dist.sum(dim=-1, keepdim=True)
    corrected_dist = torch.where(corrected_sums > 0, corrected_dist / corrected_sums, all_clean_probs)
    all_corr = torch.multinomial(corrected_dist, num_samples=1, generator=gen).squeeze(1)
    scaled = bonus_logits if temperature == 1.0 else bonus_logits / temperature          # _batched_sample
    if top_k > 0:
        topk_vals, _ = scaled.topk(top_k, dim=-1)
        scaled = scaled.masked_fill(scaled < topk_vals[:, -1:], float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        mask = (cum_probs - sorted_logits.softmax(dim=-1)) >= top_p
        sorted_logits[mask] = float("-inf")
        scaled = sorted_logits.scatter(1, sorted_idx, sorted_logits)
    clean = torch.multinomial(torch.softmax(scaled, dim=-1), num_samples=1, generator=gen).squeeze(1)
    out = []
    for r in range(n):
        reject = next((si for si in range(k) if not all_accepted[r * k + si]), None)
        out.append(specs[r].tolist() + [int(clean[r])] if reject is None
                   else specs[r, :reject].tolist() + [int(all_corr[r * k + reject])])
    return out


@pytest.mark.parametrize("temperature,top_k,top_p,relax", [(1.0, 0, 1.0, 0.0), (0.7, 5, 0.9, 0.0), (1.3, 0, 0.8, 0.5)])
def test_engine_acceptance_equals_a_transcription_of_the_engine(temperature, top_k, top_p, relax):
    """ISD's argmax proposals at T > 0 are verified by the I-DLM engine's rule against the full draft softmax:
    :func:`idlm_engine_accept` equals a transcription of the engine's verification token for token, with the
    same random draws (uniforms, corrections, bonus tokens, in the engine's order)."""
    from workbench.decoding.sampling import sampling_probs
    from workbench.idlm.isd import idlm_engine_accept

    g = torch.Generator().manual_seed(0)
    n, k, v = 400, 3, 11
    clean = torch.randn(n, k + 1, v, generator=g) * 2
    draft_logits = clean[:, :k] + torch.randn(n, k, v, generator=g)          # drafts near the anchors
    specs = draft_logits.argmax(-1)
    want = engine_verify(clean[:, :k], draft_logits, specs, clean[:, k], temperature, top_k, top_p,
                         1.0 / (1.0 + relax), torch.Generator().manual_seed(7))
    res = idlm_engine_accept(specs, sampling_probs(draft_logits, temperature),
                             sampling_probs(clean[:, :k], temperature), sampling_probs(clean[:, k], temperature, top_k,
                                                                                       top_p),
                             torch.Generator().manual_seed(7), relax)
    assert res.emitted(specs) == want
    assert 0 < int((res.accepted < k).sum()) < n                   # rejections and full acceptances both occur


def test_isd_sampling_accepts_by_the_engine_rule():
    """On the synthetic model (anchor and draft: e at their token, 1 elsewhere, over 5 tokens) a right proposal has
    p = q and always passes, a wrong one passes with p(d) / q(d) = 1/e, and its correction is the anchor's token
    (max(0, p − q) is a point mass there). With 70 % right proposals the acceptance is 0.7 + 0.3 / e = 0.81 (the
    point-mass q = δ_d, used before, gives (0.7 e + 0.3) / (e + 4) = 0.33). The recorded q_k: a proposal's draft
    probability e/(e+4), a correction's residual probability 1, an exact or bonus token's p: e/(e+4) or 1/(e+4)."""
    e = math.e
    m = SyntheticStrided(0.7, vocab=6, margin=1.0, seed=3)
    r = isd_decode(m, [[1, 2]] * 200, 24, stride=3, temperature=1.0, seed=5)
    assert sum(r.slot_verified) > 1000 and r.acceptance_rate == pytest.approx(0.7 + 0.3 / e, abs=0.03)
    seen = {round(q, 4) for row in r.token_probs for q in row}
    assert seen == {round(e / (e + 4), 4), round(1 / (e + 4), 4), 1.0}


def test_relaxed_acceptance_raises_the_acceptance_rate_and_needs_sampling():
    """I-DLM §4.3 (Table 4): τ > 0 multiplies the acceptance ratio by 1 + τ, so more proposals pass at T = 1;
    at T = 0 the anchors are one-hot and τ is refused."""
    m = SyntheticStrided(0.7, vocab=6, margin=1.0, seed=3)
    rates = [isd_decode(m, [[1, 2]] * 64, 32, stride=4, temperature=1.0, seed=1, relax=t).acceptance_rate
             for t in (0.0, 1.0)]
    assert rates[1] > rates[0] + 0.1
    with pytest.raises(DecodeError, match="temperature > 0"):
        isd_decode(m, [[1, 2]], 8, stride=4, relax=0.5)


def test_bad_input(micro_model, tmp_path):
    with pytest.raises(DecodeError, match="≥ 2"):
        isd_decode(micro_model, [[1, 2]], 8, stride=1)
    with pytest.raises(DecodeError, match="context"):
        isd_decode(micro_model, [[1] * 1000], 24, stride=8)
    from workbench.model.trimode import TriModeLM
    from workbench.tokenizer import TokenizerError

    plain = TriModeLM(micro_model.backbone, None)
    with pytest.raises(TokenizerError, match="--add_mask_token"):
        isd_decode(plain, [[1, 2]], 8, stride=3)
