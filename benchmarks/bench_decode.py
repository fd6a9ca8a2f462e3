"""Decoding throughput: AR and block-diffusion tokens/s, and KV-cached vs no-cache diffusion decoding.

Runs on the shipped tiny model (or ``--model``) over held-out code prompts in one process and prints
one JSON line per measurement plus the ratios (cache speed-up, diffusion / AR tokens per second).
"""
from __future__ import annotations

import argparse
import json

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding import get_policy
from workbench.model.load import load_model, resolve_device
from workbench.evaluation.prompts import make_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--n_prompts", type=int, default=16)
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=128)
    ap.add_argument("--block_length", type=int, default=16)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    model, tok, _ = load_model(a.model, dev)
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, a.prompt_len, a.gen_len, tok)
    ids = [list(p.prompt) for p in prompts]
    pad = tok.pad_token_id
    res = {}
    runs = [("ar_greedy", {}, True), ("confidence", {"block_length": a.block_length, "threshold": a.threshold}, True),
            ("confidence", {"block_length": a.block_length, "threshold": a.threshold}, False)]
    get_policy("ar_greedy")(model, ids[:2], 8, precision=a.precision, pad_id=pad)  # warm-up
    for name, kw, cache in runs:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        r = get_policy(name)(model, ids, a.gen_len, precision=a.precision, pad_id=pad, use_cache=cache, **kw)
        key = f"{name}{'' if cache else '_nocache'}"
        tps = len(ids) * a.gen_len / r.wall_time
        res[key] = tps
        print(json.dumps({"benchmark": "decode", "policy": key, "device": str(dev), "batch": len(ids),
                          "tokens_per_s": round(tps, 1), "tpf": round(sum(r.forwards) and len(ids) * a.gen_len / sum(r.forwards), 3),
                          "wall_s": round(r.wall_time, 2), "threads": torch.get_num_threads()}))
    print(json.dumps({"benchmark": "decode_ratios", "kv_cache_speedup": round(res["confidence"] / res["confidence_nocache"], 2),
                      "diffusion_over_ar_tokens_per_s": round(res["confidence"] / res["ar_greedy"], 2)}))


if __name__ == "__main__":
    main()
