"""SimSD's verification layout (arXiv:2606.02544 §3.1): token-level temporal causal attention.

After the cached prefix (the prompt and earlier blocks, temporal label 0, visible to every position) the input
holds two sections of the block's B positions:

* the **data section** D = (D_1..D_B): the drafted tokens, at their own positions;
* the **mask section** D̃ = (D̃_1..D̃_B): mask tokens, the verification slots.

Position k of both sections carries the temporal label τ(k) = μ_k, the draft step at which the drafter decided
position k (a permutation of 1..B). Eq. 1 (A_ij = 1: query i may attend to key j):

* D_i → D_j   iff τ(j) ≤ τ(i);
* D_i → D̃_j   iff τ(j) > τ(i);
* D̃_i → D_j   iff τ(j) < τ(i);
* D̃_i → D̃_j   iff τ(j) ≥ τ(i).

RoPE copy: D̃_k uses the position id of D_k (the block position), so the slot of the token decided at step r
sees, at the first layer, exactly the block state of sequential denoising before step r (tokens decided earlier,
masks elsewhere, at their positions). Deeper layers mix hidden states computed in the same forward, so the
slot's logits approximate that sequential forward; the paper measures this (§4.3, KL 0.089 already at step 0),
and so do the tests and ``workbench simsd precision``.
"""
from __future__ import annotations

import torch


def temporal_allowed(steps: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Visibility of the verification input ``[prefix (cached) | D | D̃]`` (Eq. 1).

    Args:
        steps: ``(B,)`` long, τ of each block position (its draft step, 1..B; ties allowed).
        prefix_len: cached prefix tokens (all visible to every query).

    Returns ``(2B, prefix_len + 2B)`` bool: rows are the queries ``D_1..D_B, D̃_1..D̃_B``; columns the keys
    ``prefix, D_1..D_B, D̃_1..D̃_B``.

    Raises ``ValueError`` for steps that are not positive.
    """
    if steps.dim() != 1 or (steps < 1).any():
        raise ValueError("temporal labels must be a 1-D tensor of steps >= 1 (the prompt has label 0)")
    b = steps.shape[0]
    ti, tj = steps[:, None], steps[None, :]
    dd, dm = tj <= ti, tj > ti                      # data rows: data keys, mask keys
    md, mm = tj < ti, tj >= ti                      # mask rows: data keys, mask keys
    body = torch.cat([torch.cat([dd, dm], 1), torch.cat([md, mm], 1)], 0)
    prefix = torch.ones((2 * b, prefix_len), dtype=torch.bool, device=steps.device)
    return torch.cat([prefix, body], 1)


def paired_positions(block_start: int, block_length: int, device=None) -> torch.Tensor:
    """``(2B,)`` position ids of ``[D | D̃]``: D_k at ``block_start + k`` and D̃_k copying it (RoPE copy)."""
    pos = torch.arange(block_start, block_start + block_length, device=device)
    return torch.cat([pos, pos])


def physical_positions(block_start: int, block_length: int, device=None) -> torch.Tensor:
    """``(2B,)`` position ids without the RoPE copy: D̃ continues after D (the ablation of SimSD, arXiv:2606.02544 Table 4)."""
    return torch.arange(block_start, block_start + 2 * block_length, device=device)
