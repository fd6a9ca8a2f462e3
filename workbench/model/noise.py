"""Block-wise masking for the diffusion objective (NLD Eq. 2): per block a noise level ``t ~ U(t_min, 1)``
and every token of the block is replaced by the mask token with probability ``t``.

NLD §2.3 (Tab. 1) also uses "DP-rank varying masking ratios" (another noise range per data-parallel rank). That is
not implemented: ``t`` is drawn per block over the whole global batch, the same on one device or many, so a run
on several devices reproduces the one-device run."""
from __future__ import annotations

import torch


def mask_blocks(clean: torch.Tensor, block_length: int, mask_token_id: int, t_min: float = 1e-3,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Corrupt ``clean`` block by block.

    Args:
        clean: ``(batch, seq_len)`` token ids; ``seq_len`` must be a multiple of ``block_length``.
        block_length: positions per block.
        mask_token_id: id written at masked positions.
        t_min: lower end of the noise level (avoids the 1/t weight blowing up at t → 0).
        generator: optional torch generator for reproducible noise. The draws are made on its device, so a
            CPU generator (:func:`workbench.utils.step_generator`) gives the same noise whatever the device of
            ``clean``.

    Returns:
        ``(noisy, masked, t)`` on the device of ``clean``: noisy ids ``(batch, seq_len)``, bool ``masked``
        ``(batch, seq_len)`` and the per-position noise level ``t`` ``(batch, seq_len)`` (the level of the
        block holding the position).
    """
    n, seq_len = clean.shape
    if block_length <= 0 or seq_len % block_length:
        raise ValueError(f"block length {block_length} must be positive and divide the sequence length {seq_len}")
    if not 0.0 < t_min <= 1.0:
        raise ValueError(f"t_min must be in (0, 1], got {t_min}")
    n_blocks = seq_len // block_length
    draw_on = generator.device if generator is not None else clean.device
    t_block = t_min + (1.0 - t_min) * torch.rand(n, n_blocks, generator=generator, device=draw_on)
    t = t_block.repeat_interleave(block_length, dim=1).to(clean.device)
    masked = torch.rand(n, seq_len, generator=generator, device=draw_on).to(clean.device) < t
    noisy = torch.where(masked, torch.full_like(clean, mask_token_id), clean)
    return noisy, masked, t
