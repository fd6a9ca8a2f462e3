"""Per-block SOL procedures (NLD §4.1) written as generators.

Every procedure ``yield``\\ s a list of block states (``(B,)`` token-id tensors, mask token at undecided
positions) that it needs the model to evaluate, and receives one ``(top, conf)`` pair per state:
``top`` ``(B,)`` the argmax token and ``conf`` ``(B,)`` its probability at every position. A scheduler
(:mod:`workbench.sol.runner`) batches the requests of many blocks into one forward, so the same code
runs one block at a time or many in lockstep with identical results.

Definitions (``t`` = serial target, ``M`` = mask token):

* **serial** (k = 1): from all-mask, each forward commits the argmax at the masked position with the
  highest peak probability; exactly B forwards; its output is ``t``.
* **greedy acceptance** (NLD §4.1, "a fast lower-bound proxy", :func:`greedy_acceptance`): from all-mask, each
  forward commits every masked position whose argmax equals ``t``; if no position matches, the single
  highest-confidence masked position is committed with the model's own argmax (the paper's fallback) and the
  search goes on. Every block finishes, but a block with a fallback no longer ends equal to ``t`` (greedy "is not
  always exact"); its cost is its forward count either way.
* **greedy check** (:func:`greedy`, the depth-0 decoder of the safety checks): the same without the fallback;
  a state with masked positions but no match is a failure.
* **recursive dynamic compaction** (depth d ≥ 1): each iteration (one forward) ranks the matched
  positions by confidence and commits the largest prefix whose commit is *safe*: decoding the rest
  with the decoder one level shallower (depth 0 = greedy) still reaches ``t`` on its own (no forced
  commit), within the block's simulation budget (over budget = unsafe). The full matched set is
  tried first (so compaction follows greedy exactly whenever greedy succeeds), then a binary search
  over the prefix length; the top-1 match is taken as safe. A state with no match at all commits ``t`` at the
  most confident masked position (a *forced* commit, counted in ``forced_commits``). Towards the serial target
  it is reachable only after a top-1 commit that was not in fact safe; towards another target (SOL(AR greedy))
  the all-mask state itself may have no match, and its forced commits are tokens the model did not predict.
* **SOL** of a block (:func:`solve_block`): compaction's forward count. NLD §4.1: "We use this scheme to report
  SOL throughout this section; greedy serves as a fast lower-bound proxy." (Earlier versions took SOL as the
  fewer forwards of compaction and of a greedy acceptance whose fallback committed the *target's* token: one such
  token, which the model did not predict, could finish a B = 32 block in 4 forwards where compaction needed 27, and
  the ceiling then rested on tokens no sampler could commit.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Budget:
    """Simulation forwards left for one block's safety checks, and how many checks ran out of it."""

    left: int
    hits: int = 0
    spent: int = 0

    def take(self) -> bool:
        """Spend one simulation forward; False (nothing spent) when the budget is empty."""
        if self.left <= 0:
            return False
        self.left -= 1
        self.spent += 1
        return True


def _most_confident(conf: torch.Tensor, masked: torch.Tensor) -> int:
    return int(conf.masked_fill(~masked, -1.0).argmax())


def serial(block_length: int, mask_id: int):
    """Serial denoising from all-mask; returns the serial target ``t`` ``(B,)`` (B forwards)."""
    s = torch.full((block_length,), mask_id, dtype=torch.long)
    for _ in range(block_length):
        ((top, conf),) = yield [s]
        j = _most_confident(conf, s == mask_id)
        s = s.clone()
        s[j] = top[j]
    return s


def greedy_acceptance(s: torch.Tensor, t: torch.Tensor, mask_id: int):
    """NLD §4.1 greedy parallel acceptance from state ``s`` (``(B,)`` ids) towards the serial target ``t``: each
    forward commits every masked position whose argmax equals ``t``; when none matches, the most confident
    masked position gets the model's own argmax (the paper's fallback: "commit the single highest-confidence
    position") and the search goes on. Returns ``(forwards, fallbacks, exact)``: ``exact`` is whether the block
    ended equal to ``t`` (always with no fallback; "greedy is not always exact" otherwise)."""
    f = fallbacks = 0
    while bool((s == mask_id).any()):
        ((top, conf),) = yield [s]
        f += 1
        masked = s == mask_id
        match = masked & (top == t)
        if bool(match.any()):
            s = torch.where(match, t, s)
        else:
            j = _most_confident(conf, masked)
            s = s.clone()
            s[j] = top[j]
            fallbacks += 1
    return f, fallbacks, bool(torch.equal(s, t))


