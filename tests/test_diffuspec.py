"""DiffuSpec (diffuspec.txt): the Kneser–Ney proxy against nltk.lm, kenlm queries, CPS pruning (Eq. 6) and
beam search (Eq. 7) on hand-built lattices, ADL (Eq. 8–10) by hand, Proposition 4.1 (lossless at T = 0) on
tiny with each drafter, and bad input."""
import math
import random

import numpy as np
import pytest
import torch

from workbench.diffuspec.adl import ADLController, FixedLength
from workbench.diffuspec.cps import Lattice, cps_search, first_eos_length, prune_lattice
from workbench.diffuspec.ngram import ProxyError, build_proxy, kneser_ney, load_proxy, write_arpa


def _random_sequences(seed=1, vocab=12, n=60):
    rnd = random.Random(seed)
    return [[rnd.randrange(vocab) for _ in range(rnd.randint(5, 40))] for _ in range(n)]


def test_kneser_ney_equals_nltk():
    """Every seen trigram and bigram gets nltk's KneserNeyInterpolated probability (same counts, same D)."""
    nltk_lm = pytest.importorskip("nltk.lm")
    from nltk.util import everygrams

    seqs = _random_sequences()
    lm = nltk_lm.KneserNeyInterpolated(3, discount=0.75)
    lm.fit([list(everygrams([str(t) for t in s], max_len=3)) for s in seqs], [str(t) for s in seqs for t in s])
    m = kneser_ney(seqs, 0.75)
    assert len(m.tri) > 100 and len(m.bi) > 50
    tri_err = max(abs(p - lm.score(str(w), [str(a), str(b)])) for (a, b, w), p in zip(m.tri.tolist(), m.tri_p))
    bi_err = max(abs(p - lm.score(str(w), [str(b)])) for (b, w), p in zip(m.bi.tolist(), m.bi_p))
    assert tri_err < 1e-12 and bi_err < 1e-12
    # each context's distribution sums to 1 over the vocabulary
    assert sum(lm.score(str(w), ["3", "4"]) for w in range(12)) == pytest.approx(1.0)


def test_arpa_through_kenlm_equals_nltk(tmp_path):
    """The ARPA file read by kenlm scores every (a, b, w) as nltk does, seen or not (back-off = γ)."""
    nltk_lm = pytest.importorskip("nltk.lm")
    kenlm = pytest.importorskip("kenlm")
    from nltk.util import everygrams

    seqs = _random_sequences(seed=2)
    lm = nltk_lm.KneserNeyInterpolated(3, discount=0.5)
    lm.fit([list(everygrams([str(t) for t in s], max_len=3)) for s in seqs], [str(t) for s in seqs for t in s])
    write_arpa(kneser_ney(seqs, 0.5), tmp_path / "x.arpa.gz", 0.0)
    km = kenlm.Model(str(tmp_path / "x.arpa.gz"))
    worst, n = 0.0, 0
    for a in range(12):
        for b in range(12):
            st = kenlm.State()
            km.NullContextWrite(st)
            for t in (a, b):
                nxt = kenlm.State()
                km.BaseScore(st, str(t), nxt)
                st = nxt
            for w in range(12):
                want = lm.score(str(w), [str(a), str(b)])
                if want > 0:
                    worst = max(worst, abs(10 ** km.BaseScore(st, str(w), kenlm.State()) - want))
                    n += 1
    assert n > 1000 and worst < 1e-5           # ARPA stores 6 decimals of log10


def test_proxy_vocabulary_is_checked(tmp_path, tokenizer, ar_checkpoint):
    from transformers import AutoTokenizer

    seqs = [np.frombuffer(b"def f(x):\n    return x + 1\n" * 20, dtype=np.uint8).astype(np.int64)]
    out = build_proxy(seqs, tokenizer, tmp_path / "proxy")
    proxy = load_proxy(out, tokenizer)
    lp, st = proxy.score(proxy.state(list(b"return x")), ord(" "))
    assert -5 < lp < 0                                   # a seen continuation: a real probability
    lp_unseen, _ = proxy.score(st, 200)
    assert lp_unseen < lp - 5                            # a never-seen byte: the uniform floor
    other = AutoTokenizer.from_pretrained(ar_checkpoint)
    with pytest.raises(ProxyError, match="another vocabulary.*workbench diffuspec proxy"):
        load_proxy(out, other)
    with pytest.raises(ProxyError, match="no n-gram proxy.*workbench diffuspec proxy"):
        load_proxy(tmp_path / "missing", tokenizer)


