"""Attention-mask builders. Every builder returns an **additive float** mask of shape
``(batch or 1, 1, query_len, key_len)``: 0 where attention is allowed, ``finfo(dtype).min`` where it is
blocked (bool masks silently break the eager attention path in transformers 5).

Source: NLD §2.2 and Fig. 3 (dual-stream block-diffusion pattern), block diffusion inference (NLD §3.2).
"""
from __future__ import annotations

import torch


def to_additive(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Turn a bool ``allowed`` tensor ``(batch, query_len, key_len)`` or ``(query_len, key_len)`` into an
    additive mask ``(batch or 1, 1, query_len, key_len)`` of ``dtype``."""
    if allowed.dim() == 2:
        allowed = allowed.unsqueeze(0)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def dual_stream_allowed(seq_len: int, block_length: int, device=None, causal_in_block: bool = False) -> torch.Tensor:
    """Visibility of the training forward over ``[x_t | x_0]`` (length ``2 * seq_len``), NLD Fig. 3.

    Query/key index ``i < seq_len`` is the noisy stream, ``i >= seq_len`` the clean stream; both streams
    share position ids ``arange(seq_len)``. Rules (block of position ``i`` is ``i // block_length``):

    * noisy → noisy: same block only (bidirectional inside the block; with ``causal_in_block``, key
      position ≤ query position, I-DLM App. E Fig. 8a, where blocks have the stride's size);
    * noisy → clean: clean tokens of strictly earlier blocks;
    * clean → clean: causal (key position ≤ query position);
    * clean → noisy: never.

    Returns a bool tensor ``(2 * seq_len, 2 * seq_len)``. Raises ``ValueError`` if ``block_length``
    does not divide ``seq_len``.
    """
    if block_length <= 0 or seq_len % block_length:
        raise ValueError(f"block length {block_length} must be positive and divide the sequence length {seq_len}")
    pos = torch.arange(seq_len, device=device)
    blk = pos // block_length
    noisy_noisy = blk[:, None] == blk[None, :]
    if causal_in_block:
        noisy_noisy &= pos[None, :] <= pos[:, None]
    noisy_clean = blk[None, :] < blk[:, None]
    clean_clean = pos[None, :] <= pos[:, None]
    clean_noisy = torch.zeros(seq_len, seq_len, dtype=torch.bool, device=device)
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)
    bottom = torch.cat([clean_noisy, clean_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


def dual_stream_mask(seq_len: int, block_length: int, dtype=torch.float32, device=None,
                     causal_in_block: bool = False) -> torch.Tensor:
    """Additive version of :func:`dual_stream_allowed`: ``(1, 1, 2 * seq_len, 2 * seq_len)``."""
    return to_additive(dual_stream_allowed(seq_len, block_length, device, causal_in_block), dtype)


def cached_allowed(key_valid: torch.Tensor, query_len: int, causal: bool) -> torch.Tensor:
    """Visibility for ``query_len`` new tokens appended after a KV cache.

    Args:
        key_valid: ``(batch, cache_len + query_len)`` bool, False at left-padding positions.
        query_len: number of new tokens (the last ``query_len`` keys).
        causal: True for AR forwards (a new token sees earlier new tokens only); False for a diffusion
            block, which sees the whole block bidirectionally.

    Returns ``(batch, query_len, cache_len + query_len)`` bool. Every query always sees itself, so no
    row is fully blocked even for padded rows.
    """
    n, k = key_valid.shape
    cache_len = k - query_len
    allowed = key_valid[:, None, :].expand(n, query_len, k).clone()
    if causal:
        q = torch.arange(query_len, device=key_valid.device)
        kk = torch.arange(k, device=key_valid.device)
        allowed &= kk[None, :] <= (cache_len + q)[:, None]
    diag = torch.arange(query_len, device=key_valid.device)
    allowed[:, diag, cache_len + diag] = True
    return allowed


def chunk_block_allowed(key_valid: torch.Tensor, chunk_len: int, block_len: int) -> torch.Tensor:
    """Visibility of ``chunk_len`` causal queries followed by ``block_len`` bidirectional block queries (one
    forward that appends verified tokens and reads the next block: DEER's drafter, a self-drafter).

    Args:
        key_valid: ``(batch, cache_len + chunk_len + block_len)`` bool, False at keys never attended.
        chunk_len: clean tokens appended causally (may be 0).
        block_len: block length (a diffusion block; DEER's SEP + masks).

    Returns ``(batch, chunk_len + block_len, cache_len + chunk_len + block_len)`` bool: a chunk query sees
    valid keys up to itself; a block query sees every valid key (cache, chunk and block). Every query
    sees itself, so no row is fully blocked.
    """
    q = chunk_len + block_len
    allowed = cached_allowed(key_valid, q, causal=True)
    allowed[:, chunk_len:, :] = key_valid[:, None, :]
    diag = torch.arange(q, device=key_valid.device)
    allowed[:, diag, key_valid.shape[1] - q + diag] = True
    return allowed


def position_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, k_ok: torch.Tensor, attention: str,
                     block_size: int | None = None) -> torch.Tensor:
    """Visibility of queries over keys by their absolute position ids, for the attention patterns of the released
    diffusion LMs (:data:`~workbench.model.families.spec.ATTENTIONS`).

    Args:
        q_pos: ``(batch, query_len)`` position ids of the queries.
        k_pos: ``(batch, key_len)`` position ids of the keys (cached keys first, then the queries' own).
        k_ok: ``(batch, key_len)`` bool, False at keys never attended (left padding, uncommitted cache columns).
        attention: ``'causal'`` (``k ≤ q``), ``'block_causal'`` (``k // block_size ≤ q // block_size``: SDAR and
            Fast-dLLM v2, whose blocks sit at absolute positions), ``'full'`` or ``'window'`` (every valid key).
        block_size: the family's block size (``'block_causal'`` only).

    Returns ``(batch, query_len, key_len)`` bool. Raises ``ValueError`` for an unknown pattern or a
    ``'block_causal'`` pattern without a positive block size.
    """
    allowed = k_ok[:, None, :].expand(-1, q_pos.shape[1], -1)
    if attention == "causal":
        return allowed & (k_pos[:, None, :] <= q_pos[:, :, None])
    if attention == "block_causal":
        if not block_size or block_size <= 0:
            raise ValueError(f"block-causal attention needs a positive block size, got {block_size}")
        return allowed & (k_pos[:, None, :] // block_size <= q_pos[:, :, None] // block_size)
    if attention in ("full", "window"):
        return allowed.clone()
    raise ValueError(f"unknown attention pattern {attention!r}; valid: causal, block_causal, full, window")
