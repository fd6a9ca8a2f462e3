"""LK-hybrid + CE drafter losses (NLD §3.3, Eq. 6–9) against hand-computed values on a 5-token vocabulary."""
import math

import pytest
import torch

from workbench.drafter.losses import (DEFAULT_LOSS, LOSSES, active_mask, block_mean, combine, expected_accepted,
                                      get_loss, position_terms, union_topk_support)

TAU = 3.0
# Position A: top-2 of p = {0, 1}, top-2 of q = {1, 2}  ->  U = {0, 1, 2} (token 3 and 4 dropped).
P_A = [0.5, 0.2, 0.15, 0.1, 0.05]
Q_A = [0.1, 0.4, 0.3, 0.15, 0.05]
# Position B: p and q agree on the top-2 {2, 3}  ->  U = {2, 3}.
P_B = [0.1, 0.05, 0.45, 0.35, 0.05]
Q_B = [0.05, 0.05, 0.3, 0.5, 0.1]


def logits_for(probs, tau=TAU):
    """Logits z with softmax(z / tau) == probs."""
    return tau * torch.log(torch.tensor(probs, dtype=torch.float64))


def hand_terms(p, q, support, eta=0.5):
    """Eq. 6 by hand: renormalise on the support, then KL, TV, alpha, lambda."""
    ps, qs = sum(p[v] for v in support), sum(q[v] for v in support)
    pt = {v: p[v] / ps for v in support}
    qt = {v: q[v] / qs for v in support}
    kl = sum(pt[v] * math.log(pt[v] / qt[v]) for v in support)
    tv = 0.5 * sum(abs(pt[v] - qt[v]) for v in support)
    alpha = sum(min(pt[v], qt[v]) for v in support)
    lam = math.exp(-eta * alpha)
    return dict(kl=kl, tv=tv, alpha=alpha, lam=lam, lk=lam * kl + (1 - lam) * tv)


def hand_ce(q, support, target, tau=TAU, ce_tau=1.0):
    """Eq. 7 by hand: drafter softmax at ce_tau restricted to the support; logits are tau*log q."""
    w = {v: q[v] ** (tau / ce_tau) for v in support}
    return -math.log(w[target] / sum(w.values()))


def two_positions():
    d = torch.stack([logits_for(Q_A), logits_for(Q_B)])[None].float()      # (1, 2, 5)
    v = torch.stack([logits_for(P_A), logits_for(P_B)])[None].float()
    return d, v


def test_union_support_is_union_of_both_top_k():
    d, v = two_positions()
    u = union_topk_support(v, d, 2)
    assert u[0, 0].tolist() == [True, True, True, False, False]
    assert u[0, 1].tolist() == [False, False, True, True, False]
    assert union_topk_support(v, d, 5).all() and union_topk_support(v, d, 99).all()
    with pytest.raises(ValueError, match="top_k"):
        union_topk_support(v, d, 0)


def test_position_terms_match_hand_values():
    d, v = two_positions()
    t = position_terms(d, v, tau=TAU, top_k=2, eta=0.5)
    for j, (p, q, sup) in enumerate([(P_A, Q_A, [0, 1, 2]), (P_B, Q_B, [2, 3])]):
        h = hand_terms(p, q, sup)
        assert t.kl[0, j].item() == pytest.approx(h["kl"], rel=1e-5)
        assert t.tv[0, j].item() == pytest.approx(h["tv"], rel=1e-5)
        assert t.alpha[0, j].item() == pytest.approx(h["alpha"], rel=1e-5)
        assert t.lam[0, j].item() == pytest.approx(h["lam"], rel=1e-5)
        assert t.lk_hybrid[0, j].item() == pytest.approx(h["lk"], rel=1e-5)
    # position A by hand: p~ = (.5,.2,.15)/.85, q~ = (.1,.4,.3)/.8 -> alpha = .125 + .2/.85 + .15/.85
    assert t.alpha[0, 0].item() == pytest.approx(0.125 + 0.35 / 0.85, rel=1e-6)
    # TV = 1 - alpha, lambda = exp(-eta alpha), in [e^-eta, 1]
    torch.testing.assert_close(t.tv, 1 - t.alpha)
    torch.testing.assert_close(t.lam, torch.exp(-0.5 * t.alpha))