def test_prune_lattice_mass_cap_and_eos():
    """Eq. 6: the smallest top-m reaching τ, capped at M_max; EOS always kept."""
    probs = torch.tensor([[0.7, 0.2, 0.05, 0.05, 0.0],       # τ = 0.8 -> {0, 1}, plus EOS (4)
                          [0.9, 0.04, 0.03, 0.02, 0.01],     # -> {0}, plus EOS
                          [0.3, 0.25, 0.2, 0.15, 0.1]])      # needs 4, capped at 3, plus EOS
    lat = prune_lattice(torch.log(probs.clamp_min(1e-30)), tau=0.8, m_max=3, eos_id=4)
    assert lat.ids == [[0, 1, 4], [0, 4], [0, 1, 2, 4]]
    assert lat.sizes == [3, 2, 4]
    assert lat.logp[1][1] == pytest.approx(math.log(0.01))
    with pytest.raises(ValueError, match="tau"):
        prune_lattice(torch.zeros(2, 5), tau=0.0)
    with pytest.raises(ValueError, match="m_max"):
        prune_lattice(torch.zeros(2, 5), m_max=0)


def test_cps_search_follows_eq7_by_hand():
    """Two positions; the drafter prefers (1, 1), the proxy forbids 1 after 1. Eq. 7 with λ = 0.5 by hand:
    S(1,1) = -5.39, S(1,2) = -1.55, S(2,1) = -1.33, S(2,2) = -1.75, so beam 2 finds (2, 1); beam 1 keeps
    token 1 at the first position (-0.60 > -0.81) and ends at (1, 2); with λ = 1 the drafter's argmax wins."""
    lat = Lattice(ids=[[1, 2], [1, 2]], logp=[[math.log(0.6), math.log(0.4)], [math.log(0.7), math.log(0.3)]])

    def proxy(state, tok):
        prev = state
        return (math.log(1e-4) if (prev, tok) == (1, 1) else math.log(0.5)), tok

    path, score = cps_search(lat, 0, proxy, beam=2, lam=0.5)
    assert path == [2, 1]
    want = 0.5 * (math.log(0.4) + math.log(0.7)) + 0.5 * (math.log(0.5) + math.log(0.5))
    assert score == pytest.approx(want)
    assert cps_search(lat, 0, proxy, beam=2, lam=1.0)[0] == [1, 1]
    assert cps_search(lat, 0, proxy, beam=1, lam=0.5)[0] == [1, 2]
    with pytest.raises(ValueError, match="beam"):
        cps_search(lat, 0, proxy, beam=0)


def test_cps_stops_at_first_eos():
    lat = Lattice(ids=[[5], [9, 7], [5]], logp=[[0.0], [math.log(0.9), math.log(0.1)], [0.0]])
    assert cps_search(lat, None, None, beam=3, eos_id=9)[0] == [5, 9]
    # an EOS that is not the best candidate at its depth ends no path: the full-length path wins although every
    # extra token lowers its raw score (−3.39 against the short path's −1.31)
    h = math.log(0.5)
    lat = Lattice(ids=[[1], [2, 9]] + [[3]] * 4, logp=[[math.log(0.9)], [math.log(0.6), math.log(0.3)]] + [[h]] * 4)
    path, score = cps_search(lat, None, None, beam=3, lam=1.0, eos_id=9)
    assert path == [1, 2, 3, 3, 3, 3] and score == pytest.approx(math.log(0.9) + math.log(0.6) + 4 * h)
    assert first_eos_length([3, 9, 4], 9) == 1 and first_eos_length([3, 4], 9) == 2


