"""The shared sampling distribution (temperature, top-k, top-p; I-DLM Table 8) and its use by every sampled decoder."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from workbench.decoding.ar import ar_decode
from workbench.decoding.base import DecodeError
from workbench.decoding.sampling import check_sampling, sampling_probs, warp_logits
from workbench.deer.decode import deer_decode
from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
from workbench.evaluation.metrics import ar_token_logprobs
from workbench.idlm.isd import isd_decode
from workbench.model.presets import preset_config
from workbench.model.trimode import TriModeLM
from workbench.simsd.decode import simsd_decode
from workbench.speculative.linear import linear_self_speculation
from workbench.speculative.quadratic import quadratic_self_speculation
from workbench.tokenizer import EOS_ID, MASK_ID

from small_models import peaked_model

LOGP = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()


def _probs(**kw) -> list[float]:
    return [round(x, 6) for x in sampling_probs(LOGP, 1.0, **kw).tolist()]


# ---------------------------------------------------------------- the warp, by hand

def test_top_k_keeps_the_k_most_likely_and_renormalises():
    assert _probs(top_k=2) == [0.625, 0.375, 0.0, 0.0]
    assert _probs(top_k=1) == [1.0, 0.0, 0.0, 0.0]
    assert _probs(top_k=4) == _probs() == [0.5, 0.3, 0.15, 0.05]
    assert _probs(top_k=10) == _probs()                       # k beyond the vocabulary: no filter


def test_top_k_keeps_ties_at_the_kth_value():
    z = torch.tensor([1.0, 1.0, 1.0, 0.0])
    p = sampling_probs(z, 1.0, top_k=2)
    assert p[:3].tolist() == pytest.approx([1 / 3] * 3) and p[3] == 0


def test_top_p_keeps_the_smallest_set_reaching_p():
    # cumulative mass of the tokens ranked above each: 0, 0.5, 0.8, 0.95
    assert _probs(top_p=0.5) == [1.0, 0.0, 0.0, 0.0]          # {0} already holds 0.5
    assert _probs(top_p=0.51) == [0.625, 0.375, 0.0, 0.0]
    assert _probs(top_p=0.8) == [0.625, 0.375, 0.0, 0.0]      # {0, 1} holds exactly 0.8
    assert _probs(top_p=0.81) == [round(x / 0.95, 6) for x in (0.5, 0.3, 0.15)] + [0.0]
    assert _probs(top_p=0.01) == [1.0, 0.0, 0.0, 0.0]         # the most likely token is always kept


def test_order_is_temperature_then_top_k_then_top_p():
    z = torch.tensor([2.0, 1.0, 0.0, -1.0])
    # T = 2: probabilities ∝ e^1, e^0.5, e^0, e^-0.5; top-k 3 drops the last; top-p 0.75 on the renormalised three
    e = torch.tensor([math.e, math.e ** 0.5, 1.0])
    three = e / e.sum()                                        # 0.506, 0.307, 0.186: {0, 1} reaches 0.75
    assert three[0] < 0.75 < three[0] + three[1]
    want = torch.tensor([three[0], three[1], 0.0, 0.0]) / (three[0] + three[1])
    assert torch.allclose(sampling_probs(z, 2.0, top_k=3, top_p=0.75), want)
    # top-p before top-k would keep three: on the unfiltered distribution {0, 1} holds only 0.731
    assert int((sampling_probs(z, 2.0, top_p=0.75) > 0).sum()) == 3


def test_greedy_temperature_is_the_plain_softmax_and_batches_are_row_wise():
    assert torch.equal(warp_logits(LOGP, 0.0, top_k=1, top_p=0.1), LOGP.float())
    z = torch.stack([LOGP, LOGP.flip(0)])[None]               # (1, 2, 4)
    p = sampling_probs(z, 1.0, top_k=2)
    assert p[0, 0].tolist() == pytest.approx([0.625, 0.375, 0, 0])
    assert p[0, 1].tolist() == pytest.approx([0, 0, 0.375, 0.625])
    forbidden = LOGP.clone()
    forbidden[0] = float("-inf")                               # a forbidden token stays forbidden
    assert sampling_probs(forbidden, 1.0, top_p=0.9)[0] == 0


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0),
                                 dict(top_p=1.2), dict(temperature=float("nan"))])
def test_check_sampling_refuses_out_of_range_settings(bad):
    kw = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **bad}
    with pytest.raises(DecodeError, match=next(iter(bad))):
        check_sampling(**kw)


# ---------------------------------------------------------------- decoders

def _micro(seed: int) -> TriModeLM:
    torch.manual_seed(seed)
    return TriModeLM(LlamaForCausalLM(preset_config("micro")).eval(), MASK_ID)


PROMPTS = [[5, 12, 1, 9, 33, 7], [70, 71, 72]]


def _decoders(drafter=None, pad: int = EOS_ID, sep: int | None = None):
    """name → decode(model, prompts, gen_len, **sampling) of every sampled decoder (DEER's drafter: ``drafter``,
    default a second micro model; ``pad`` / ``sep``: padding and DEER separator ids)."""
    drafter = _micro(1) if drafter is None else drafter
    deer_sep = {} if sep is None else {"sep_id": sep}
    return {
        "ar": lambda m, p, n, **kw: ar_decode(m, p, n, pad_id=pad, **kw),
        "ss_linear": lambda m, p, n, **kw: linear_self_speculation(m, p, n, draft_length=3, pad_id=pad, **kw),
        "ss_quadratic": lambda m, p, n, **kw: quadratic_self_speculation(m, p, n, draft_length=3, pad_id=pad, **kw),
        "isd": lambda m, p, n, **kw: isd_decode(m, p, n, stride=3, pad_id=pad, **kw),
        "isd_sample": lambda m, p, n, **kw: isd_decode(m, p, n, stride=3, proposal="sample", pad_id=pad, **kw),
        "deer": lambda m, p, n, **kw: deer_decode(m, drafter, p, n, draft_length=3, pad_id=pad, **deer_sep, **kw),
        "simsd": lambda m, p, n, **kw: simsd_decode(m, m, p, n, block_length=4, **kw),
        "diffuspec": lambda m, p, n, **kw: diffuspec_decode(m, m, p, n, DiffuSpecConfig(cps=False, adl=False,
                                                                                        k_fixed=3), **kw),
    }


@pytest.mark.parametrize("name", ["ar", "ss_linear", "ss_quadratic", "isd_sample", "deer", "simsd", "diffuspec"])
def test_top_k_one_sampling_is_greedy_decoding(name):
    """Top-k 1 leaves one token in the drafter's q and the verifier's p alike, so sampling at T = 1 reproduces
    the decoder's greedy output token for token; a decoder that dropped the filter anywhere would sample from
    a near-uniform random model and part from it at once. Unfiltered sampling does part (the control). (ISD's
    argmax proposals follow the I-DLM engine, which verifies them against the unfiltered p and q: not greedy at
    top-k 1, so ISD is checked with sampled proposals.)"""
    model, decode = _micro(0), _decoders()[name]
    greedy = decode(model, PROMPTS, 16).tokens
    assert decode(model, PROMPTS, 16, temperature=1.0, top_k=1, seed=3).tokens == greedy
    assert decode(model, PROMPTS, 16, temperature=1.0, seed=3).tokens != greedy


@pytest.mark.parametrize("name", ["ar", "ss_linear", "ss_quadratic", "isd", "deer", "simsd", "diffuspec"])
def test_decoders_refuse_a_bad_filter_before_decoding(name):
    with pytest.raises(DecodeError, match="top_p"):
        _decoders()[name](_micro(0), PROMPTS, 8, temperature=1.0, top_p=1.5)


# ---------------------------------------------------------------- exact distributions

def _peaked_model(seed: int = 0) -> TriModeLM:
    """1-layer Llama, 6 tokens + [MASK] (id 6), peaked distributions (LM head × 4)."""
    return peaked_model(4.0, seed)


def _exact(model, prompt, length, **warp) -> np.ndarray:
    """Probability of every continuation of ``length`` tokens under AR sampling with ``warp``."""
    seqs = torch.tensor(list(itertools.product(range(7), repeat=length)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        p = sampling_probs(model.causal_logits(ids), 1.0, **warp)
    n = len(prompt)
    prob = math.prod(p[:, n - 1 + t].gather(1, seqs[:, t:t + 1]).squeeze(1).double() for t in range(length))
    return prob.numpy()


def _tv(tokens, exact: np.ndarray, length: int) -> float:
    idx = (np.asarray(tokens) * (7 ** np.arange(length)[::-1])).sum(1)
    return 0.5 * float(np.abs(np.bincount(idx, minlength=7 ** length) / len(tokens) - exact).sum())


@pytest.mark.parametrize("name", ["ar", "ss_linear", "ss_quadratic", "isd_sample", "deer"])
def test_filtered_sampling_matches_the_filtered_ar_distribution(name):
    """With top-k 3 and top-p 0.8 the whole 3-token continuations follow AR sampling under the same filters:
    total variation within the 99.9 % quantile of that of exact draws. The unfiltered AR distribution is far
    outside the bound (the filters bite), and no continuation outside the filters is ever emitted."""
    model, prompt, length, n = _peaked_model(), [1, 2, 3], 3, 12000
    warp = {"top_k": 3, "top_p": 0.8}
    exact, plain = _exact(model, prompt, length, **warp), _exact(model, prompt, length)
    assert exact.sum() == pytest.approx(1.0, abs=1e-6) and (exact == 0).sum() > (plain == 0).sum()
    rng = np.random.default_rng(0)
    bound = float(np.quantile([0.5 * np.abs(rng.multinomial(n, exact / exact.sum()) / n - exact).sum()
                               for _ in range(1000)], 0.999))
    decoders = _decoders(drafter=_peaked_model(1), pad=0, sep=5)          # DEER: a second peaked model drafts
    tokens = decoders[name](model, [prompt] * n, length, temperature=1.0, seed=3, **warp).tokens
    assert _tv(tokens, exact, length) < bound
    assert _tv(tokens, plain, length) > 3 * bound
    idx = (np.asarray(tokens) * (7 ** np.arange(length)[::-1])).sum(1)
    assert exact[idx].min() > 0


def test_ar_token_logprobs_applies_the_filters():
    """The target's log p under the same filters (the introspective acceptance's p): tokens sampled with top-k 2
    all have a finite log p under top-k 2, and the log p of the kept tokens is renormalised."""
    model = _micro(0)
    res = ar_decode(model, PROMPTS, 12, temperature=1.0, top_k=2, seed=1, pad_id=EOS_ID)
    filtered = ar_token_logprobs(model, PROMPTS, res.tokens, pad_id=EOS_ID, temperature=1.0, top_k=2)
    plain = ar_token_logprobs(model, PROMPTS, res.tokens, pad_id=EOS_ID, temperature=1.0)
    assert all(math.isfinite(x) for row in filtered for x in row)
    assert all(f > p for fr, pr in zip(filtered, plain) for f, p in zip(fr, pr))   # renormalised over two
    # the decoder's own q of each token is the filtered p (AR sampling draws from exactly that distribution)
    assert np.allclose(np.log(np.concatenate(res.token_probs)), np.concatenate(filtered), atol=1e-4)
    other = ar_decode(model, PROMPTS, 12, temperature=3.0, seed=1, pad_id=EOS_ID)
    outside = ar_token_logprobs(model, PROMPTS, other.tokens, pad_id=EOS_ID, temperature=1.0, top_k=2)
    assert any(x == float("-inf") for row in outside for x in row)


@pytest.mark.parametrize("name", ["simsd", "diffuspec"])
def test_simsd_and_diffuspec_filter_the_distributions_they_compare(name, monkeypatch):
    """With top-k 2 every verifier p SimSD and DiffuSpec hand to the acceptance rule has at most two tokens, and so
    has SimSD's drafter q (its drafts are drawn from q). DiffuSpec's q^L2R stays unfiltered: its drafts (argmax or
    the CPS path) are not drawn from q, and a filtered q could be 0 at a drafted token."""
    import workbench.diffuspec.decode as diffuspec_mod
    import workbench.simsd.decode as simsd_mod

    mod = simsd_mod if name == "simsd" else diffuspec_mod
    right, seen = mod.speculative_accept, []

    def spy(draft, q, p, g, *rest):
        seen.append((q.clone(), p.clone()))
        return right(draft, q, p, g, *rest)

    monkeypatch.setattr(mod, "speculative_accept", spy)
    _decoders()[name](_micro(0), PROMPTS, 16, temperature=1.0, top_k=2, seed=3)
    assert seen
    assert all(int((p > 0).sum(-1).max()) <= 2 for _, p in seen)
    q_support = max(int((q > 0).sum(-1).max()) for q, _ in seen)
    assert q_support <= 2 if name == "simsd" else q_support > 2


def test_command_configs_refuse_bad_filters_in_one_line():
    """`speculate`, `deer eval` and `leaderboard` check the filters with their other options, before loading a
    model."""
    from workbench.deer.evaluate import DeerEvalConfig
    from workbench.leaderboard.config import LeaderboardConfig
    from workbench.speculative.cli import SpeculateConfig

    for cfg in (SpeculateConfig(temperature=1.0, top_p=1.5), DeerEvalConfig(temperature=1.0, top_p=1.5),
                LeaderboardConfig(top_p=1.5)):
        with pytest.raises(DecodeError, match=r"top_p must be in \(0, 1\]"):
            cfg.validate()
    with pytest.raises(DecodeError, match="top_k"):
        SpeculateConfig(top_k=-1).validate()
