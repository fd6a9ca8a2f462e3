"""The LM head on the last positions of a forward: a slice of the hidden states (what transformers does with an
integer ``logits_to_keep``) against an index (what ``TriModeLM.call_backbone`` passes since 2026-11-28).

A slice ``h[:, -K:, :]`` keeps the sequence's batch stride, and ``torch.matmul`` then multiplies it batch by batch
against a contiguous copy of the whole transposed LM head per row (56 MB each on SmolLM2-135M in bf16); an index
gathers the rows into a contiguous ``(N, K, d)`` tensor first. Prints, side by side in one process:

* op level: ``F.linear`` of a slice vs an index, for a few ``(N, Q)`` shapes, bf16 and fp32;
* decode level (``--model``): a prefill or KV-commit forward reads only its last logits, so every decoder pays
  it once per prompt or block; confidence (B = 8, τ = 0.9) and AR greedy at batch ``--batch_size``, with the
  integer count restored at the backbone boundary for the 'slice' arm.

Example: ``python benchmarks/bench_lm_head.py --model smollm2-135m-trimode --precision bf16-true``.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn import functional as F


def _best(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def op_level(d: int, vocab: int, repeats: int) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(vocab, d, dtype=dtype)
        for n, q in ((1, 192), (8, 9), (32, 33)):
            h = torch.randn(n, q, d, dtype=dtype)
            sl = _best(lambda: F.linear(h[:, -1:, :], w), repeats)
            ix = _best(lambda: F.linear(h[:, torch.arange(q - 1, q), :], w), repeats)
            print(json.dumps({"benchmark": "lm_head_op", "dtype": str(dtype).replace("torch.", ""), "rows": n,
                              "seq": q, "slice_ms": round(1e3 * sl, 2), "index_ms": round(1e3 * ix, 2),
                              "speedup": round(sl / ix, 2)}), flush=True)


def slice_arm(model):
    """Make ``model``'s backbone take the kept positions as an integer count again (transformers' slice)."""
    forward = model.backbone.forward

    def as_slice(*args, logits_to_keep=0, **kwargs):
        if isinstance(logits_to_keep, torch.Tensor):
            logits_to_keep = int(logits_to_keep.numel())      # call_backbone passes the last positions in order
        return forward(*args, logits_to_keep=logits_to_keep, **kwargs)

    model.backbone.forward = as_slice
    return lambda: setattr(model.backbone, "forward", forward)


def decode_level(a) -> None:
    from workbench.corpus import by_split, load_corpus
    from workbench.decoding import get_policy
    from workbench.decoding.base import cast_for_precision
    from workbench.evaluation.prompts import make_prompts
    from workbench.model.load import load_model

    model, tok, _ = load_model(a.model)
    cast_for_precision(model, a.precision)
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.batch_size, 192, a.gen_len, tok)
    ids = [list(p.prompt) for p in prompts]
    for policy, kw in (("confidence", {"block_length": 8, "threshold": 0.9}), ("ar_greedy", {})):
        fn = get_policy(policy)
        run = lambda: fn(model, ids, a.gen_len, precision=a.precision, pad_id=tok.pad_token_id or 0, **kw)
        walls, outs = {}, {}
        for _ in range(a.repeats):                       # interleaved, best of repeats
            for arm in ("index", "slice"):
                restore = slice_arm(model) if arm == "slice" else (lambda: None)
                t = time.perf_counter()
                outs[arm] = run().tokens
                walls[arm] = min(walls.get(arm, float("inf")), time.perf_counter() - t)
                restore()
        print(json.dumps({"benchmark": "lm_head_decode", "policy": policy, "precision": a.precision,
                          "batch": a.batch_size, "gen_len": a.gen_len, "index_s": round(walls["index"], 2),
                          "slice_s": round(walls["slice"], 2), "speedup": round(walls["slice"] / walls["index"], 2),
                          "same_tokens": outs["index"] == outs["slice"]}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="also time decodes on this model (e.g. smollm2-135m-trimode)")
    ap.add_argument("--precision", default="bf16-true")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--gen_len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    op_level(576, 49153, 3)
    if a.model:
        decode_level(a)


if __name__ == "__main__":
    main()