def test_adl_by_hand():
    """Eq. 9–10 with ρ = 0.5, δ = 4, k ∈ [4, 12], starting at k_max with zero EMAs."""
    c = ADLController(k_min=4, k_max=12, delta=4, rho=0.5)
    assert c.k == 12
    assert c.update(gen_len=12, accepted=2) == 6        # EMAs 6, 1 -> ceil(6) = 6
    assert c.update(gen_len=6, accepted=6) == 6         # EMAs 6, 3.5 -> 6 (acceptance lags: no growth)
    assert c.update(gen_len=2, accepted=9) == 8         # EMAs 4, 6.25 -> ceil(4 + 4) = 8
    assert c.update(gen_len=0, accepted=0) == 6         # EMAs 2, 3.125 -> ceil(2 + 4) = 6
    c = ADLController(k_min=4, k_max=12, delta=1, rho=1.0)
    assert c.update(gen_len=1, accepted=0) == 4          # ceil(1) = 1, clipped up to k_min
    assert c.update(gen_len=20, accepted=20) == 12       # ceil(21), clipped down to k_max
    with pytest.raises(ValueError, match="k_min"):
        ADLController(k_min=9, k_max=4)
    with pytest.raises(ValueError, match="rho"):
        ADLController(rho=0.0)
    assert FixedLength(5).update(1, 1) == 5


def test_diffuspec_is_ar_greedy_at_temperature_zero(tmp_path):
    """Proposition 4.1 on tiny: with either drafter and every ablation, the output equals AR greedy."""
    from workbench.assets import shipped_artefact
    from workbench.decoding.ar import ar_decode
    from workbench.deer.models import load_drafter
    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
    from workbench.model.load import load_model
    from workbench.tokenizer import encode_bytes

    model, tok, _ = load_model("tiny")
    text = "import os\n\n\ndef main(argv):\n    for name in argv:\n        print(name)\n"
    prompts = [encode_bytes(text).tolist(), encode_bytes("class A:\n    def __init__(self):\n").tolist()]
    ar = ar_decode(model, prompts, 40)
    proxy_dir = build_proxy([np.asarray(p) for p in prompts * 3], tok, tmp_path / "proxy")
    proxy = load_proxy(proxy_dir, tok)
    deer = load_drafter(str(shipped_artefact("tiny", "drafter")), model, tok)
    for drafter, kind in ((model, "trimode"), (deer, "deer")):
        for cps, adl in ((False, False), (True, False), (False, True), (True, True)):
            cfg = DiffuSpecConfig(cps=cps, adl=adl, k_fixed=6, k_min=2, k_max=8, delta=2)
            res = diffuspec_decode(model, drafter, prompts, 40, cfg, proxy=proxy, drafter_kind=kind,
                                   sep_id=getattr(drafter, "sep_token_id", None))
            assert res.tokens == ar.tokens, (kind, cps, adl)
            assert all(sum(s) == 40 for s in res.committed_per_step)
            assert all(a <= m for r in range(2) for a, m in zip(res.accepted[r], res.path_lengths[r]))
            if adl:
                assert all(2 <= k <= 8 for r in range(2) for k in res.draft_lengths[r][:-1])  # the last: what is left


def test_self_drafter_sharing_the_target_cache_drafts_the_same_with_fewer_forwards():
    """The self-drafter shares the target's KV cache (verified tokens and the next block in one forward): the
    drafts, accepted lengths and output equal those of a separate drafter cache (a copy of the same model), with
    one drafter forward per step instead of two (the verified tokens are no longer appended apart)."""
    import copy

    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
    from workbench.model.load import load_model
    from workbench.tokenizer import encode_bytes

    model, _, _ = load_model("tiny")
    twin = copy.deepcopy(model)                          # same weights, not the same object: its own cache
    prompts = [encode_bytes("import os\n\n\ndef main(argv):\n").tolist(), encode_bytes("class A:\n").tolist()]
    for steps in (1, 2):
        cfg = DiffuSpecConfig(cps=False, adl=True, k_min=2, k_max=8, delta=2, steps=steps)
        shared = diffuspec_decode(model, model, prompts, 40, cfg)
        apart = diffuspec_decode(model, twin, prompts, 40, cfg)
        assert shared.tokens == apart.tokens and shared.accepted == apart.accepted
        assert shared.path_lengths == apart.path_lengths and shared.extra_forwards == apart.extra_forwards
        n_steps = [len(a) for a in shared.accepted]
        # the separate cache appends the verified tokens in a forward of their own at every step
        assert [a - s for a, s in zip(apart.forwards, shared.forwards)] == n_steps


def test_diffuspec_bad_settings_are_one_line():
    from workbench.decoding.base import DecodeError
    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode

    for bad, msg in ((dict(k_min=9, k_max=3), "k_min"), (dict(tau=1.5), "tau"), (dict(beam=0), "beam"),
                     (dict(lam=2.0), "lambda")):
        with pytest.raises(DecodeError, match=msg):
            diffuspec_decode(None, None, [[1]], 4, DiffuSpecConfig(**bad))


