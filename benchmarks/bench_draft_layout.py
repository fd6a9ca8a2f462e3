"""Linear self-speculation's two draft layouts side by side (``workbench.speculative.linear``).

* ``in_block`` (the default): the draft forward is the bidirectional block ``[x_{n+1}, m_1..m_k]`` over the cached
  prefix, with the adapter on all of it; the verify forward holds ``[x_{n+1}, d_1..d_k]``.
* ``clean_prefix`` (NLD §3.3's input ``[x_1..x_n, m_1..m_k]``): the draft forward appends ``x_{n+1}`` causally
  with the base weights and reads ``k`` masks after it; the verify forward holds ``d_1..d_k``.

Both are lossless; the script checks that their tokens are equal and prints, per draft length and context mode,
one JSON line with each layout's acceptance length τ (tokens per cycle, bonus counted), cycles and wall seconds,
and the ratio of the τs. Held-out test prompts, greedy, fp32.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from workbench.corpus import by_split, load_corpus
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model, resolve_device
from workbench.speculative.linear import DRAFT_LAYOUTS, linear_self_speculation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-trimode")
    ap.add_argument("--n_prompts", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=64)
    ap.add_argument("--draft_lengths", default="2,4,8,16", help="comma-separated k (the real-context segment is k)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok, _ = load_model(args.model, resolve_device("cpu"), False)
    model.eval()
    ps = make_prompts(by_split(load_corpus("stdlib"), "test"), args.n_prompts, args.prompt_len, args.gen_len,
                      tokenizer=tok)
    prompts, real = [list(p.prompt) for p in ps], [list(p.real) for p in ps]
    for k in (int(x) for x in args.draft_lengths.split(",")):
        for mode in ("real", "free"):
            row, tokens = {"model": args.model, "k": k, "mode": mode}, {}
            for layout in DRAFT_LAYOUTS:
                t0 = time.perf_counter()
                r = linear_self_speculation(model, prompts, args.gen_len, draft_length=k, layout=layout,
                                            real_continuation=real if mode == "real" else None,
                                            block_length=k if mode == "real" else None)
                cycles = sum(r.forwards)
                row[layout] = {"tau": round(sum(len(t) for t in r.tokens) / cycles, 4), "cycles": cycles,
                               "wall_s": round(time.perf_counter() - t0, 2)}
                tokens[layout] = r.tokens
            row["tau_ratio"] = round(row["clean_prefix"]["tau"] / row["in_block"]["tau"], 4)
            row["same_tokens"] = tokens["in_block"] == tokens["clean_prefix"]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