def test_a_token_the_verifier_rules_out_adds_nothing_to_the_kl():
    """0 · log 0 = 0 in Eq. 6: a verifier logit of −inf (a hidden mask column) inside U_j leaves every term
    finite and equal to the hand values over the other tokens (it gave NaN before)."""
    p = [0.5, 0.3, 0.2, 0.0, 0.0]
    q = [0.3, 0.1, 0.1, 0.35, 0.15]
    v = logits_for(p)[None, None].float()                  # tokens 3 and 4: -inf
    d = logits_for(q)[None, None].float()
    for k, sup in ((2, [0, 1, 3]), (5, [0, 1, 2, 3, 4])):  # q's top-2 brings token 3 into U_j
        assert union_topk_support(v, d, k)[0, 0].nonzero().flatten().tolist() == sup
        pt = {x: p[x] / sum(p[y] for y in sup) for x in sup}
        qt = {x: q[x] / sum(q[y] for y in sup) for x in sup}
        kl = sum(pt[x] * math.log(pt[x] / qt[x]) for x in sup if pt[x] > 0)
        tv = 0.5 * sum(abs(pt[x] - qt[x]) for x in sup)
        dd = d.clone().requires_grad_(True)
        t = position_terms(dd, v, tau=TAU, top_k=k, eta=0.5)
        assert torch.isfinite(t.kl).all() and t.kl.item() == pytest.approx(kl, rel=1e-5)
        assert t.tv.item() == pytest.approx(tv, rel=1e-5)
        t.kl.sum().backward()
        assert torch.isfinite(dd.grad).all()


def test_ce_against_verifier_argmax_on_union_support():
    d, v = two_positions()
    t = position_terms(d, v, tau=TAU, top_k=2, ce_tau=1.0)
    # y_A = argmax p_A = 0, y_B = argmax p_B = 2; the drafter's tau=1 softmax is proportional to q^3
    assert t.ce[0, 0].item() == pytest.approx(hand_ce(Q_A, [0, 1, 2], 0), rel=1e-5)
    assert t.ce[0, 0].item() == pytest.approx(math.log(0.092 / 0.001), rel=1e-5)
    assert t.ce[0, 1].item() == pytest.approx(hand_ce(Q_B, [2, 3], 2), rel=1e-5)
    assert t.ce_valid.tolist() == [[1.0, 1.0]]


def test_ce_drop_rule_numerator_and_denominator():
    """A target outside U_j gives l_j = 0 and leaves the CE denominator (Eq. 7-8)."""
    d, v = two_positions()
    targets = torch.tensor([[4, 2]])                     # 4 is outside U_A = {0, 1, 2}
    t = position_terms(d, v, tau=TAU, top_k=2, targets=targets)
    assert t.ce[0, 0].item() == 0.0 and t.ce_valid[0].tolist() == [0.0, 1.0]
    active = torch.tensor([[True, True]])
    ce = get_loss("ce")(d, v, active, tau=TAU, top_k=2, targets=targets).item()
    assert ce == pytest.approx(hand_ce(Q_B, [2, 3], 2), rel=1e-5)          # 1 valid position, not 2
    # every active target outside U: zero loss, no division by zero
    ce0 = get_loss("ce")(d, v, torch.tensor([[True, False]]), tau=TAU, top_k=2, targets=targets)
    assert ce0.item() == 0.0


def test_active_mask_with_and_without_rejection():
    vocab = 6
    verifier_argmax = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    v = torch.nn.functional.one_hot(verifier_argmax, vocab).float()
    draft = torch.tensor([[1, 2, 0, 4],          # first rejection at slot 3 -> {1, 2, 3}
                          [1, 2, 3, 4],          # nothing rejected -> all k
                          [5, 2, 3, 4]])         # rejected at slot 1 -> {1}
    expected = [[True, True, True, False], [True, True, True, True], [True, False, False, False]]
    assert active_mask(draft, v).tolist() == expected
    bonus = torch.cat([v, torch.zeros(3, 1, vocab)], 1)             # (N, k + 1, V) form gives the same set
    assert active_mask(draft, bonus).tolist() == expected


def test_block_mean_averages_within_blocks_then_over_blocks():
    values = torch.tensor([[1.0, 3.0, 100.0], [4.0, 100.0, 100.0], [7.0, 7.0, 7.0]])
    w = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    # block 0: 2, block 1: 4, block 2 has no active position and is left out
    assert block_mean(values, w).item() == pytest.approx(3.0)
    assert block_mean(values, torch.zeros_like(w)).item() == 0.0