def test_leaderboard_rows_for_diffuspec_and_simsd(tmp_path):
    """The new decoders plug into the leaderboard from their shipped artefacts (tiny's proxy and drafter):
    DiffuSpec's rows are lossless at T = 0, SimSD's row is compared with the serial target."""
    from workbench.leaderboard.config import LeaderboardConfig
    from workbench.leaderboard.run import run_leaderboard

    cfg = LeaderboardConfig(model="tiny", decoders=["diffuspec", "diffuspec_argmax", "simsd"], n_prompts=2,
                            gen_len=16, block_lengths=[8], thresholds=[0.9], sol=False, out_dir=str(tmp_path / "lb"),
                            progress_bar=False)
    df, _ = run_leaderboard(cfg)
    ok = df[df["status"] == "ok"]
    assert {"diffuspec", "diffuspec_argmax", "simsd"} <= set(ok["decoder"])
    assert ok[ok["decoder"].str.startswith("diffuspec")]["lossless"].all()
    simsd = ok[ok["decoder"] == "simsd"]
    assert set(simsd["mode"]) == {"real", "free"} and simsd["agree_serial"].notna().all()


def test_cli_bad_input_is_one_line(cli, tmp_path):
    r = cli("diffuspec", "eval", "--model", "tiny", "--k_min", "9", "--k_max", "3", "--out_dir", str(tmp_path / "a"))
    assert r.returncode != 0 and "k_min (9) must not exceed k_max (3)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("diffuspec", "eval", "--model", "tiny", "--proxy", str(tmp_path / "none"), "--out_dir", str(tmp_path / "b"))
    assert r.returncode != 0 and "workbench diffuspec proxy" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("diffuspec", "eval", "--model", "tiny", "--beam", "0", "--out_dir", str(tmp_path / "c"))
    assert r.returncode != 0 and "beam width must be >= 1" in r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_sampled_diffuspec_runs_p_over_q_with_the_paths_q(tmp_path):
    """T > 0 (App. H.3): acceptance uses q^L2R of the chosen path; the run is reproducible by seed and commits
    exactly gen_len tokens, never more than the path plus one per step."""
    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode
    from workbench.model.load import load_model
    from workbench.tokenizer import encode_bytes

    model, tok, _ = load_model("tiny")
    prompts = [encode_bytes("def main(argv):\n    for name in argv:\n").tolist()]
    cfg = DiffuSpecConfig(cps=False, adl=True, k_min=2, k_max=6, delta=2)
    a = diffuspec_decode(model, model, prompts, 32, cfg, temperature=1.0, seed=3)
    b = diffuspec_decode(model, model, prompts, 32, cfg, temperature=1.0, seed=3)
    assert a.tokens == b.tokens and len(a.tokens[0]) == 32
    assert all(c <= m + 1 for c, m in zip(a.committed_per_step[0], a.path_lengths[0]))


def test_a_sampled_correction_records_the_residual_q(monkeypatch, micro_model):
    """At T > 0 a rejected draft token is replaced by a draw from the residual norm((p − q)₊); the q DiffuSpec
    records for it (I-DLM §2's q_k, behind the leaderboard's α) is the residual's probability, not p's."""
    import workbench.diffuspec.decode as mod
    from workbench.diffuspec.decode import DiffuSpecConfig, diffuspec_decode

    seen, right = [], mod.speculative_accept

    def spy(draft, q, p, g):
        out = right(draft, q, p, g)
        a = int(out.accepted[0])
        if a < draft.shape[1]:
            seen.append((float(out.next_prob[0]), float(p[0, a, int(out.next_token[0])])))
        return out

    monkeypatch.setattr(mod, "speculative_accept", spy)
    res = diffuspec_decode(micro_model, micro_model, [[5, 12, 1, 9, 33, 7]], 24,
                           DiffuSpecConfig(cps=False, adl=False, k_fixed=3), temperature=1.0, seed=2)
    assert len(seen) >= 2
    recorded = res.token_probs[0]
    for resid_q, p in seen:
        assert any(abs(q - resid_q) < 1e-6 for q in recorded)
        assert abs(resid_q - p) > 1e-4
        assert not any(abs(q - p) < 1e-6 for q in recorded)       # p's probability is recorded nowhere
