"""NLD Eq. 2's noise draw: one t per sequence (the paper) against one t per block (BD3-LM), on one fixed batch.

Both draws give every block the same marginal noise level t ~ U[t_min, 1], so both estimate the same expected
loss block by block; they differ in how the blocks of a window are correlated: one shared t for all blocks of
a window, or independent levels. This script measures what that does to the estimator a training step uses,
holding the model and the batch fixed and redrawing only the noise (and the masks):

* the mean loss under each draw (± its standard error) and their difference in standard errors;
* the loss's standard deviation across draws;
* the gradient noise ``E‖g − ḡ‖² / ‖ḡ‖²`` of the trainable parameters (every parameter for a full model, the
  LoRA for a gated adapter), and the cosine between the two draws' mean gradients.

Lower gradient noise at the same expectation means a better step for the same compute. Prints one JSON line per
block length. Draws alternate between the two arms, so machine load affects both alike.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from workbench.corpus import by_split, load_corpus
from workbench.data import EvenWindows, encode_documents
from workbench.model.load import load_model
from workbench.model.losses import diffusion_loss
from workbench.model.noise import NOISE_PER, mask_blocks


class Moments:
    """Running mean of a scalar and of a gradient vector, and their second moments (Welford would be overkill:
    the draws are few and the sums are float64)."""

    def __init__(self):
        self.n, self.s, self.ss, self.g, self.gg = 0, 0.0, 0.0, None, 0.0

    def add(self, loss: float, grad: torch.Tensor) -> None:
        self.n += 1
        self.s += loss
        self.ss += loss * loss
        self.g = grad.clone() if self.g is None else self.g + grad
        self.gg += float(grad.pow(2).sum())

    def summary(self) -> dict:
        mean = self.s / self.n
        var = max(self.ss / self.n - mean * mean, 0.0) * self.n / (self.n - 1)
        gbar = self.g / self.n
        g2 = float(gbar.pow(2).sum())
        trace = max(self.gg / self.n - g2, 0.0) * self.n / (self.n - 1)   # E‖g − ḡ‖², unbiased
        return {"loss_mean": mean, "loss_se": math.sqrt(var / self.n), "loss_sd": math.sqrt(var),
                "grad_noise": trace / g2, "gbar": gbar}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="named model or checkpoint (a gated adapter trains its LoRA)")
    ap.add_argument("--windows", type=int, default=16, help="held-out windows in the fixed batch")
    ap.add_argument("--seq_len", type=int, default=256, help="tokens per window")
    ap.add_argument("--block_lengths", default="8,32", help="comma-separated block lengths B")
    ap.add_argument("--draws", type=int, default=48, help="noise draws per arm")
    ap.add_argument("--averaging", default="global", choices=["global", "sequence"], help="NLD Eq. 5 or Eq. 4")
    ap.add_argument("--t_min", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tok, _ = load_model(args.model, add_mask_token=True, trainable_adapter=True)   # LoRA in training form
    model.train()
    for name, p in model.named_parameters():                # a gated adapter trains its LoRA, a full model all
        p.requires_grad_(not model.gated or "lora_" in name)
    params = [p for p in model.parameters() if p.requires_grad]
    docs = by_split(load_corpus(), "validation")
    tokens = encode_documents(docs, None if args.model == "tiny" else tok)
    batch = torch.stack([EvenWindows(tokens, args.seq_len, args.windows)[i] for i in range(args.windows)])

    def draw(b: int, per: str, g: torch.Generator) -> tuple[float, torch.Tensor]:
        noisy, masked, t = mask_blocks(batch, b, model.mask_token_id, args.t_min, g, per=per)
        if model.gated:
            _, logits = model.noisy_stream_logits(batch, noisy, b)
        else:
            _, logits = model.dual_stream_logits(batch, noisy, b)
        loss = diffusion_loss(logits, batch, masked, t, averaging=args.averaging)
        grads = torch.autograd.grad(loss, params, allow_unused=True)         # (a LoRA the stream never reaches)
        return float(loss.detach()), torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1)
                                                for p, x in zip(params, grads)]).double()

    for b in (int(x) for x in args.block_lengths.split(",")):
        arms = {per: Moments() for per in NOISE_PER}
        gens = {per: torch.Generator().manual_seed(1000 + i) for i, per in enumerate(NOISE_PER)}
        for _ in range(args.draws):
            for per in NOISE_PER:
                arms[per].add(*draw(b, per, gens[per]))
        s = {per: arms[per].summary() for per in NOISE_PER}
        ga, gb = s["sequence"].pop("gbar"), s["block"].pop("gbar")
        cos = float(ga @ gb / (ga.norm() * gb.norm()))
        diff = s["sequence"]["loss_mean"] - s["block"]["loss_mean"]
        se = math.hypot(s["sequence"]["loss_se"], s["block"]["loss_se"])
        print(json.dumps({"model": args.model, "block_length": b, "seq_len": args.seq_len, "windows": args.windows,
                          "draws": args.draws, "averaging": args.averaging,
                          **{f"{per}_{k}": round(v, 5) for per in NOISE_PER for k, v in s[per].items()},
                          "loss_diff_in_se": round(diff / se, 2),
                          "grad_noise_ratio_sequence_over_block":
                              round(s["sequence"]["grad_noise"] / s["block"]["grad_noise"], 3),
                          "mean_grad_cosine": round(cos, 4),
                          "params": int(sum(p.numel() for p in params))}), flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
