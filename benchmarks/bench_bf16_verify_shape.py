"""Why lossless self-speculation is not lossless in bf16 (issue 21 §2): is it the verify forward's shape?

Linear self-speculation computes the verifier's next-token logits in a (k + 1)-token forward; AR greedy computes
them in one-token forwards. In fp32 both give the same tokens; in bf16 (autocast) the two shapes round
differently and the outputs part ways. This script decodes the same prompts in bf16 with

- ``ar_greedy``: one-token forwards (the leaderboard's baseline);
- ``ar_verify_shape``: AR greedy computed through the verify forward's shape: every step runs the verifier on
  ``[x_{n+1}, pad × k]`` (k + 1 tokens, the same call as ss_linear's verify) and keeps only the first
  position's argmax and key; mathematically it is AR greedy;
- ``ss_linear`` at draft length k (NLD §3.3),

and the fp32 AR greedy reference, and prints the token agreement and exact-match rate of each pair. If
``ss_linear`` equals ``ar_verify_shape`` where it differs from ``ar_greedy``, running the baseline through the same
forward shape restores equality; if not, the accepted drafts' keys (computed at other rows of the verify forward)
carry the difference too.

One JSON line per pair and k; run e.g.
``python benchmarks/bench_bf16_verify_shape.py --model smollm2-135m-trimode --n_prompts 8 --gen_len 64``.
"""
from __future__ import annotations

import argparse
import json

import torch

from workbench.corpus import by_split, load_corpus
from workbench.decoding import get_policy
from workbench.evaluation.metrics import agreement
from workbench.evaluation.prompts import make_prompts
from workbench.model.load import load_model, resolve_device
from workbench.speculative.adapter import verifier_mode
from workbench.speculative.driver import run_speculation
from workbench.tokenizer import is_byte_tokenizer


class VerifyShapedAR:
    """AR greedy through the verify forward: each cycle one ``(k + 1)``-token verifier forward over
    ``[x_{n+1}, pad_1..pad_k]``; position 0's argmax is the next token and only ``x_{n+1}``'s key is kept."""

    def __init__(self, model, k: int, pad_id: int):
        self.model, self.k, self.pad_id = model, k, pad_id

    def start(self, ctx, tally, active) -> None:
        """Nothing to prepare."""

    def cycle(self, ctx, tally, active) -> list[list[int]]:
        n = ctx.last.shape[0]
        pads = torch.full((n, self.k), self.pad_id, dtype=torch.long, device=ctx.last.device)
        seq = torch.cat([ctx.last[:, None], pads], dim=1)                        # (N, k + 1)
        with verifier_mode(self.model):
            ver = self.model.extend(seq, ctx.cache, ctx.with_new(self.k + 1)).float()   # (N, k + 1, V)
        tally.count(active, extra=True)
        nxt = ver[:, 0].argmax(-1)                                                # (N,)
        slots = torch.arange(self.k + 1, device=seq.device)[None, :]
        ctx.commit(slots == 0, nxt, active)
        return [[int(t)] for t in nxt.tolist()]


def _batched(fn, ids: list[list[int]], bs: int) -> list[list[int]]:
    out = []
    for i in range(0, len(ids), bs):
        out += fn(ids[i:i + bs]).tokens
    return out


def _compare(a: list[list[int]], b: list[list[int]]) -> dict:
    return {"agree": round(sum(agreement(x, y) for x, y in zip(a, b)) / len(a), 4),
            "exact": sum(x == y for x, y in zip(a, b)), "prompts": len(a)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-trimode")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--n_prompts", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=128)
    ap.add_argument("--gen_len", type=int, default=64)
    ap.add_argument("--draft_lengths", default="4,8", help="comma-separated k")
    ap.add_argument("--batch_size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model, tok, _ = load_model(a.model, resolve_device(a.device))
    enc = None if is_byte_tokenizer(tok) else tok
    prompts = make_prompts(by_split(load_corpus("stdlib"), "test"), a.n_prompts, a.prompt_len, a.gen_len, enc)
    ids = [list(p.prompt) for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ar = get_policy("ar_greedy")
    ref = _batched(lambda x: ar(model, x, a.gen_len, precision="fp32", pad_id=pad), ids, a.batch_size)
    ar16 = _batched(lambda x: ar(model, x, a.gen_len, precision="bf16", pad_id=pad), ids, a.batch_size)
    print(json.dumps({"pair": "ar_greedy bf16 vs fp32", **_compare(ar16, ref)}), flush=True)
    for k in (int(s) for s in a.draft_lengths.split(",")):
        shaped = _batched(lambda x: run_speculation(model, VerifyShapedAR(model, k, pad), x, a.gen_len, k + 1, None,
                                                    None, pad, "bf16"), ids, a.batch_size)
        ss = _batched(lambda x: get_policy("ss_linear")(model, x, a.gen_len, draft_length=k, precision="bf16",
                                                        pad_id=pad), ids, a.batch_size)
        for name, x, y in (("ar_verify_shape vs ar_greedy (bf16)", shaped, ar16),
                           ("ss_linear vs ar_greedy (bf16)", ss, ar16),
                           ("ss_linear vs ar_verify_shape (bf16)", ss, shaped),
                           ("ar_verify_shape bf16 vs ar_greedy fp32", shaped, ref),
                           ("ss_linear bf16 vs ar_greedy fp32", ss, ref)):
            print(json.dumps({"k": k, "pair": name, **_compare(x, y)}), flush=True)


if __name__ == "__main__":
    main()
