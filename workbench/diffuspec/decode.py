"""DiffuSpec decoding (arXiv:2510.02358 Algorithm 1): a diffusion drafter proposes a block in one forward, CPS
picks a causal path through its lattice, the AR target verifies it, and ADL sets the next draft length.

Per speculative step t, for one prompt (the paper runs batch size 1; ADL's state is per instance):

1. **Draft.** The drafter reads the verified prefix and a block of k_t masks (:class:`BlockDrafter`) and
   returns per-position log-probabilities ``(k_t, vocab)``; S > 1 refinement steps commit the most confident
   positions (Eq. 4) and re-run on the rest; a position keeps the distribution of the pass that decided it.
   (Eq. 5's q^L2R has every in-block slot masked, and §4.2 takes ℓ^dlm "from the final DLM pass": with S > 1
   the lattice and the T > 0 acceptance ratio here use each position's deciding pass instead, a deviation; at
   the default S = 1 the three coincide.)
2. **CPS** (:mod:`workbench.diffuspec.cps`) picks a path of length m_t ≤ k_t (or the argmax block when CPS
   is off, stopped after its first EOS).
3. **Verify.** The target reads ``[pending, path]`` through its KV cache (one forward; a self-drafter shares that
   cache and has already appended the pending tokens, so the target reads only the path). At temperature 0 the
   longest prefix that equals its greedy tokens is accepted and its next greedy token emitted
   (Proposition 4.1: the output is AR greedy exactly). At T > 0 the min(1, p/q) rule with residual resampling
   uses q^L2R (Eq. 5: every in-block position masked), which with S = 1 is the drafter's one-pass distribution
   at that position; CPS picks tokens by search rather than by sampling from q, so this regime is DiffuSpec's
   heuristic extension (App. H.3), not exact speculative sampling.
4. **ADL** (:mod:`workbench.diffuspec.adl`) updates k_{t+1} from L^gen (first EOS of the raw argmax draft) and
   L^acc (accepted draft tokens).

Decoding stops at ``gen_len`` tokens or after an accepted (or emitted) EOS. Rejected tokens are cropped from the
target's cache. Forward counts per row: ``forwards`` = drafter forwards (two per step for a tri-mode drafter,
whose verified tokens are appended by a separate causal forward; one for a DEER drafter), ``extra_forwards`` =
target forwards (one per step).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

import torch

from ..decoding.base import DecodeError, DecodeResult, autocast_for, check_lengths
from ..decoding.sampling import NO_TOP_K, NO_TOP_P, check_sampling, sampling_probs
from ..speculative import greedy_accept, speculative_accept
from ..deer.block_drafter import BlockDrafter
from .adl import ADLController, FixedLength
from .cps import check_cps_args, cps_search, first_eos_length, prune_lattice


@dataclass
class SearchKnobs:
    """CPS's and ADL's knobs (defaults: the paper's implementation details, §5, except ADL's k_min, k_max and δ:
    the paper's 20 / 30 / 10 are for Qwen/Dream tokenizers and 7–8 B models; ours are the best of a 12-trial
    ``workbench diffuspec tune`` on SmolLM2-135M-trimode, k_min 5, k_max 10, δ 6.8, rounded)."""

    k_min: int = 5
    """ADL lower guardrail (tokens)."""
    k_max: int = 10
    """ADL upper guardrail and first draft length (tokens)."""
    delta: float = 7.0
    """ADL growth increment δ (tokens)."""
    rho: float = 0.5
    """ADL EMA smoothing ρ."""
    tau: float = 0.8
    """CPS cumulative-mass threshold τ (Eq. 6)."""
    m_max: int = 15
    """CPS per-position cap M_max."""
    beam: int = 3
    """CPS beam width B."""
    lam: float = 0.5
    """λ of Eq. 7: weight of the drafter's log-probability against the causal proxy's."""

    def knobs(self) -> dict:
        """These fields as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in fields(SearchKnobs)}


@dataclass
class DiffuSpecConfig(SearchKnobs):
    """One DiffuSpec method: which components run, and their knobs (:class:`SearchKnobs`)."""

    cps: bool = True
    """Causal-consistency path search (False: the drafter's argmax block, cut after its first EOS)."""
    adl: bool = True
    """Adaptive draft length (False: a fixed length k_fixed)."""
    k_fixed: int = 8
    """Draft length without ADL (tokens)."""
    steps: int = 1
    """Diffusion refinement steps S of the drafter (Eq. 4)."""

    def validate(self) -> None:
        """Raise ``ValueError`` with a one-line reason for a bad setting."""
        check_cps_args(self.tau, self.m_max, self.beam, self.lam)
        if self.adl:
            ADLController(self.k_min, self.k_max, self.delta, self.rho)
        else:
            FixedLength(self.k_fixed)
        if self.steps < 1:
            raise ValueError(f"refinement steps must be >= 1, got {self.steps}")

    def controller(self):
        """A fresh draft-length controller (one per prompt)."""
        return ADLController(self.k_min, self.k_max, self.delta, self.rho) if self.adl else FixedLength(self.k_fixed)

    @property
    def longest(self) -> int:
        """The longest draft this configuration can ask for (tokens)."""
        return self.k_max if self.adl else self.k_fixed