def _batch():
    """Two blocks of k = 2 (positions A, B and B, A), second block with only its first position active."""
    d, v = two_positions()
    d = torch.cat([d, d.flip(1)])
    v = torch.cat([v, v.flip(1)])
    active = torch.tensor([[True, True], [True, False]])
    return d, v, active


def test_every_registry_variant_against_hand_values():
    d, v, active = _batch()
    a, b = hand_terms(P_A, Q_A, [0, 1, 2]), hand_terms(P_B, Q_B, [2, 3])
    ce_a, ce_b = hand_ce(Q_A, [0, 1, 2], 0), hand_ce(Q_B, [2, 3], 2)

    def mean2(f):                    # block 1 = (A, B) both active, block 2 = (B) only
        return ((f(a) + f(b)) / 2 + f(b)) / 2

    expected = {
        "kl": mean2(lambda h: h["kl"]),
        "tv": mean2(lambda h: h["tv"]),
        "lk_alpha": mean2(lambda h: -math.log(h["alpha"])),
        "lk_hybrid": mean2(lambda h: h["lk"]),
        "ce": ((ce_a + ce_b) / 2 + ce_b) / 2,
    }
    expected["lk_hybrid_ce"] = expected["lk_hybrid"] + expected["ce"]
    assert set(LOSSES) == set(expected) and DEFAULT_LOSS == "lk_hybrid_ce"
    for name, value in expected.items():
        got = get_loss(name)(d, v, active, tau=TAU, top_k=2, eta=0.5)
        assert got.item() == pytest.approx(value, rel=1e-5), name
    weighted = get_loss("lk_hybrid_ce")(d, v, active, tau=TAU, top_k=2, lambda_kl=0.5, lambda_ce=2.0)
    assert weighted.item() == pytest.approx(0.5 * expected["lk_hybrid"] + 2 * expected["ce"], rel=1e-5)


def test_unknown_variant_and_hparam_errors_list_valid_names():
    with pytest.raises(ValueError, match="valid: kl, tv, ce, lk_alpha, lk_hybrid, lk_hybrid_ce"):
        get_loss("reverse_kl")
    d, v, active = _batch()
    with pytest.raises(ValueError, match="valid: tau"):
        get_loss("kl")(d, v, active, temperature=3.0)
    with pytest.raises(ValueError, match="vocab"):
        get_loss("kl")(d, v[:, :1], active)


def test_gradient_flows_only_into_the_drafter_and_lambda_is_stopped():
    d, v, active = _batch()
    d = d.clone().requires_grad_(True)
    v = v.clone().requires_grad_(True)
    get_loss("lk_hybrid_ce")(d, v, active, tau=TAU, top_k=2).backward()
    assert v.grad is None and d.grad is not None and d.grad.abs().sum() > 0
    # inactive position and tokens outside U_j get no gradient
    assert d.grad[1, 1].abs().sum() == 0
    assert d.grad[0, 0, 3:].abs().sum() == 0
    # sg[alpha] in lambda: grad of L_LK = lambda * grad KL + (1 - lambda) * grad TV with lambda constant
    d2 = d.detach().clone().requires_grad_(True)
    t = position_terms(d2, v, tau=TAU, top_k=2)
    lam = t.lam.detach()
    g_lk = torch.autograd.grad(t.lk_hybrid[0, 0], d2, retain_graph=True)[0]
    g_kl = torch.autograd.grad(t.kl[0, 0], d2, retain_graph=True)[0]
    g_tv = torch.autograd.grad(t.tv[0, 0], d2)[0]
    torch.testing.assert_close(g_lk, lam[0, 0] * g_kl + (1 - lam[0, 0]) * g_tv)


def test_identical_distributions_give_zero_distribution_loss():
    d, _, active = _batch()
    t = position_terms(d, d.clone(), tau=TAU, top_k=2)
    torch.testing.assert_close(t.alpha, torch.ones_like(t.alpha))
    for name in ("kl", "tv", "lk_alpha", "lk_hybrid"):
        assert combine(name, t, active).item() == pytest.approx(0.0, abs=1e-6)


def test_expected_accepted_length():
    alpha = torch.tensor([[0.5, 0.5, 1.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    # 0.5 + 0.25 + 0.25 ; k ; 0
    assert expected_accepted(alpha).tolist() == [1.0, 3.0, 0.0]