def greedy(s: torch.Tensor, t: torch.Tensor, mask_id: int, budget: Budget | None = None):
    """Greedy check from state ``s`` (no fallback: the depth-0 decoder of the safety checks). Returns
    ``(success, forwards)``; ``success`` is None when the budget ran out (counted in ``budget.hits``)."""
    f = 0
    while bool((s == mask_id).any()):
        if budget is not None and not budget.take():
            budget.hits += 1
            return None, f
        ((top, conf),) = yield [s]
        f += 1
        masked = s == mask_id
        match = masked & (top == t)
        if not bool(match.any()):
            return False, f
        s = torch.where(match, t, s)
    return True, f


@dataclass
class CompactionResult:
    """Outcome of :func:`compaction` for one block: success, SOL forwards, forced commits and the commit path."""

    success: bool | None          # None: over budget (simulations only)
    forwards: int = 0
    forced: int = 0
    path: list = field(default_factory=list)   # per iteration: (committed positions, forced?)


def compaction(s: torch.Tensor, t: torch.Tensor, mask_id: int, depth: int, budget: Budget, top_level: bool = True,
               speculative: bool = False):
    """Recursive dynamic compaction from state ``s`` towards ``t`` (see module docstring).

    At the top level every forward is counted in ``forwards`` (the SOL cost) and forced commits are
    allowed; inside a safety check (``top_level=False``) forwards are simulation forwards drawn from
    ``budget`` and a state without a match makes the check fail. ``speculative``: see
    :func:`_largest_safe_prefix` (same results, fewer rounds, more forwards)."""
    res = CompactionResult(success=True)
    while bool((s == mask_id).any()):
        if not top_level and not budget.take():
            budget.hits += 1
            return CompactionResult(None, res.forwards, res.forced)
        ((top, conf),) = yield [s]
        res.forwards += 1
        masked = s == mask_id
        match = masked & (top == t)
        if not bool(match.any()):
            if not top_level:
                return CompactionResult(False, res.forwards, res.forced)
            j = _most_confident(conf, masked)
            s = s.clone()
            s[j] = t[j]
            res.forced += 1
            res.path.append((j if isinstance(j, list) else [j], True))
            continue
        pos = torch.nonzero(match).squeeze(1)
        ranked = pos[torch.argsort(conf[pos], descending=True, stable=True)]

        def cand(k: int) -> torch.Tensor:
            c = s.clone()
            c[ranked[:k]] = t[ranked[:k]]
            return c

        k = yield from _largest_safe_prefix(cand, len(ranked), t, mask_id, depth, budget, speculative)
        s = cand(k)
        res.path.append((ranked[:k].tolist(), False))
    return res