@dataclass
class DiffuSpecResult(DecodeResult):
    """:class:`~workbench.decoding.base.DecodeResult` plus DiffuSpec's per-step bookkeeping (per row).

    Attributes:
        accepted: draft tokens accepted per step (L^acc; the verifier's bonus/correction token not counted).
        draft_lengths: k_t per step. path_lengths: m_t per step (CPS path, ≤ k_t). gen_lengths: L^gen per step.
        draft_seconds, cps_seconds, verify_seconds: wall time in each stage (all rows).
        drafter_params, target_params: parameter counts (for cost-weighted TPF).
    """

    accepted: list[list[int]] = field(default_factory=list)
    draft_lengths: list[list[int]] = field(default_factory=list)
    path_lengths: list[list[int]] = field(default_factory=list)
    gen_lengths: list[list[int]] = field(default_factory=list)
    draft_seconds: float = 0.0
    cps_seconds: float = 0.0
    verify_seconds: float = 0.0
    drafter_params: int = 0
    target_params: int = 0

    def mat(self, row: int) -> float:
        """Mean accepted draft tokens per step (MAT, the bonus token not counted)."""
        a = self.accepted[row]
        return sum(a) / max(1, len(a))


def _params(model) -> int:
    return sum(p.numel() for p in model.backbone.parameters())


@torch.no_grad()
def diffuspec_decode(target, drafter, prompts: list[list[int]], gen_len: int, cfg: DiffuSpecConfig | None = None,
                     proxy=None, temperature: float = 0.0, eos_id: int | None = None, drafter_kind: str = "trimode",
                     sep_id: int | None = None, precision: str = "fp32", seed: int = 0, top_k: int = NO_TOP_K,
                     top_p: float = NO_TOP_P) -> DiffuSpecResult:
    """Generate up to ``gen_len`` tokens per prompt with DiffuSpec (Algorithm 1), one prompt at a time.

    Args:
        target: the AR verifier (a TriModeLM used through ``extend``: AR mode).
        drafter: the diffusion drafter (TriModeLM; ``drafter_kind`` 'trimode' or 'deer'); may be ``target``
            itself for a tri-mode model (its diffusion mode drafts, its AR mode verifies).
        prompts: token-id lists. gen_len: tokens per prompt (fewer when EOS is emitted).
        cfg: :class:`DiffuSpecConfig` (default: the defaults). proxy: an :class:`~workbench.diffuspec.ngram.
            NgramProxy` for CPS (None with CPS on: λ = 1, the drafter's score alone).
        temperature: 0 → greedy verification (lossless); > 0 → p/q rejection with q^L2R.
        eos_id: stop after this token. sep_id: a DEER drafter's separator. precision: 'fp32' or 'bf16'.
        seed: RNG seed of the T > 0 acceptance draws.
        top_k, top_p: sampling filters of the target's ``p`` (0 / 1 = off; ignored at temperature 0), see
            :func:`~workbench.decoding.sampling.sampling_probs`. ``q^L2R`` stays unfiltered: DiffuSpec's drafts are
            not drawn from it (App. H: at T > 0 the rule is a heuristic, not lossless).

    Returns :class:`DiffuSpecResult`. Raises :class:`~workbench.decoding.base.DecodeError` for bad lengths or
    settings (a negative temperature, an out-of-range ``top_k`` / ``top_p``), or a vocabulary-size mismatch between drafter and target.
    """
    cfg = cfg or DiffuSpecConfig()
    try:
        cfg.validate()
    except ValueError as e:
        raise DecodeError(str(e)) from None
    check_sampling(temperature, top_k, top_p)
    vt, vd = target.vocab_size, drafter.vocab_size
    if vt != vd:
        raise DecodeError(f"drafter and target vocabularies differ ({vd} vs {vt} logits); use a drafter of the "
                          "target's tokenizer")
    check_lengths(target, prompts, gen_len + cfg.longest + 1)
    dev = target.device
    g = torch.Generator(device=dev).manual_seed(seed)
    n0 = len(prompts)
    res = DiffuSpecResult(tokens=[[] for _ in range(n0)], forwards=[0] * n0, extra_forwards=[0] * n0,
                          committed_per_step=[[] for _ in range(n0)], step_tokens=[[] for _ in range(n0)],
                          accepted=[[] for _ in range(n0)], draft_lengths=[[] for _ in range(n0)],
                          path_lengths=[[] for _ in range(n0)], gen_lengths=[[] for _ in range(n0)],
                          token_probs=[[] for _ in range(n0)],
                          drafter_params=_params(drafter), target_params=_params(target))
    # a self-drafter (the target's own diffusion mode) shares the target's cache: 2 forwards per step
    shared = drafter is target and drafter_kind == "trimode"
    t_start = time.perf_counter()
    with autocast_for(dev, precision):
        for row, prompt in enumerate(prompts):
            cache = target.new_cache()
            block_drafter = BlockDrafter(drafter, drafter_kind, sep_id, cache=cache if shared else None)
            _decode_one(target, block_drafter, cache, list(prompt), gen_len, cfg, proxy, temperature, eos_id, g,
                        res, row, {"top_k": top_k, "top_p": top_p})
    res.wall_time = time.perf_counter() - t_start
    return res


