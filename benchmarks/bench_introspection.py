"""The introspection forward (``ar_token_logprobs``: the AR log-probabilities behind ``ar_nll`` and I-DLM's
introspective acceptance, one forward per batch per decode run) with the LM head on the positions it reads
(``logits_to_keep``) against the LM head on every position, then sliced (the code before the eleventh session).

Both arms are the same function: arm B wraps the model so that ``extend`` and ``call_backbone`` compute every
position's logits and slice afterwards. Free-running and real-context (block length ``--block_length``), on
held-out prompts; the arms alternate ``--repeats`` times and each arm's best wall time counts. One JSON line per
mode: seconds per call of each arm, their ratio, and the largest difference of a log-probability between them.
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager

import torch

from workbench.corpus import by_split, load_corpus
from workbench.evaluation.metrics import ar_token_logprobs
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model, resolve_device


@contextmanager
def full_head(model):
    """Arm B: every position's logits, then the kept ones sliced out, as before ``logits_to_keep`` was passed."""
    extend, call = model.extend, model.call_backbone

    def keep(logits, k):
        if isinstance(k, torch.Tensor):
            return logits[:, k]
        return logits[:, -k:] if k else logits

    model.extend = lambda ids, cache, kv, logits_to_keep=0: keep(extend(ids, cache, kv), logits_to_keep)
    model.call_backbone = lambda ids, pos, mask, cache=None, logits_to_keep=0: keep(call(ids, pos, mask, cache),
                                                                                   logits_to_keep)
    try:
        yield
    finally:
        model.extend, model.call_backbone = extend, call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-trimode")
    ap.add_argument("--n_prompts", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--gen_len", type=int, default=32)
    ap.add_argument("--block_length", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok, _ = load_model(a.model, resolve_device("cpu"))
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, a.prompt_len, a.gen_len, tok)
    ctx = [list(p.prompt) for p in prompts]
    gen = [list(p.real) for p in prompts]           # the tokens scored (any tokens time the same)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ratios = {}
    with torch.no_grad():
        for mode, real in (("free", None), ("real", gen)):
            def call():
                return ar_token_logprobs(model, ctx, gen, real, a.block_length if real else None, pad)
            best = {"kept": float("inf"), "full": float("inf")}
            out = {}
            call()                                   # warm-up
            for _ in range(a.repeats):
                for arm in ("kept", "full"):
                    t0 = time.perf_counter()
                    if arm == "full":
                        with full_head(model):
                            out[arm] = call()
                    else:
                        out[arm] = call()
                    best[arm] = min(best[arm], time.perf_counter() - t0)
            diff = max(abs(x - y) for r1, r2 in zip(out["kept"], out["full"]) for x, y in zip(r1, r2))
            ratios[mode] = best["full"] / best["kept"]
            print(json.dumps({"mode": mode, "model": a.model, "rows": len(ctx), "prompt_len": a.prompt_len,
                              "gen_len": a.gen_len, "block_length": a.block_length if real else None,
                              "threads": a.threads, "s_kept": round(best["kept"], 3), "s_full": round(best["full"], 3),
                              "speedup": round(ratios[mode], 3), "max_abs_logprob_diff": diff}))
    print(json.dumps({"speedup_full_over_kept": {k: round(v, 3) for k, v in ratios.items()}}))


if __name__ == "__main__":
    main()
