"""Acceptance rules: greedy verification and the speculative-sampling rule (DEER Eq. 5–6)."""
import pytest
import torch

from workbench.speculative import greedy_accept, speculative_accept


def test_greedy_accept_longest_prefix_then_verifier_token():
    v = torch.full((3, 4, 5), -5.0)
    # verifier argmax per slot: row0 = [1, 2, 3, 4], row1 = [0, 0, 0, 0], row2 = [1, 2, 3, 2]
    for r, arg in enumerate([[1, 2, 3, 4], [0, 0, 0, 0], [1, 2, 3, 2]]):
        for j, a in enumerate(arg):
            v[r, j, a] = 5.0
    draft = torch.tensor([[1, 2, 0], [1, 0, 0], [1, 2, 3]])
    res = greedy_accept(draft, v)
    assert res.accepted.tolist() == [2, 0, 3]
    assert res.next_token.tolist() == [3, 0, 2]          # correction, correction, bonus
    assert res.emitted(draft) == [[1, 2, 3], [0], [1, 2, 3, 2]]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="k \\+ 1"):
        greedy_accept(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 5))


def _first_token_hist(p, q, trials=200_000, seed=0):
    """Empirical distribution of the first emitted token with k = 1 draft drawn from q."""
    g = torch.Generator().manual_seed(seed)
    qn = torch.tensor(q).expand(trials, 1, -1)
    pn = torch.tensor(p).expand(trials, 2, -1)
    draft = torch.multinomial(qn[:, 0], 1, generator=g)
    res = speculative_accept(draft, qn, pn, generator=g)
    first = torch.where(res.accepted > 0, draft[:, 0], res.next_token)
    return torch.bincount(first, minlength=len(p)).double() / trials, res


def test_speculative_rule_matches_target_distribution():
    p, q = [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]
    hist, res = _first_token_hist(p, q)
    assert torch.allclose(hist, torch.tensor(p, dtype=torch.double), atol=0.005)
    # acceptance probability = sum_x min(p, q) = 0.1 + 0.1 + 0.2
    assert abs(res.accepted.double().mean().item() - 0.4) < 0.005


def test_next_prob_is_the_probability_under_the_distribution_the_token_came_from():
    """After a rejection the correction is drawn from norm(max(0, p − q)); after full acceptance the bonus from
    p_{k+1}. ``next_prob`` is that distribution's probability of the token (I-DLM §2's q_k(x_k))."""
    p, q = [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]
    _, res = _first_token_hist(p, q, trials=2000)
    residual = torch.tensor([0.4, 0.2, 0.0]) / 0.6                      # max(0, p − q), normalised
    rej = res.accepted == 0
    assert rej.any() and (~rej).any()
    torch.testing.assert_close(res.next_prob[rej], residual[res.next_token[rej]])
    torch.testing.assert_close(res.next_prob[~rej], torch.tensor(p)[res.next_token[~rej]])
    assert greedy_accept(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 2, 3)).next_prob is None


def test_relaxed_acceptance_multiplies_the_ratio_by_one_plus_tau():
    """I-DLM §4.3: accept with probability min(1, (1 + τ) p/q); for one draft from q the acceptance rate is
    Σ_x min(q, (1 + τ) p) = 0.1 + 0.1 + 0.4 at τ = 1 (0.4 at τ = 0)."""
    p, q = [0.5, 0.3, 0.2], [0.1, 0.1, 0.8]
    g = torch.Generator().manual_seed(0)
    qn, pn = torch.tensor(q).expand(200_000, 1, -1), torch.tensor(p).expand(200_000, 2, -1)
    draft = torch.multinomial(qn[:, 0], 1, generator=g)
    res = speculative_accept(draft, qn, pn, generator=g, relax=1.0)
    assert abs(res.accepted.double().mean().item() - 0.6) < 0.005
    with pytest.raises(ValueError, match="≥ 0"):
        speculative_accept(draft, qn, pn, relax=-0.1)


def test_speculative_rule_identical_distributions_always_accept():
    p = [0.25, 0.25, 0.5]
    hist, res = _first_token_hist(p, p, trials=20_000)
    assert bool((res.accepted == 1).all())
    assert torch.allclose(hist, torch.tensor(p, dtype=torch.double), atol=0.02)


def test_speculative_rule_matches_target_at_every_slot_of_a_long_draft():
    """k = 3 drafts with a different (p_j, q_j) per slot and a token q_1 never proposes: among rows that
    reach slot j, the token emitted there (accepted draft, residual resample or bonus) follows p_j, and
    the mean accepted length is Σ_j Π_{i≤j} Σ_x min(p_i, q_i)."""
    v, k, n = 5, 3, 200_000
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(k + 1, v) * 1.5, -1)
    q = torch.softmax(torch.randn(k, v) * 1.5, -1)
    q[0, 2] = 0.0
    q[0] /= q[0].sum()
    pn, qn = p.expand(n, -1, -1).contiguous(), q.expand(n, -1, -1).contiguous()
    draft = torch.multinomial(qn.reshape(-1, v), 1, generator=g).view(n, k)
    res = speculative_accept(draft, qn, pn, generator=g)
    emitted = torch.cat([draft, torch.zeros(n, 1, dtype=torch.long)], 1)
    emitted[torch.arange(n), res.accepted] = res.next_token
    for j in range(k + 1):
        reach = res.accepted >= j
        hist = torch.bincount(emitted[reach, j], minlength=v).double() / reach.sum()
        assert torch.allclose(hist, p[j].double(), atol=0.01), (j, hist, p[j])
    expected = torch.cumprod(torch.minimum(p[:k], q).sum(-1), 0).sum().item()
    assert abs(res.accepted.double().mean().item() - expected) < 0.01
