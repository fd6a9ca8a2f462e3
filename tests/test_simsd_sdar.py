"""SimSD on SDAR, the paper's own target (simsd.txt §4.1): block-causal attention at absolute positions.

The references here are written from the rules, not from the adapter: SDAR's ``generate.py`` (a position sees every
position whose absolute block ``position // S`` is not after its own; only whole blocks are cached; the first block
after the prompt holds the prompt's tail) and SimSD's Eq. 1 inside the current block, with the held-back prompt tail
as data of temporal label 0 ("prompt tokens are assigned τ = 0"). Every reference forward is one uncached forward
of the whole canvas.

* (a) the verification logits equal that reference, with the prompt's tail held back (prompt length not a multiple
  of S) and after a first committed block, with and without the RoPE copy;
* (b) at temperature 0 with a one-layer target (whose verification slots are exact, tests/test_simsd.py), SimSD's
  output is the target's own: its serial decoding of SDAR's aligned blocks with the target as its own drafter, and,
  with other drafters, the target's greedy choice along the draft order up to the first rejection, then its serial
  decoding (Eq. 2 at T = 0);
* (c) the families the layout does not reproduce are refused in one line.
"""
import pytest
import torch

from workbench.decoding.base import DecodeError
from workbench.model.families.fixtures import write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.masks import to_additive
from workbench.simsd.decode import simsd_decode, verify_logits

S = 4                                   # SDAR block size of the fixtures
PROMPTS = [[72, 101, 108, 108, 111], [100, 101, 102, 32, 102, 9, 10, 11], [7, 8, 9, 10, 11, 12, 13]]   # 5, 8, 7


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("simsd_sdar")

    def load(name, **kw):
        return load_checkpoint(write_family_checkpoint(name.split("-")[0], root / name, block_size=S, **kw))[0]

    one = load("sdar-one", sizes={"num_hidden_layers": 1})
    near = load("sdar-near", sizes={"num_hidden_layers": 1})        # the one-layer target's weights, perturbed:
    with torch.no_grad():                                           # a drafter that agrees only in part
        g = torch.Generator().manual_seed(7)
        for p in near.backbone.parameters():
            if p.dim() == 2:
                p.add_(0.02 * torch.randn(p.shape, generator=g))
    return {"one": one, "two": load("sdar-two"), "drafter": load("sdar-drafter", seed=1), "near": near,
            "root": root}


