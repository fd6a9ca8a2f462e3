"""Prompt choice of a large collection plan: ``make_prompts`` with windowed encodes (a few hundred tokens around
each candidate cut, where the tokenizer restarts at whitespace runs) ÷ whole-file encodes (two per candidate cut),
on the same files in this process, and whether the two plans are equal token for token.

Defaults are the 1 M-row store's plan (``workbench/configs/smollm2_collect.yaml``: 31,264 train-split prompts, up
to 24 cuts per file, 192-token context, 32-token continuation) with SmolLM2's tokenizer (``--model`` is fetched
into the cache on first use). Prints one JSON line.
Usage: ``python benchmarks/bench_prompts.py [--model smollm2-135m] [--n_prompts 31264] [--per_file 24]``.
"""
from __future__ import annotations

import argparse
import json
import time
from unittest import mock

from workbench.corpus import by_split, load_corpus
from workbench.evaluation import prompts as P
from workbench.model.load import load_model
from workbench.tokenizer import is_byte_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--split", default="train")
    ap.add_argument("--n_prompts", type=int, default=31264)
    ap.add_argument("--per_file", type=int, default=24)
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=32)
    a = ap.parse_args()
    _, tok, _ = load_model(a.model)
    enc = None if is_byte_tokenizer(tok) else tok
    docs = by_split(load_corpus("stdlib"), a.split)

    def plan():
        t = time.perf_counter()
        ps = P.make_prompts(docs, a.n_prompts, a.prompt_len, a.gen_len, enc, per_file=a.per_file)
        return [(p.path, p.prompt, p.real) for p in ps], time.perf_counter() - t

    windowed, t_windowed = plan()
    with mock.patch.object(P, "splits_at_whitespace", lambda _: False):
        whole, t_whole = plan()
    print(json.dumps({"model": a.model, "prompts": len(windowed), "windowed_s": round(t_windowed, 1),
                      "whole_file_s": round(t_whole, 1), "speedup": round(t_whole / t_windowed, 1),
                      "windows_used": P.splits_at_whitespace(enc), "equal": windowed == whole}))


if __name__ == "__main__":
    main()
