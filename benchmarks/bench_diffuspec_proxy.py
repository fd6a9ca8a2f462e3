"""Query speed of CPS's causal proxy: kenlm over our Kneser–Ney ARPA vs nltk.lm.KneserNeyInterpolated, on the
same counts (the first ``--tokens`` byte tokens of the stdlib train split), measured side by side in one run.

Prints one JSON line: µs per query of each, their ratio, and that both give the same probabilities.

    .venv/bin/python benchmarks/bench_diffuspec_proxy.py --tokens 100000 --queries 300
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    args = ap.parse_args()
    import numpy as np
    from nltk.lm import KneserNeyInterpolated
    from nltk.util import everygrams

    from workbench.diffuspec.ngram import NgramProxy, kneser_ney, write_arpa
    from workbench.diffuspec.proxy import ProxyConfig, train_sequences
    from workbench.tokenizer import byte_tokenizer

    seqs = [s for s in train_sequences(ProxyConfig(max_tokens=args.tokens), byte_tokenizer()) if len(s) >= 3]
    with tempfile.TemporaryDirectory() as d:
        write_arpa(kneser_ney(seqs, 0.75), f"{d}/proxy.arpa.gz", 0.0)
        proxy = NgramProxy(d, {"order": 3})
        lm = KneserNeyInterpolated(3, discount=0.75)
        lm.fit([list(everygrams([str(t) for t in s], max_len=3)) for s in seqs],
               [str(t) for s in seqs for t in s])
        rnd = random.Random(0)
        flat = np.concatenate(seqs)
        starts = [rnd.randrange(len(flat) - 3) for _ in range(args.queries)]
        qs = [(int(flat[i]), int(flat[i + 1]), int(flat[i + 2])) for i in starts]
        t0 = time.perf_counter()
        ken = [proxy.score(proxy.state([a, b]), w)[0] for a, b, w in qs]
        t_ken = (time.perf_counter() - t0) / len(qs)
        t0 = time.perf_counter()
        ref = [lm.logscore(str(w), [str(a), str(b)]) for a, b, w in qs]
        t_nltk = (time.perf_counter() - t0) / len(qs)
    same = max(abs(k / np.log(2) - r) for k, r in zip(ken, ref))        # nltk logscore is log2
    print(json.dumps({"benchmark": "diffuspec_proxy_query", "tokens": int(sum(len(s) for s in seqs)),
                      "queries": len(qs), "kenlm_us_per_query": round(t_ken * 1e6, 2),
                      "nltk_us_per_query": round(t_nltk * 1e6, 1), "nltk_over_kenlm": round(t_nltk / t_ken, 1),
                      "max_abs_log2_diff": round(float(same), 6)}))


if __name__ == "__main__":
    main()