def canvas_logits(model, ids: list[int], pos: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """One uncached forward of ``ids`` at position ids ``pos`` under ``allowed`` (query × key); ``(L, V)``."""
    with torch.no_grad():
        return model.backbone(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                              attention_mask=to_additive(allowed, torch.float32), use_cache=False).logits[0]


def sdar_allowed(pos: list[int]) -> torch.Tensor:
    """SDAR's ``block_diffusion_attention_mask``: key block ≤ query block."""
    p = torch.tensor(pos)
    return p[None, :] // S <= p[:, None] // S


def reference_verify(model, context: list[int], draft: list[int], steps: list[int], rope_copy: bool = True):
    """Logits ``(R, V)`` at the mask slots of ``[whole blocks | tail | D | D̃]`` from one uncached forward: block-causal
    by absolute position wherever a whole (committed) block is query or key; Eq. 1 among the tail (data, τ = 0), D
    (data, τ = step) and D̃ (mask, τ = step), all in the current absolute block."""
    m, r = model.mask_token_id, len(draft)
    c = len(context) // S * S                                     # committed whole blocks
    t = len(context) - c                                          # the held-back tail of the current block
    ids = context + draft + [m] * r
    d_pos = list(range(c + t, c + t + r))
    pos = list(range(c + t)) + d_pos + (d_pos if rope_copy else list(range(c + t + r, c + t + 2 * r)))
    kind = ["c"] * c + ["d"] * (t + r) + ["m"] * r
    tau = [0] * (c + t) + list(steps) + list(steps)
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            if kind[i] == "c" or kind[j] == "c":
                allowed[i, j] = pos[j] // S <= pos[i] // S
            elif kind[i] == "d":
                allowed[i, j] = tau[j] <= tau[i] if kind[j] == "d" else tau[j] > tau[i]
            else:
                allowed[i, j] = tau[j] < tau[i] if kind[j] == "d" else tau[j] >= tau[i]
    return canvas_logits(model, ids, pos, allowed)[n - r:]


def _cache_after(model, context: list[int], cuts: list[int]):
    """The target's cache after committing ``context`` in chunks of ``cuts`` (the prompt, then decoded blocks)."""
    cache, start = model.new_cache(), 0
    for c in cuts:
        model.extend(torch.tensor([context[start:start + c]]), cache, torch.ones((1, start + c), dtype=torch.bool),
                     logits_to_keep=1)
        start += c
    return cache


@pytest.mark.parametrize("rope_copy", [True, False])
def test_verification_equals_the_reference_canvas(models, rope_copy):
    model = models["two"]                                         # two layers: hidden states mix across rows
    cases = [  # (context, commits, draft, steps)
        (PROMPTS[0], [5], [65, 66, 67], [2, 3, 1]),                         # tail of 1 held back, R = 3
        (PROMPTS[2], [7], [68], [1]),                                       # tail of 3 held back, R = 1
        (PROMPTS[0] + [70, 71, 72], [5, 3], [65, 66, 67, 68], [3, 1, 4, 2]),  # after a first committed block
        (PROMPTS[1], [8], [80, 81, 82, 83], [1, 2, 3, 4]),                  # a prompt of whole blocks
    ]
    for context, cuts, draft, steps in cases:
        cache = _cache_after(model, context, cuts)
        with torch.no_grad():
            got = verify_logits(model, cache, len(context), torch.tensor(draft), torch.tensor(steps), rope_copy)
        want = reference_verify(model, context, draft, steps, rope_copy)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # the cache is left as it was: the sequential forward after it is SDAR's
        block = torch.full((1, len(draft)), model.mask_token_id)
        kv = torch.ones((1, len(context) + len(draft)), dtype=torch.bool)
        with torch.no_grad():
            seq = model.diffusion_logits(block, cache, kv)[0]
        ids = context + [model.mask_token_id] * len(draft)
        pos = list(range(len(ids)))
        torch.testing.assert_close(seq, canvas_logits(model, ids, pos, sdar_allowed(pos))[len(context):],
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cross a block boundary"):
        verify_logits(model, _cache_after(model, PROMPTS[0], [5]), 5, torch.tensor([1, 2, 3, 4]),
                      torch.tensor([1, 2, 3, 4]))


def _step(model, x: list[int], start: int, end: int) -> torch.Tensor:
    """The target's probabilities ``(end - start, V)`` over the current block ``x[start:end]`` (the canvas so far),
    mask token excluded, from an uncached forward under SDAR's mask."""
    pos = list(range(end))
    logits = canvas_logits(model, x[:end], pos, sdar_allowed(pos))[start:end].clone()
    logits[:, model.mask_token_id] = float("-inf")
    return torch.softmax(logits, -1)


def _serial_fill(model, x: list[int], start: int, end: int) -> None:
    """The target completes ``x[start:end]``: one forward per position, its most confident masked one."""
    m = model.mask_token_id
    while m in x[start:end]:
        probs = _step(model, x, start, end)
        masked = torch.tensor([v == m for v in x[start:end]])
        k = int(torch.where(masked, probs.max(-1).values, torch.full((end - start,), -1.0)).argmax())
        x[start + k] = int(probs[k].argmax())


def _draft(drafter, x: list[int], start: int, end: int) -> tuple[list[int], list[int]]:
    """The drafter decodes the block from all masks, one position per step (its most confident): the order of
    the positions and the tokens."""
    y = list(x[:start]) + [drafter.mask_token_id] * (end - start)
    order = []
    while drafter.mask_token_id in y[start:end]:
        probs = _step(drafter, y, start, end)
        masked = torch.tensor([v == drafter.mask_token_id for v in y[start:end]])
        k = int(torch.where(masked, probs.max(-1).values, torch.full((end - start,), -1.0)).argmax())
        y[start + k] = int(probs[k].argmax())
        order.append(k)
    return order, y[start:end]


def reference_simsd_greedy(target, drafter, prompt: list[int], gen_len: int) -> tuple[list[int], list[int]]:
    """What SimSD decodes at T = 0 when the target's verification is exact: SDAR's aligned blocks; a block with
    fewer than γ = S positions to decode (the prompt's tail in it) by the target alone; in every other block the
    target's greedy token along the drafter's order, accepted while it equals the draft, then the target finishes
    serially. Returns the tokens and the accepted count per drafted block."""
    m = target.mask_token_id
    x, accepted = list(prompt), []
    while len(x) - len(prompt) < gen_len:
        start = len(x)
        end = (start // S + 1) * S
        x += [m] * (end - start)
        if end - start == S:
            order, toks = _draft(drafter, x, start, end)
            a = 0
            for k in order:
                pick = int(_step(target, x, start, end)[k].argmax())
                x[start + k] = pick
                if pick != toks[k]:
                    break
                a += 1
            accepted.append(a)
        _serial_fill(target, x, start, end)
    return x[len(prompt):len(prompt) + gen_len], accepted


def test_self_drafted_simsd_is_the_serial_sdar_target(models):
    """Target = drafter, one layer, T = 0: every drafted block is accepted whole and the output is the target's
    serial decoding of SDAR's aligned blocks (the first block, holding the prompt's tail, by the target alone)."""
    target = models["one"]
    res = simsd_decode(target, target, PROMPTS, 8, block_length=S)
    for r, prompt in enumerate(PROMPTS):
        want, acc = reference_simsd_greedy(target, target, prompt, 8)
        assert res.tokens[r] == want and res.accepted[r] == acc == [S] * len(acc)
        first = (S - len(prompt) % S) % S                             # positions the target decodes alone
        assert res.forwards[r] == first + len(acc)                    # one verify forward per drafted block
        assert res.extra_forwards[r] == len(acc) + (first > 0)        # one KV commit per block
        assert sum(res.committed_per_step[r]) == first + S * len(acc) >= 8


@pytest.mark.parametrize("drafter_name", ["drafter", "near"])
def test_simsd_at_temperature_zero_is_the_target_along_the_draft_order(models, drafter_name):
    """Another SDAR drafter (a second fixture of another seed; the target perturbed, which agrees in part): the
    accepted tokens are the target's own greedy choices in the draft's order, the first rejection is replaced by the
    target's token and the target finishes the block."""
    target, drafter = models["one"], models[drafter_name]
    res = simsd_decode(target, drafter, PROMPTS, 8, block_length=S)
    for r, prompt in enumerate(PROMPTS):
        want, acc = reference_simsd_greedy(target, drafter, prompt, 8)
        assert res.tokens[r] == want and res.accepted[r] == acc
        first = (S - len(prompt) % S) % S
        assert res.forwards[r] == first + sum(1 + (S - a - 1 if a < S else 0) for a in acc)
    flat = [a for row in res.accepted for a in row]
    if drafter_name == "near":
        assert max(flat) > 0 and min(flat) < S                    # accepted and rejected drafts both occur


def test_simsd_on_a_two_layer_sdar_target_runs_with_real_context_and_sampling(models):
    target, drafter = models["two"], models["drafter"]
    real = [[40 + i for i in range(8)] for _ in PROMPTS]
    res = simsd_decode(target, drafter, PROMPTS, 8, block_length=S, real_continuation=real)
    assert [len(t) for t in res.tokens] == [8, 8, 8] and [len(q) for q in res.token_probs] == [8, 8, 8]
    a = simsd_decode(target, drafter, PROMPTS[:1], 8, block_length=S, temperature=1.0, seed=3)
    b = simsd_decode(target, drafter, PROMPTS[:1], 8, block_length=S, temperature=1.0, seed=3)
    assert a.tokens == b.tokens and target.mask_token_id not in a.tokens[0]


@pytest.mark.parametrize("family", ["llada", "dream", "idlm", "fast_dllm_v2"])
def test_families_the_layout_does_not_reproduce_are_refused_in_one_line(models, family):
    model = load_checkpoint(write_family_checkpoint(family, models["root"] / family, block_size=S))[0]
    with pytest.raises(DecodeError) as err:
        simsd_decode(model, models["drafter"], PROMPTS[:1], 8, block_length=S)
    msg = str(err.value)
    assert "\n" not in msg and f"the {family} family's forward is" in msg and "does not reproduce" in msg


def test_sdar_needs_its_own_block_length(models):
    with pytest.raises(DecodeError) as err:
        simsd_decode(models["one"], models["drafter"], PROMPTS[:1], 8, block_length=8)
    assert "\n" not in str(err.value) and "pass 4" in str(err.value)
