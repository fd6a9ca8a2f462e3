"""Gated-LoRA conversion step: the two-pass training forward against the one-pass dual stream.

Both compute NLD's block-diffusion loss of the noisy stream of a gated LoRA (I-DLM App. G) on identical
batches and take one AdamW step on the LoRA parameters:

* ``one_pass``: :meth:`TriModeLM.dual_stream_logits` over ``[x_t | x_0]`` (2L tokens, differentiated, the gate
  off on the clean half);
* ``two_pass``: :meth:`TriModeLM.noisy_stream_logits`: the clean stream through the frozen base without gradient
  (its keys and values cached), then the noisy stream (L tokens) with the adapter.

The model is a random-initialised Llama with SmolLM2-135M's shape (30 layers, hidden 576, 9 / 3 heads,
vocabulary 49,153), or ``--model`` (e.g. ``smollm2-135m``). Steps alternate between the two forms so that load
on the machine affects both alike; prints one JSON line with the median step times, tokens/s (training tokens
= L per window) and the ratio.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.model.gated_lora import attach_gated_lora
from workbench.model.losses import diffusion_loss
from workbench.model.noise import mask_blocks
from workbench.model.trimode import TriModeLM


def smollm2_shaped() -> TriModeLM:
    cfg = LlamaConfig(vocab_size=49153, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      tie_word_embeddings=True, rope_theta=100000.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return TriModeLM(LlamaForCausalLM(cfg), 49152)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="named model or checkpoint (default: random SmolLM2-shaped)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=128)
    ap.add_argument("--block_length", type=int, default=8)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6, help="timed steps of each form")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        from workbench.model.load import load_model

        m, _, _ = load_model(args.model, add_mask_token=True)
    else:
        m = smollm2_shaped()
    vocab = m.backbone.get_input_embeddings().num_embeddings - 1      # ids below the mask token
    attach_gated_lora(m, args.rank, 4.0 * args.rank)
    m.train()
    params = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator().manual_seed(0)

    def step(form: str) -> float:
        clean = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g)
        noisy, masked, t = mask_blocks(clean, args.block_length, m.mask_token_id, 1e-3, g)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if form == "one_pass":
                _, logits = m.dual_stream_logits(clean, noisy, args.block_length)
            else:
                _, logits = m.noisy_stream_logits(clean, noisy, args.block_length)
            loss = diffusion_loss(logits, clean, masked, t)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    for form in ("one_pass", "two_pass"):
        step(form)                                   # warm-up, not timed
    times = {"one_pass": [], "two_pass": []}
    for _ in range(args.steps):
        for form in times:
            times[form].append(step(form))
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.batch * args.seq_len
    print(json.dumps({"benchmark": "gated_training_forward", "model": args.model or "random SmolLM2-135M shape",
                      "batch": args.batch, "seq_len": args.seq_len, "rank": args.rank,
                      "threads": torch.get_num_threads(), "one_pass_s_per_step": round(med["one_pass"], 3),
                      "two_pass_s_per_step": round(med["two_pass"], 3),
                      "one_pass_tokens_per_s": round(tokens / med["one_pass"], 1),
                      "two_pass_tokens_per_s": round(tokens / med["two_pass"], 1),
                      "speedup_two_pass": round(med["one_pass"] / med["two_pass"], 3)}))


if __name__ == "__main__":
    main()
