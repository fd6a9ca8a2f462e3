"""ISD tokens per forward against I-DLM Eq. 3, side by side, for strides N ∈ {2, 3, 4, 6, 8}.

Eq. 3 is evaluated on the acceptance measured per proposal slot in the same run. Default model: the synthetic
strided model (:mod:`workbench.idlm.synthetic`) with per-proposal acceptance ``--p``; ``--model`` runs a checkpoint
trained with ``objective: idlm`` (or ``smollm2-135m-idlm``) on held-out stdlib prompts instead. One JSON line per N.
"""
from __future__ import annotations

import argparse
import json
import math

from workbench.idlm.isd import isd_decode, isd_tpf
from workbench.idlm.synthetic import SyntheticStrided


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--p", type=float, default=0.85)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--gen_len", type=int, default=256)
    ap.add_argument("--strides", default="2,3,4,6,8")
    args = ap.parse_args()
    prompts = [[1, 2, 3]] * args.rows
    if args.model:
        from workbench.corpus import by_split, load_corpus
        from workbench.evaluation.prompts import make_prompts
        from workbench.model.load import load_model

        model, tok, _ = load_model(args.model)
        ps = make_prompts(by_split(load_corpus("stdlib"), "test"), args.rows, 128, args.gen_len, tok)
        prompts = [list(p.prompt) for p in ps]
    for n in [int(x) for x in args.strides.split(",")]:
        m = model if args.model else SyntheticStrided(args.p, seed=n)
        r = isd_decode(m, prompts, args.gen_len, stride=n)
        tpf = sum(len(t) for t in r.tokens) / sum(r.forwards)
        acc = [a for a in r.slot_acceptance if not math.isnan(a)]
        eq3 = isd_tpf(acc + [acc[-1]] * (n - 1 - len(acc))) if acc else float("nan")
        print(json.dumps({"benchmark": "isd_tpf", "model": args.model or f"synthetic p={args.p}", "stride": n,
                          "rows": len(prompts), "gen_len": args.gen_len, "tpf_measured": round(tpf, 3),
                          "tpf_eq3": round(eq3, 3), "slot_acceptance": [round(a, 3) for a in r.slot_acceptance]}))


if __name__ == "__main__":
    main()
