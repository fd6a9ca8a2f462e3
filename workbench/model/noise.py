"""Block-wise masking for the diffusion objective (NLD Eq. 2): a noise level ``t ~ U(t_min, 1)`` and every token
of a block is replaced by the mask token with probability ``t``.

NLD Eq. 2 draws **one** ``t`` per sequence, outside its sum over blocks, and §2.1's case for global loss averaging
rests on it ("the number of noisy tokens is approximately proportional to t"): ``per='sequence'``. The block
diffusion reference it follows ([9], BD3-LM) draws one ``t`` per block: ``per='block'``, the variant every
shipped checkpoint was trained with (their configs pin it). Both make the 1/t-weighted loss an unbiased estimate
of the same expectation; per block, the number of masked tokens per sequence varies far less, so Eq. 4 and Eq. 5
nearly coincide.

NLD §2.3 (Tab. 1) also uses "DP-rank varying masking ratios" (another noise range per data-parallel rank). That is
not implemented: ``t`` is drawn (per window or per block) over the whole global batch, the same on one device or
many, so a run on several devices reproduces the one-device run."""
from __future__ import annotations

import torch

NOISE_PER = ("sequence", "block")


def mask_blocks(clean: torch.Tensor, block_length: int, mask_token_id: int, t_min: float = 1e-3,
                generator: torch.Generator | None = None, per: str = "block",
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Corrupt ``clean`` block by block.

    Args:
        clean: ``(batch, seq_len)`` token ids; ``seq_len`` must be a multiple of ``block_length``.
        block_length: positions per block.
        mask_token_id: id written at masked positions.
        t_min: lower end of the noise level (avoids the 1/t weight blowing up at t → 0).
        generator: optional torch generator for reproducible noise. The draws are made on its device, so a
            CPU generator (:func:`workbench.utils.step_generator`) gives the same noise whatever the device of
            ``clean``.
        per: 'sequence' (one ``t`` per row, NLD Eq. 2) or 'block' (one per block, BD3-LM).

    Returns:
        ``(noisy, masked, t)`` on the device of ``clean``: noisy ids ``(batch, seq_len)``, bool ``masked``
        ``(batch, seq_len)`` and the per-position noise level ``t`` ``(batch, seq_len)`` (the level of the
        block holding the position).

    Raises ``ValueError`` when ``block_length`` does not divide ``seq_len``, ``t_min`` is outside (0, 1] or
    ``per`` is unknown.
    """
    n, seq_len = clean.shape
    if block_length <= 0 or seq_len % block_length:
        raise ValueError(f"block length {block_length} must be positive and divide the sequence length {seq_len}")
    if not 0.0 < t_min <= 1.0:
        raise ValueError(f"t_min must be in (0, 1], got {t_min}")
    if per not in NOISE_PER:
        raise ValueError(f"unknown noise level draw {per!r}; valid: {', '.join(NOISE_PER)}")
    n_blocks = seq_len // block_length
    draw_on = generator.device if generator is not None else clean.device
    t_block = t_min + (1.0 - t_min) * torch.rand(n, n_blocks if per == "block" else 1, generator=generator,
                                                 device=draw_on)
    t_block = t_block.expand(n, n_blocks)
    t = t_block.repeat_interleave(block_length, dim=1).to(clean.device)
    masked = torch.rand(n, seq_len, generator=generator, device=draw_on).to(clean.device) < t
    noisy = torch.where(masked, torch.full_like(clean, mask_token_id), clean)
    return noisy, masked, t
