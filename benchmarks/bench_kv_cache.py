"""Two decode overheads, each measured against its baseline in one process.

1. Decode tokens/s with transformers' ``DynamicLayer`` (append by ``torch.cat``) against the in-place
:class:`~workbench.model.kv_cache.GrowableLayer` that ``TriModeLM.new_cache`` now uses.

Both variants run in this process on the same prompts, alternating ``--pairs`` times (A, B, A, B, …), and the
outputs are checked equal token for token. Decoders: ar_greedy (free-running) and confidence at ``--block_length``
and τ = 0.9 (real-context). Prints one JSON line per (model, decoder) with the median tokens/s of each variant and
the median of the per-pair ratios growable / dynamic.

2. A prefill of the prompts (``TriModeLM.extend``) with the LM head on every position against
``logits_to_keep=1`` (the last position only, what AR decoding reads and what the prefill and KV-commit forwards of
block diffusion need, since they read no logits): one JSON line with the median seconds of each and their ratio.

Usage: ``python benchmarks/bench_kv_cache.py [--models builtin:tiny smollm2-135m-trimode] [--n_prompts 16]
[--prompt_len 192] [--gen_len 64] [--block_length 16] [--pairs 3]``. A named model that is not in the cache is
skipped with a note (no download).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager, nullcontext


@contextmanager
def dynamic_layers():
    """Make ``TriModeLM.new_cache`` return transformers' plain ``DynamicLayer`` caches (the baseline)."""
    from workbench.model import trimode

    saved = trimode.use_growable_layers
    trimode.use_growable_layers = lambda cache: cache
    try:
        yield
    finally:
        trimode.use_growable_layers = saved


def main() -> None:
    import torch

    from workbench.corpus import by_split, load_corpus
    from workbench.decoding.registry import get_policy
    from workbench.model.named import NamedModelError
    from workbench.evaluation.prompts import make_prompts
    from workbench.model.load import load_model, resolve_device
    from workbench.tokenizer import is_byte_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["builtin:tiny", "smollm2-135m-trimode"])
    ap.add_argument("--n_prompts", type=int, default=16)
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=64)
    ap.add_argument("--block_length", type=int, default=16)
    ap.add_argument("--pairs", type=int, default=3)
    a = ap.parse_args()
    docs = by_split(load_corpus("stdlib"), "test")
    for name in a.models:
        try:
            model, tok, _ = load_model(name, resolve_device("cpu"), name.startswith("builtin:"))
        except NamedModelError as e:
            print(json.dumps({"model": name, "skipped": str(e)}))
            continue
        prompts = make_prompts(docs, a.n_prompts, a.prompt_len, a.gen_len, None if is_byte_tokenizer(tok) else tok)
        ids = [list(p.prompt) for p in prompts]
        real = [list(p.real) for p in prompts]
        runs = {"ar_greedy": (get_policy("ar_greedy"), {}),
                "confidence": (get_policy("confidence"), {"block_length": a.block_length, "threshold": 0.9,
                                                          "real_continuation": real})}
        for dec_name, (decode, kw) in runs.items():
            rate = {"dynamic": [], "growable": []}
            outs = {}
            for _ in range(a.pairs):
                for variant in ("dynamic", "growable"):
                    with (dynamic_layers() if variant == "dynamic" else nullcontext()):
                        t = time.perf_counter()
                        res = decode(model, ids, a.gen_len, **kw)
                        dt = time.perf_counter() - t
                    rate[variant].append(len(ids) * a.gen_len / dt)
                    outs[variant] = res.tokens
            same = torch.equal(torch.as_tensor(outs["dynamic"]), torch.as_tensor(outs["growable"]))
            ratios = [g / d for g, d in zip(rate["growable"], rate["dynamic"])]
            print(json.dumps({"model": name, "decoder": dec_name, "threads": torch.get_num_threads(),
                              "tokens_per_s_dynamic": statistics.median(rate["dynamic"]),
                              "tokens_per_s_growable": statistics.median(rate["growable"]),
                              "ratio_growable_over_dynamic": statistics.median(ratios),
                              "ratios": ratios, "same_tokens": same}), flush=True)
        print(json.dumps({"model": name, **prefill_lm_head(model, ids, a.pairs)}), flush=True)


def prefill_lm_head(model, prompts: list[list[int]], pairs: int) -> dict:
    """Median seconds of a prefill with all logits and with ``logits_to_keep=1``, alternating ``pairs`` times."""
    import torch

    from workbench.decoding.base import left_pad

    ids, valid = left_pad(prompts, 0, model.device)
    secs = {0: [], 1: []}
    with torch.no_grad():
        for _ in range(pairs):
            for keep in (0, 1):
                t = time.perf_counter()
                model.extend(ids, model.new_cache(), valid, logits_to_keep=keep)
                secs[keep].append(time.perf_counter() - t)
    return {"decoder": "prefill", "tokens": int(valid.sum()), "s_all_logits": statistics.median(secs[0]),
            "s_last_logits": statistics.median(secs[1]),
            "ratio_last_over_all": statistics.median(b / a for a, b in zip(secs[0], secs[1]))}


if __name__ == "__main__":
    main()
