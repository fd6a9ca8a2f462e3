"""Self-speculation throughput: real TPF and tokens/s of linear SS (k = 4, 8, 16) and quadratic SS
(k = 4, 8) vs AR greedy decoding, fp32 and bf16, on the shipped tiny model and held-out code prompts
(``--model``, ``--methods``, ``--precisions`` and ``--threads`` pick others: e.g. the real model's grid
``--model smollm2-135m-trimode --methods ar_greedy,ss_linear:2,ss_quadratic:2 --precisions fp32,bf16-true
--threads 1,2 --batch_sizes 1``; 'bf16-true' stores the weights in bf16, a model loaded for it alone).

Free-running greedy decoding (SS output = AR output; ``agree_ar`` shows where bf16 numerics break
that). Every configuration decodes the same prompts in one process; each method runs ``--repeats``
times, interleaved with the others so background load hits all alike, and its best wall time counts.
One JSON line per measurement, then one line of ratios (tokens/s over AR greedy at the same precision
and batch size).
"""
from __future__ import annotations

import argparse
import json

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding import DecodeResult, get_policy
from workbench.decoding.base import cast_for_precision
from workbench.model.gated_lora import merged_adapter
from workbench.model.load import load_model, resolve_device
from workbench.evaluation.metrics import agreement
from workbench.evaluation.prompts import make_prompts
from workbench.speculative.metrics import pooled_metrics

METHODS = "ar_greedy,ss_linear:4,ss_linear:8,ss_linear:16,ss_quadratic:4,ss_quadratic:8"


def _methods(spec: str) -> list[tuple[str, dict]]:
    """``"ar_greedy,ss_linear:4,ss_linear:4:merged"`` -> ``[("ar_greedy", {}), ("ss_linear", {"draft_length":
    4}), ("ss_linear", {"draft_length": 4, "merged": True})]``; AR greedy first (the reference of every ratio).
    ``merged``: a gated adapter's all-adapter forwards use merged weights
    (:func:`~workbench.model.gated_lora.merged_adapter`)."""
    out = []
    for item in spec.split(","):
        name, *parts = item.split(":")
        kw: dict = {}
        for part in parts:
            if part.isdigit():
                kw["draft_length"] = int(part)
            elif part == "merged":
                kw["merged"] = True
            else:
                raise SystemExit(f"--methods: {part!r} in {item!r} is neither a draft length nor 'merged'")
        out.append((name, kw))
    if out[0] != ("ar_greedy", {}):
        raise SystemExit("--methods must start with ar_greedy (the reference of every ratio)")
    return out


def _decode(model, policy: str, kw: dict, ids, bs: int, gen_len: int, precision: str, pad: int, cuda: bool
            ) -> tuple[DecodeResult, float]:
    """Decode ``ids`` in batches of ``bs``; returns the merged result and the summed wall time (s)."""
    parts = []
    for i in range(0, len(ids), bs):
        if cuda:
            torch.cuda.synchronize()
        parts.append(get_policy(policy)(model, ids[i:i + bs], gen_len, precision=precision, pad_id=pad, **kw))
    merged = DecodeResult(tokens=sum((p.tokens for p in parts), []), forwards=sum((p.forwards for p in parts), []),
                          extra_forwards=sum((p.extra_forwards for p in parts), []),
                          committed_per_step=sum((p.committed_per_step for p in parts), []))
    return merged, sum(p.wall_time for p in parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--n_prompts", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=192)
    ap.add_argument("--gen_len", type=int, default=128)
    ap.add_argument("--batch_sizes", default="1,8", help="comma-separated prompts decoded in lockstep")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", default="0", help="comma-separated torch thread counts (0: torch's default)")
    ap.add_argument("--methods", default=METHODS,
                    help="comma-separated policy[:draft_length][:merged], ar_greedy first; ':merged' runs the "
                         "policy with a gated adapter's merged weights (its all-adapter forwards: diffusion blocks, "
                         "in_block linear-SS drafts; quadratic SS has none)")
    a = ap.parse_args()
    methods = _methods(a.methods)
    dev = resolve_device(a.device)
    loaded, tok, _ = load_model(a.model, dev)
    if any(kw.get("merged") for _, kw in methods) and not loaded.gated:
        raise SystemExit(f"--methods: ':merged' needs a gated-LoRA model, and {a.model} has none")
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, a.prompt_len, a.gen_len, tok)
    ids = [list(p.prompt) for p in prompts]
    pad = tok.pad_token_id
    ratios = {}
    default_threads = torch.get_num_threads()
    for precision in a.precisions.split(","):
        model = loaded
        if precision == "bf16-true":                       # weights stored in bf16: a model of its own
            model = cast_for_precision(load_model(a.model, dev)[0], precision)
        for threads in (int(x) for x in a.threads.split(",")):
            torch.set_num_threads(threads or default_threads)
            for bs in (int(x) for x in a.batch_sizes.split(",")):
                tag = f"{precision}_t{torch.get_num_threads()}_bs{bs}"
                ratios.update(_measure(model, methods, ids, pad, bs, precision, a, dev, tag))
    print(json.dumps({"benchmark": "speculate_ratios", "tokens_per_s_over_ar_greedy": ratios}))


def _measure(model, methods, ids, pad, bs, precision, a, dev, tag) -> dict:
    """Best-of-``repeats`` wall time of every method (interleaved), one JSON line each; returns the ratios."""
    best: dict[int, tuple[DecodeResult, float]] = {}
    for _ in range(a.repeats):
        for i, (policy, spec) in enumerate(methods):
            kw = {k: v for k, v in spec.items() if k != "merged"}
            if model.gated:
                merged_adapter(model, spec.get("merged", False))
            get_policy(policy)(model, ids[:1], 8, precision=precision, pad_id=pad, **kw)  # warm-up
            res, wall = _decode(model, policy, kw, ids, bs, a.gen_len, precision, pad, dev.type == "cuda")
            if i not in best or wall < best[i][1]:
                best[i] = (res, wall)
    ar_res, ar_wall = best[0]
    ar_tps = len(ids) * a.gen_len / ar_wall
    ratios = {}
    for i, (policy, kw) in enumerate(methods):
        res, wall = best[i]
        m = pooled_metrics(res)
        tps = m["tokens"] / wall
        name = (policy + (f"_k{kw['draft_length']}" if "draft_length" in kw else "")
                + ("_merged" if kw.get("merged") else ""))
        agree = sum(agreement(x, y) for x, y in zip(res.tokens, ar_res.tokens)) / len(ids)
        ratios[f"{tag}_{name}"] = round(tps / ar_tps, 3)
        print(json.dumps({"benchmark": "speculate", "method": name, "precision": precision, "batch": bs,
                          "device": str(dev), "threads": torch.get_num_threads(), "prompts": len(ids),
                          "gen_len": a.gen_len, "tokens_per_s": round(tps, 1), "tau": round(m["tau"], 3),
                          "max_accepted": m["max_accepted"], "tpf": round(m["tpf"], 3),
                          "tpf_real": round(m["tpf_real"], 3), "agree_ar": round(agree, 4),
                          "best_wall_s": round(wall, 2), "repeats": a.repeats}), flush=True)
    return ratios


if __name__ == "__main__":
    main()
