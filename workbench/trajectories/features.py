"""Per-position sampler features (NLD App. A) from compact step records.

One function, :func:`block_features`, serves both decoding time (records made from live logits by
:func:`step_record`) and training time (records read from a Zarr store): both paths go through the
same quantisation (top probabilities float32, entropy float16, as the store keeps them), so they give identical
tensors.

Default feature vector, 144 dims per position (``feature_dim = 3 * pca_dim + 12``):

======  =========================================================================
dims    feature
======  =========================================================================
0–43    PCA embedding (``token_pca``, scikit-learn PCA of the model's input embeddings) of the top-1 token
44–87   PCA embedding of the top-2 token
88–131  PCA embedding of the top-3 token
132     top-1 probability
133     top-2 probability
134     top-3 probability
135     margin = top-1 − top-2 probability
136     top-3 mass = top-1 + top-2 + top-3 probability
137     entropy of the full distribution (nats)
138     relative position j / (B − 1) in the block
139     fraction of the block already committed (unmasked)
140     step / B (denoising step index normalised by the block length)
141     left neighbour committed (1 for j = 0: the clean prefix is to the left)
142     right neighbour committed (0 for j = B − 1)
143     position is masked (1) or already committed (0)
======  =========================================================================
"""
from __future__ import annotations

import numpy as np
import torch

N_STATS = 12
STAT_NAMES = ("p1", "p2", "p3", "margin", "top3_mass", "entropy", "rel_pos", "frac_committed", "step_over_B",
              "left_committed", "right_committed", "is_masked")
DEFAULT_FEATURE_DIM = 144


def feature_spec(feature_dim: int = DEFAULT_FEATURE_DIM) -> dict:
    """The feature specification stored in a store's attrs and checked against a sampler's config.

    Raises ``ValueError`` when ``feature_dim - 12`` is not a positive multiple of 3."""
    if feature_dim <= N_STATS or (feature_dim - N_STATS) % 3:
        raise ValueError(f"feature_dim must be 12 + 3·k with k ≥ 1 (e.g. 144), got {feature_dim}")
    return {"feature_dim": feature_dim, "pca_dim": (feature_dim - N_STATS) // 3, "top_k": 3,
            "stats": list(STAT_NAMES), "version": 1}


@torch.no_grad()
def step_record(probs: torch.Tensor, masked: torch.Tensor) -> dict[str, torch.Tensor]:
    """Compact record of one denoising step (what the store keeps).

    Args:
        probs: ``(N, B, V)`` probabilities of the current block.
        masked: ``(N, B)`` bool, positions still masked before this step's commit.

    Returns ``top_ids`` ``(N, B, 3)`` int32, ``top_probs`` ``(N, B, 3)`` float32, ``entropy`` ``(N, B)``
    float16 (nats), ``masked`` ``(N, B)`` bool.
    """
    p = probs.float()
    top_p, top_i = p.topk(3, dim=-1)
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    return {"top_ids": top_i.to(torch.int32), "top_probs": top_p, "entropy": ent.to(torch.float16),
            "masked": masked.clone()}


def token_pca(embeddings: torch.Tensor | np.ndarray, pca_dim: int = 44, seed: int = 0) -> np.ndarray:
    """PCA (scikit-learn) of token embeddings ``(V, d)`` → ``(V, pca_dim)`` float16 (zero-padded if d < pca_dim)."""
    from sklearn.decomposition import PCA

    e = embeddings.detach().float().cpu().numpy() if isinstance(embeddings, torch.Tensor) else np.asarray(embeddings, np.float32)
    k = min(pca_dim, e.shape[1], e.shape[0])
    z = PCA(n_components=k, svd_solver="full", random_state=seed).fit_transform(e)
    out = np.zeros((e.shape[0], pca_dim), dtype=np.float16)
    out[:, :k] = z.astype(np.float16)
    return out


def block_features(top_ids, top_probs, entropy, masked, step, token_pca_table, feature_dim: int = DEFAULT_FEATURE_DIM
                   ) -> torch.Tensor:
    """Per-position features of block states.

    Args:
        top_ids: ``(N, B, 3)`` int top-3 token ids.
        top_probs: ``(N, B, 3)`` float32 top-3 probabilities.
        entropy: ``(N, B)`` float16 entropy (nats).
        masked: ``(N, B)`` bool, still-masked positions at this step.
        step: ``(N,)`` int step index inside the trajectory (0 = all-mask state).
        token_pca_table: ``(V, ≥ pca_dim)`` float16 PCA embeddings of the vocabulary.
        feature_dim: 12 + 3 · pca_dim (default 144).

    Accepts NumPy arrays or torch tensors. Returns ``(N, B, feature_dim)`` float32.
    Raises ``ValueError`` for an invalid ``feature_dim`` or a PCA table narrower than ``pca_dim``.
    """
    spec = feature_spec(feature_dim)
    k = spec["pca_dim"]
    t = lambda x: torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x  # noqa: E731
    top_ids, top_probs, entropy, masked, step = t(top_ids), t(top_probs), t(entropy), t(masked), t(step)
    pca = t(token_pca_table)
    if pca.shape[1] < k:
        raise ValueError(f"token_pca has {pca.shape[1]} dims but feature_dim {feature_dim} needs {k}")
    pca = pca[:, :k].float().to(top_ids.device)
    n, b, _ = top_ids.shape
    emb = pca[top_ids.long()].reshape(n, b, 3 * k)                       # (N, B, 3k)
    p = top_probs.float()                                                  # (N, B, 3)
    m = masked.bool()
    committed = (~m).float()
    rel = torch.arange(b, device=top_ids.device, dtype=torch.float32) / max(1, b - 1)
    left = torch.cat([torch.ones(n, 1, device=m.device), committed[:, :-1]], dim=1)
    right = torch.cat([committed[:, 1:], torch.zeros(n, 1, device=m.device)], dim=1)
    stats = torch.stack([
        p[..., 0], p[..., 1], p[..., 2], p[..., 0] - p[..., 1], p.sum(-1), entropy.float(),
        rel.expand(n, b), committed.mean(dim=1, keepdim=True).expand(n, b),
        (step.float() / b)[:, None].expand(n, b), left, right, m.float(),
    ], dim=-1)                                                             # (N, B, 12)
    return torch.cat([emb, stats], dim=-1)
