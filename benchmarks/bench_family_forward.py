"""A released diffusion LM's denoising forward through the workbench's family adapter against the built-in
transformers class's own forward of the same tensors (issue target: adapter ≤ 1.05× built-in).

For each family (nld, sdar, llada, dream, fast_dllm_v2, idlm) a random checkpoint in the family's on-disk layout
(:func:`~workbench.model.families.fixtures.write_family_checkpoint`, fp32, default hidden 256, 4 layers, 8 heads,
4 KV heads, MLP 688, vocabulary 4096) is opened with :func:`~workbench.model.io.load_checkpoint`; ``--batch`` rows
of ``--prompt_len`` tokens are committed with ``model.extend`` and a block of ``--block`` mask tokens is denoised:

* ``A`` (adapter): ``model.diffusion_logits(block, cache, key_valid, future_masks)``: the mask, position ids,
  held-back tokens and kept-logit columns built by the adapter on every call, then the backbone forward, the crop
  and the realignment of shifted logits. The cache is left as it was, so the call repeats on the same cache;
* ``B`` (built-in): ``model.backbone(input_ids, position_ids, attention_mask=<4D additive mask>, cache=<a second
  cache committed the same way>, use_cache=True, logits_to_keep=<the same index>)`` then the same crop; for the
  recompute families (llada, dream) one uncached forward of the whole ``[committed | block | future masks]``
  sequence. Its inputs are built once, outside the timing, from the family's rule (:func:`position_allowed`,
  :func:`to_additive`): exactly the tensor work the family's reference does, without the adapter's bookkeeping.

A and B alternate (``--rounds`` rounds of ``--n`` calls each, A B then B A, after a warm-up), so load falls on both
alike; per family one JSON line with the median ms per call of each, the median of the per-round ratios A/B and
their spread (min, quartiles, max), ``ok`` (ratio ≤ ``--target``), minor page faults per call of each, and the
max |Δ| between A's logits and B's (the same positions, realigned as the adapter realigns them), which must be
≤ 1e-4. A markdown table follows. One torch thread by default (``--threads``).

``--ragged`` left-pads the rows to different prompt lengths (``prompt_len - 3 i``), so SDAR and Fast-dLLM v2
hold different numbers of prompt-tail tokens back and recompute them with the block.

Usage: ``python benchmarks/bench_family_forward.py [--quick] [--families sdar dream] [--ragged] [--threads 2]``.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time

import torch

from workbench.model.families.adapters import BlockCausalFamilyLM, CausalFamilyLM, RecomputeFamilyLM
from workbench.model.families.fixtures import write_family_checkpoint
from workbench.model.io import load_checkpoint
from workbench.model.masks import position_allowed, to_additive
from workbench.model.trimode import cache_keyword

FAMILIES = ["nld", "sdar", "llada", "dream", "fast_dllm_v2", "idlm"]
FULL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
        "intermediate_size": 688, "max_position_embeddings": 2048}
QUICK = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 344, "max_position_embeddings": 2048}


def _ms_per_call(fn, n: int) -> tuple[float, int]:
    """Mean ms per call of ``n`` calls, and the minor page faults they took (memory the allocator handed back to
    the system and took again: a large tensor freed and allocated per call can cost more than its copy)."""
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f


def _prompts(n: int, length: int, ragged: bool, pad_id: int, gen: torch.Generator):
    """Left-padded ``(N, P)`` prompt ids (byte tokens) and their validity; ragged rows are ``3 i`` shorter."""
    ids = torch.randint(0, 256, (n, length), generator=gen)
    valid = torch.ones((n, length), dtype=torch.bool)
    if ragged:
        for i in range(n):
            valid[i, :3 * i] = False
    return ids.masked_fill(~valid, pad_id), valid


def builtin_inputs(model, prompt, p_valid, block, cache_b, future: int):
    """The built-in forward's keyword arguments for the same work as ``model.diffusion_logits`` (built once),
    the columns it crops from its cache afterwards, and ``align(a, b) -> (a', b')``: the logits that must agree."""
    n, b = block.shape
    spec = model.family
    kv = torch.cat([p_valid, torch.ones_like(block, dtype=torch.bool)], 1)
    dtype = model.mask_dtype
    if isinstance(model, RecomputeFamilyLM):        # whole canvas, no cache, every position sees every valid one
        fut = torch.full((n, future), model.mask_token_id, dtype=torch.long)
        seq = torch.cat([prompt, block, fut], 1)
        valid = torch.cat([kv, torch.ones_like(fut, dtype=torch.bool)], 1)
        pos = (valid.long().cumsum(1) - 1).clamp_min(0)
        allowed = position_allowed(pos, pos, valid, "full")
        allowed |= torch.eye(seq.shape[1], dtype=torch.bool)      # a padding query sees itself
        start = prompt.shape[1] - (1 if spec.shift else 0)
        kw = {"input_ids": seq, "position_ids": pos, "attention_mask": to_additive(allowed, dtype),
              "use_cache": False, "logits_to_keep": torch.arange(start, start + b)}
        return kw, 0, lambda a, r: (a, r)
    if isinstance(model, BlockCausalFamilyLM):      # held-back tokens + block, block-causal at absolute positions
        st = cache_b.family_state
        t = st.pend_ids.shape[1]
        seq = torch.cat([st.pend_ids, block], 1)
        seq_valid = torch.cat([st.pend_valid, torch.ones_like(block, dtype=torch.bool)], 1)
        pos = (st.count[:, None] + seq_valid.long().cumsum(1) - 1).clamp_min(0)
        k_pos, k_ok = torch.cat([st.pos, pos], 1), torch.cat([st.valid, seq_valid], 1)
        allowed = position_allowed(pos, k_pos, k_ok, "block_causal", model.block_size)
        allowed[:, torch.arange(t + b), k_pos.shape[1] - t - b + torch.arange(t + b)] = True
        first = max(t - 1, 0) if spec.shift else t
        keep = torch.arange(first, t + b - (1 if spec.shift else 0))
        kw = {"input_ids": seq, "position_ids": pos, "attention_mask": to_additive(allowed, dtype),
              "use_cache": True, "logits_to_keep": keep}
        kw[cache_keyword(model.backbone)] = cache_b
        # shifted: block token j ≥ 1 is predicted by column (t + j - 1), the last b - 1 kept columns
        align = (lambda a, r: (a[:, 1:], r[:, -(b - 1):])) if spec.shift else (lambda a, r: (a, r))
        return kw, t + b, align
    # NLD (the block sees the cached prefix and itself) and I-DLM (causal): the block after the KV cache
    pos_all = (kv.long().cumsum(1) - 1).clamp_min(0)
    q_pos = pos_all[:, -b:]
    allowed = position_allowed(q_pos, pos_all, kv, "causal" if isinstance(model, CausalFamilyLM) else "window")
    allowed[:, torch.arange(b), kv.shape[1] - b + torch.arange(b)] = True
    kw = {"input_ids": block, "position_ids": q_pos, "attention_mask": to_additive(allowed, dtype), "use_cache": True}
    kw[cache_keyword(model.backbone)] = cache_b
    align = (lambda a, r: (a[:, 1:], r[:, :-1])) if spec.shift else (lambda a, r: (a, r))
    return kw, b, align


def bench_family(family: str, root: str, a) -> dict:
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    sizes = QUICK if a.quick else FULL
    path = write_family_checkpoint(family, f"{root}/{family}", vocab_size=a.vocab, sizes=sizes)
    model, tok, _ = load_checkpoint(path)
    gen = torch.Generator().manual_seed(0)
    prompt, p_valid = _prompts(a.batch, a.prompt_len, a.ragged, tok.pad_token_id, gen)
    block = torch.full((a.batch, a.block), model.mask_token_id, dtype=torch.long)
    kv = torch.cat([p_valid, torch.ones_like(block, dtype=torch.bool)], 1)
    future = a.future_masks if isinstance(model, RecomputeFamilyLM) else 0
    with torch.no_grad():
        cache_a, cache_b = model.new_cache(), model.new_cache()
        model.extend(prompt, cache_a, p_valid, logits_to_keep=1)
        model.extend(prompt, cache_b, p_valid, logits_to_keep=1)
        kw, crop, align = builtin_inputs(model, prompt, p_valid, block, cache_b, future)

        def run_a():
            return model.diffusion_logits(block, cache_a, kv, future_masks=future)

        def run_b():
            out = model.backbone(**kw).logits
            if crop:
                cache_b.crop(-crop)
            return out

        la, lb = align(run_a(), run_b())
        diff = float((la - lb).abs().max()) if la.shape == lb.shape else float("inf")
        ta, tb, faults = [], [], {"a": 0, "b": 0}
        for r in range(a.rounds):                  # A B, B A, A B, ...: drift and load fall on both alike
            for fn, times, key in ((run_a, ta, "a"), (run_b, tb, "b"))[::1 if r % 2 == 0 else -1]:
                ms, flt = _ms_per_call(fn, a.n)
                times.append(ms)
                faults[key] += flt
        same_cache = cache_a.get_seq_length() == cache_b.get_seq_length()
    ratios = sorted(x / y for x, y in zip(ta, tb))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    ratio = statistics.median(ratios)
    return {"benchmark": "family_forward", "family": family, "adapter": type(model).__name__,
            "backbone": type(model.backbone).__name__, "batch": a.batch, "prompt_len": a.prompt_len,
            "block": a.block, "future_masks": future, "ragged": a.ragged, "block_size": model.block_size,
            "held_back": int(crop - a.block) if isinstance(model, BlockCausalFamilyLM) else 0,
            "threads": torch.get_num_threads(), "adapter_ms": round(statistics.median(ta), 3),
            "builtin_ms": round(statistics.median(tb), 3), "ratio": round(ratio, 4),
            "ratio_spread": [round(ratios[0], 3), round(q[0], 3), round(q[2], 3), round(ratios[-1], 3)],
            "ok": ratio <= a.target, "max_abs_diff": diff, "same_logits": diff <= 1e-4,
            "page_faults_per_call": {k: v // (a.rounds * a.n) for k, v in (("adapter", faults["a"]),
                                                                            ("builtin", faults["b"]))},
            "cache_unchanged": same_cache}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=FAMILIES)
    ap.add_argument("--quick", action="store_true", help="a smaller model and fewer rounds (about 20 s)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=None, help="committed tokens per row (192; quick 96)")
    ap.add_argument("--block", type=int, default=32, help="mask tokens denoised per forward")
    ap.add_argument("--future_masks", type=int, default=0, help="mask tokens after the block (llada, dream)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--ragged", action="store_true", help="left-pad rows to prompt_len - 3 i tokens")
    ap.add_argument("--n", type=int, default=2, help="calls per timing round")
    ap.add_argument("--rounds", type=int, default=None, help="alternating A/B rounds (40; quick 20)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on a shared 2-core machine two OpenMP threads stall on a busy core and "
                         "the spread grows tenfold; 0: torch's default)")
    ap.add_argument("--target", type=float, default=1.05)
    a = ap.parse_args()
    a.prompt_len = a.prompt_len or (96 if a.quick else 192)
    a.rounds = a.rounds or (20 if a.quick else 40)
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for family in a.families:
            rows.append(bench_family(family, root, a))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n| family | adapter ms | built-in ms | A/B (quartiles) | ≤ {a.target} | max abs Δ | page faults A/B |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        s, f = r["ratio_spread"], r["page_faults_per_call"]
        print(f"| {r['family']} | {r['adapter_ms']:.2f} | {r['builtin_ms']:.2f} | {r['ratio']:.3f} "
              f"({s[1]:.3f}–{s[2]:.3f}) | {'yes' if r['ok'] else 'NO'} | {r['max_abs_diff']:.1e} | "
              f"{f['adapter']}/{f['builtin']} |")


if __name__ == "__main__":
    main()