def _decode_one(target, drafter: BlockDrafter, cache, prompt: list[int], gen_len: int, cfg: DiffuSpecConfig,
                proxy, temperature: float, eos_id: int | None, g: torch.Generator, res: DiffuSpecResult,
                row: int, warp: dict) -> None:
    dev = target.device
    ctrl = cfg.controller()
    verified = list(prompt)           # the prefix the drafter has seen (prompt + emitted tokens)
    pending = list(prompt)            # tokens the target's cache still lacks
    out: list[int] = []
    while len(out) < gen_len:
        k = min(ctrl.k, gen_len - len(out))
        t0 = time.perf_counter()
        calls = drafter.calls
        logp = drafter.propose(verified, k, cfg.steps)                       # (k, V)
        res.forwards[row] += drafter.calls - calls
        t1 = time.perf_counter()
        raw = logp.argmax(-1).tolist()
        gen = first_eos_length(raw, eos_id)
        if cfg.cps:
            lat = prune_lattice(logp, cfg.tau, cfg.m_max, eos_id)
            state = proxy.state(verified) if proxy is not None else None
            path, _ = cps_search(lat, state, proxy.score if proxy is not None else None, cfg.beam,
                                 cfg.lam if proxy is not None else 1.0, eos_id)
        else:
            path = raw[:gen + 1] if gen < len(raw) else raw
        t2 = time.perf_counter()
        draft = torch.tensor([path], dtype=torch.long, device=dev)
        m = len(path)
        n_cache = cache.get_seq_length()
        if drafter.shared:                  # the verified tokens are cached already, with their AR logits
            d_logits = target.extend(draft, cache, torch.ones((1, n_cache + m), dtype=torch.bool, device=dev))
            v_logits = torch.cat([drafter.last_ar_logits[None, None].to(d_logits.dtype), d_logits], 1)
        else:
            ids = torch.tensor([pending], dtype=torch.long, device=dev)
            w = ids.shape[1]
            v_logits = target.extend(torch.cat([ids, draft], 1), cache,
                                     torch.ones((1, n_cache + w + m), dtype=torch.bool, device=dev))[:, w - 1:]
        if temperature <= 0:
            acc = greedy_accept(draft, v_logits)
        else:
            # q^L2R (Eq. 5), S = 1, at the temperature but unfiltered: the drafts (argmax or the CPS path) are not
            # drawn from q, so a filtered q could be 0 at a drafted token and accept it unconditionally
            q = sampling_probs(logp[:m], temperature)
            acc = speculative_accept(draft, q[None], sampling_probs(v_logits, temperature, **warp), g)
        a, nxt = int(acc.accepted[0]), int(acc.next_token[0])
        if m - a:
            cache.crop(-(m - a))
        res.extra_forwards[row] += 1
        t3 = time.perf_counter()
        take = (path[:a] + [nxt])[:gen_len - len(out)]
        if eos_id is not None and eos_id in take:
            take = take[:take.index(eos_id) + 1]
        # q_k(x_k) (I-DLM §2): the drafter's probability of each accepted token, the verifier's of its own token
        # (greedy picks: the T = 1 distribution; a resampled correction: the residual it was drawn from)
        q_draft = sampling_probs(logp[:a], temperature).gather(
            1, torch.tensor(path[:a], device=logp.device)[:, None])[:, 0]
        q_next = (acc.next_prob[0] if acc.next_prob is not None
                  else sampling_probs(v_logits[0, a], temperature, **warp)[nxt])
        res.token_probs[row] += (q_draft.tolist() + [float(q_next)])[:len(take)]
        out += take
        verified += take
        pending = [nxt]
        res.accepted[row].append(a)
        res.draft_lengths[row].append(k)
        res.path_lengths[row].append(m)
        res.gen_lengths[row].append(gen)
        res.committed_per_step[row].append(len(take))
        res.step_tokens[row].append(take)
        res.draft_seconds += t1 - t0
        res.cps_seconds += t2 - t1
        res.verify_seconds += t3 - t2
        res.model_calls += 1
        ctrl.update(gen, a)
        if eos_id is not None and take and take[-1] == eos_id:
            break
    res.tokens[row] = out
