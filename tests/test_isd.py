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


def test_sampling_keeps_the_anchor_distribution():
    """At T = 1 every emitted token is a draw from the anchor distribution p (argmax proposals, q = δ): the
    tokens at proposal positions follow softmax(anchor) (chi-square over 3,000 rows of a 6-token vocabulary)."""
    m = SyntheticStrided(0.7, vocab=6, margin=1.0, seed=3)
    n_rows = 3000
    r = isd_decode(m, [[1, 2]] * n_rows, 4, stride=3, temperature=1.0, seed=5)
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


def test_relaxed_acceptance_raises_the_acceptance_rate_and_needs_sampling():
    """I-DLM §4.3 (Table 4): τ > 0 multiplies the acceptance ratio by 1 + τ, so more proposals pass at T = 1;
    at T = 0 the anchors are one-hot and τ is refused."""
    m = SyntheticStrided(0.7, vocab=6, margin=1.0, seed=3)
    rates = [isd_decode(m, [[1, 2]] * 64, 32, stride=4, temperature=1.0, seed=1, relax=t).acceptance_rate
             for t in (0.0, 1.0)]
    assert rates[1] > rates[0] + 0.1
    with pytest.raises(DecodeError, match="temperature > 0"):
        isd_decode(m, [[1, 2]], 8, stride=4, relax=0.5)


def test_a_resampled_correction_records_its_residual_probability():
    """I-DLM §2's q_k(x_k) of a correction drawn after a rejection is its probability under norm(max(0, p − q)).
    With argmax proposals (q = δ_d) and anchors softmax(e at the target, 1 elsewhere over 5 tokens), a correction
    records p(x) / (1 − p(d)): e/(e+3) or 1/(e+3) after a wrong proposal, 1/4 after a right one (rejected with
    probability 1 − p(d) at T = 1); bonus and exact tokens p(x): e/(e+4) or 1/(e+4); accepted proposals 1. The
    anchors' p(x) alone, as recorded before, gives none of the three residual values."""
    e = math.e
    m = SyntheticStrided(0.5, vocab=6, margin=1.0, seed=3)
    r = isd_decode(m, [[1, 2]] * 64, 24, stride=3, temperature=1.0, seed=5)
    seen = {round(q, 4) for row in r.token_probs for q in row}
    residual = {round(e / (e + 3), 4), round(1 / (e + 3), 4), 0.25}
    assert seen <= {1.0, round(e / (e + 4), 4), round(1 / (e + 4), 4)} | residual and seen & residual


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