def _largest_safe_prefix(cand, n: int, t: torch.Tensor, mask_id: int, depth: int, budget: Budget,
                         speculative: bool):
    """Largest ``k`` in ``1..n`` whose candidate state ``cand(k)`` is safe: the full set first, then a
    binary search over ``2..n-1`` (``k = 1`` is taken as safe).

    ``speculative`` (depth 1 only): the greedy checks of *every* candidate the search could visit run in
    lockstep (one round per simulation step instead of one check after another), each capped at the
    budget left; the binary search is then replayed on their outcomes, charging the budget exactly as the
    sequential checks would. Results, budget hits and simulation forwards are identical; the extra
    forwards of unvisited candidates buy a much shorter chain of rounds for the batched scheduler."""
    if n == 1:
        return 1
    if speculative and depth <= 1:
        ks = [n, *range(2, n)]
        cap = budget.left
        outcomes = yield from parallel(*(greedy(cand(k), t, mask_id, Budget(cap)) for k in ks))
        rollout = dict(zip(ks, outcomes))

        def check(k: int) -> bool:
            ok, f = rollout[k]
            if ok is None or f > budget.left:          # the sequential check would run out of budget
                budget.spent += budget.left
                budget.left = 0
                budget.hits += 1
                return False
            budget.left -= f
            budget.spent += f
            return ok is True
    else:
        check = None
    if (check(n) if check else (yield from _safe(cand(n), t, mask_id, depth, budget))):
        return n
    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if check(mid) if check else (yield from _safe(cand(mid), t, mask_id, depth, budget)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _safe(c: torch.Tensor, t: torch.Tensor, mask_id: int, depth: int, budget: Budget):
    """Is committing state ``c`` safe: does the depth-(d − 1) decoder reach ``t`` from it on its own?"""
    if depth <= 1:
        ok, _ = yield from greedy(c, t, mask_id, budget)
        return ok is True
    r = yield from compaction(c, t, mask_id, depth - 1, budget, top_level=False)
    return r.success is True


def confidence(block_length: int, mask_id: int, threshold: float):
    """The confidence-threshold policy from all-mask; returns ``(forwards, output)``."""
    s = torch.full((block_length,), mask_id, dtype=torch.long)
    f = 0
    while bool((s == mask_id).any()):
        ((top, conf),) = yield [s]
        f += 1
        masked = s == mask_id
        commit = masked & (conf >= threshold)
        commit[_most_confident(conf, masked)] = True
        s = torch.where(commit, top, s)
    return f, s


def parallel(*procedures):
    """Run several procedures in lockstep: each round yields the concatenation of their pending states
    and hands every procedure its own slice of the results. Returns their return values in order.

    Procedures that do not depend on each other (serial target and confidence policy; greedy and
    compaction once ``t`` is known) then share forwards, which shortens a block's chain of rounds
    without changing any result."""
    values: list = [None] * len(procedures)
    pending: dict[int, list] = {}
    for i, proc in enumerate(procedures):
        try:
            pending[i] = next(proc)
        except StopIteration as stop:
            values[i] = stop.value
    while pending:
        results = yield [s for i in sorted(pending) for s in pending[i]]
        offset, nxt = 0, {}
        for i in sorted(pending):
            n = len(pending[i])
            try:
                nxt[i] = procedures[i].send(results[offset:offset + n])
            except StopIteration as stop:
                values[i] = stop.value
            offset += n
        pending = nxt
    return values


def solve_block(block_length: int, mask_id: int, depth: int = 1, budget: int = 5000, threshold: float = 0.9,
                speculative: bool = False, target: torch.Tensor | None = None):
    """Everything SOL measures on one block; returns a dict (forwards of serial / greedy acceptance / SOL
    (= compaction) / confidence, greedy fallbacks, success = no fallback and exact = ended equal to the target,
    forced commits, budget hits, simulation forwards, the serial target).

    ``target`` ``(B,)``: reproduce this sequence instead of the serial target (e.g. AR greedy's block, for
    SOL(AR greedy), the ceiling of lossless self-speculation); the serial decode is then skipped."""
    if target is None:
        t, (c_f, c_out) = yield from parallel(serial(block_length, mask_id),
                                              confidence(block_length, mask_id, threshold))
    else:
        t = target
        c_f, c_out = yield from confidence(block_length, mask_id, threshold)
    empty = torch.full((block_length,), mask_id, dtype=torch.long)
    b = Budget(budget)
    (g_f, g_fb, g_exact), sol = yield from parallel(greedy_acceptance(empty, t, mask_id),
                                           compaction(empty, t, mask_id, depth, b, speculative=speculative))
    return {"target": t, "serial_forwards": block_length, "greedy_forwards": g_f, "greedy_success": g_fb == 0,
            "greedy_fallbacks": g_fb, "greedy_exact": g_exact, "compaction_forwards": sol.forwards,
            "sol_forwards": sol.forwards, "forced_commits": sol.forced, "budget_hits": b.hits,
            "sim_forwards": b.spent, "sol_path": sol.path, "confidence_forwards": c_f,
            "confidence_equals_target": bool(torch.equal(c_out, t))}


def optimal_forwards(t: torch.Tensor, mask_id: int, predict, forced: bool = True) -> float:
    """The fewest forwards of any commit schedule from all-mask to ``t`` (exhaustive search; small B only).

    Each forward may commit any non-empty subset of the masked positions whose argmax equals ``t``, or, when
    none does and ``forced``, one masked position with its ``t`` token (compaction's forced commit); without
    ``forced`` such a state is a dead end, and ``inf`` means no schedule of matched commits reaches ``t``.
    ``predict(state) -> (top, conf)``. Reference for tests of :func:`compaction` (a schedule of this kind, so it
    cannot beat it). Cost: all subsets of all reachable states, about 3^B predictions.
    """
    from functools import lru_cache
    from itertools import combinations

    b = len(t)

    @lru_cache(maxsize=None)
    def best(state: tuple) -> float:
        s = torch.tensor(state)
        masked = s == mask_id
        if not bool(masked.any()):
            return 0
        top, _ = predict(s)
        match = [int(j) for j in torch.nonzero(masked & (top == t)).flatten()]
        if not match and not forced:
            return float("inf")
        moves = [c for k in range(1, len(match) + 1) for c in combinations(match, k)] if match else \
            [(int(j),) for j in torch.nonzero(masked).flatten()]
        out = float(b + 1)
        for c in moves:
            nxt = list(state)
            for j in c:
                nxt[j] = int(t[j])
            out = min(out, 1 + best(tuple(nxt)))
        return out

    return best(tuple([mask_id] * b))
