"""DEER wall-clock speedup over AR decoding of the target (deer.txt Tables 1–2), measured in one run.

Decodes the same held-out prompts with AR (the target alone) and with DEER (target + aligned drafter),
alternating the two per batch so both see the same machine load, and prints one JSON line per method and
the ratio. Needs a trained drafter (``workbench train deer``; default ``runs/deer/stage2/drafter``).

    python benchmarks/bench_deer.py --drafter runs/deer/stage2/drafter --threads 1
"""
from __future__ import annotations

import argparse
import json

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding import ar_decode
from workbench.deer import deer_decode
from workbench.deer.models import check_shared_tokenizer, load_target
from workbench.model.load import resolve_device
from workbench.evaluation.prompts import make_prompts
from workbench.model.io import load_checkpoint


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="builtin:tiny")
    ap.add_argument("--drafter", default="runs/deer/stage2/drafter")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--n_prompts", type=int, default=16)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--gen_len", type=int, default=128)
    ap.add_argument("--draft_length", type=int, default=16)
    ap.add_argument("--batch_size", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    target, tok = load_target(a.target, dev)
    drafter, dtok, _ = load_checkpoint(a.drafter, device=dev)
    check_shared_tokenizer(tok, dtok)
    prompts = [list(p.prompt) for p in make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts,
                                                     a.prompt_len, a.gen_len, tok)]
    kw = dict(temperature=a.temperature, pad_id=tok.pad_token_id, precision=a.precision)
    deer_decode(target, drafter, prompts[:1], 16, a.draft_length, sep_id=tok.sep_token_id, **kw)   # warm-up
    ar_decode(target, prompts[:1], 16, **kw)
    wall = {"ar": 0.0, "deer": 0.0}
    cycles = tokens = 0
    for i in range(0, len(prompts), a.batch_size):
        batch = prompts[i:i + a.batch_size]
        wall["ar"] += ar_decode(target, batch, a.gen_len, **kw).wall_time
        r = deer_decode(target, drafter, batch, a.gen_len, a.draft_length, sep_id=tok.sep_token_id, **kw)
        wall["deer"] += r.wall_time
        cycles += sum(len(c) for c in r.committed_per_step)
        tokens += sum(len(t) for t in r.tokens)
    for name, w in wall.items():
        print(json.dumps({"benchmark": "deer", "method": name, "device": str(dev), "batch": a.batch_size,
                          "draft_length": a.draft_length, "temperature": a.temperature,
                          "tokens_per_s": round(len(prompts) * a.gen_len / w, 1), "wall_s": round(w, 3),
                          "threads": torch.get_num_threads()}))
    print(json.dumps({"benchmark": "deer_ratios", "speedup_over_ar": round(wall["ar"] / wall["deer"], 3),
                      "tau": round(tokens / max(1, cycles), 3)}))


if __name__ == "__main__":
    main()
