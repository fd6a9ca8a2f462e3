"""Layout, position ids and attention mask of the quadratic self-speculation forward (NLD App. C,
Eq. 11, Fig. 12).

The new tokens of one forward (after the cached verified prefix) are

* the **speculative stream** ``S = [x_{n+1}, d_1..d_k]`` (``A = k + 1`` anchors) at positions
  ``n+1..n+k+1``, causal among themselves (AR mode, verifies the previous draft);
* one **mask group** of ``G`` masks after every anchor ``S_j``, at positions ``n+2+j..n+1+j+G``
  (shared with the speculative tokens at those positions, as the dual stream of NLD Fig. 3 shares
  position ids between ``x_t`` and ``x_0``). Group ``j`` sees the cached prefix, ``S_0..S_j`` and itself
  bidirectionally: the diffusion prediction of the ``G`` tokens after ``S_j`` *as if* ``S_0..S_j`` were
  the verified prefix.

Query/key order: ``S`` first, then group 0, group 1, ... (``A + A * G`` tokens). Every query sees
itself, so no row is fully blocked.
"""
from __future__ import annotations

import torch

from ..model.masks import to_additive


def quadratic_offsets(n_anchors: int, group_size: int, device=None) -> torch.Tensor:
    """``(A + A * G,)`` long: position of every new token relative to ``x_{n+1}`` (offset 0).
    Anchor ``j`` → ``j``; mask ``r`` of group ``j`` → ``j + 1 + r``."""
    anchors = torch.arange(n_anchors, device=device)
    groups = (anchors[:, None] + 1 + torch.arange(group_size, device=device)[None, :]).reshape(-1)
    return torch.cat([anchors, groups])


def quadratic_allowed(n_anchors: int, group_size: int, device=None) -> torch.Tensor:
    """Visibility among the new tokens: ``(Q, Q)`` bool with ``Q = A + A * G``; ``[i, j]`` = query ``i``
    may attend key ``j``. Speculative → speculative: causal; speculative → mask: never; group ``j`` →
    anchors ``0..j``; group ``j`` → group ``j``: all; group → other groups: never."""
    a, g = n_anchors, group_size
    q = a + a * g
    allowed = torch.zeros((q, q), dtype=torch.bool, device=device)
    allowed[:a, :a] = torch.tril(torch.ones((a, a), dtype=torch.bool, device=device))
    for j in range(a):
        rows = slice(a + j * g, a + (j + 1) * g)
        allowed[rows, : j + 1] = True
        allowed[rows, rows] = True
    return allowed


def quadratic_mask(cache_valid: torch.Tensor, n_anchors: int, group_size: int,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive attention mask ``(N, 1, Q, C + Q)`` of the quadratic forward after a cache of ``C`` keys.

    Args:
        cache_valid: ``(N, C)`` bool, False at left padding and punched-out (rejected) keys.
        n_anchors: ``A = k + 1``. group_size: ``G`` masks per group.
        dtype: mask dtype (the model's compute dtype).

    Every new token sees every valid cached key; among new tokens see :func:`quadratic_allowed`.
    """
    n, c = cache_valid.shape
    new = quadratic_allowed(n_anchors, group_size, cache_valid.device)
    q = new.shape[0]
    allowed = torch.cat([cache_valid[:, None, :].expand(n, q, c), new[None].expand(n, q, q)], dim=2)
    return to_additive(allowed, dtype)
