"""Held-out language-modelling numbers: AR loss of the model and the unigram baseline (nats per token;
with the byte tokenizer, nats per byte)."""
from __future__ import annotations

import numpy as np
import torch

from ..data import EvenWindows
from ..decoding.base import autocast_for
from ..model.losses import ar_loss, diffusion_loss
from ..model.noise import mask_blocks


def unigram_cross_entropy(train_tokens: np.ndarray, heldout_tokens: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``heldout_tokens`` under the add-one unigram of ``train_tokens``."""
    counts = np.bincount(train_tokens, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[heldout_tokens].mean())


@torch.no_grad()
def heldout_losses(model, tokens: np.ndarray, seq_len: int = 256, n_windows: int = 128, block_length: int = 16,
                   batch_size: int = 16, precision: str = "fp32", seed: int = 0) -> dict:
    """AR loss and diffusion masked-token cross-entropy on evenly spaced held-out windows.

    Returns ``{"ar_nats_per_token", "diff_ce", "diff_loss", "tokens"}``; ``diff_ce`` is the plain
    cross-entropy on masked positions, ``diff_loss`` the 1/t-weighted NLD Eq. 2 value.
    """
    ds = EvenWindows(tokens, seq_len, n_windows)
    g = torch.Generator().manual_seed(seed)
    ar_sum = ce_sum = dl_sum = 0.0
    n_ar = n_ce = 0
    dev = model.device
    with autocast_for(dev, precision):
        for i in range(0, len(ds), batch_size):
            x = torch.stack([ds[j] for j in range(i, min(len(ds), i + batch_size))]).to(dev)
            noisy, masked, t = mask_blocks(x, block_length, model.mask_token_id, 1e-3, g)
            ar_logits, d = model.dual_stream_logits(x, noisy, block_length)  # clean half = causal forward
            ar = ar_loss(ar_logits, x)
            k = int(masked.sum())
            ar_sum += float(ar) * x.shape[0] * (seq_len - 1)
            n_ar += x.shape[0] * (seq_len - 1)
            ce_sum += float(diffusion_loss(d, x, masked, torch.ones_like(t))) * k
            dl_sum += float(diffusion_loss(d, x, masked, t)) * k
            n_ce += k
    return {"ar_nats_per_token": ar_sum / n_ar, "diff_ce": ce_sum / max(n_ce, 1), "diff_loss": dl_sum / max(n_ce, 1),
            "tokens": n_ar}
