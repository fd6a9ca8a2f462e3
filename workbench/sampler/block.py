"""The block length a trained sampler decodes at, and the block lengths of a command given one.

A sampler's position embeddings and labels come from one block length B of its store (NLD App. A), so it decodes at
that B only (:meth:`~workbench.sampler.policy.LoadedSampler.check_compatible`). A command given ``--sampler`` decodes
at the sampler's own B when ``--block_lengths`` is left out, as ``workbench decode`` decodes at a model's trained
block, and refuses a ``--block_lengths`` that conflicts with it in one line.
"""
from __future__ import annotations

import json
from pathlib import Path

from .network import META, SamplerError


def trained_block_length(sampler: str | Path | None) -> int | None:
    """The block length ``sampler`` (a folder written by ``workbench train sampler``) was trained at, from its
    ``sampler.json``; ``None`` for no sampler, a folder without a readable ``sampler.json`` (the loader names what is
    wrong with it when the command loads it) or a sampler saved without one."""
    if not sampler:
        return None
    try:
        value = json.loads((Path(sampler) / META).read_text()).get("block_length")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sampler_block_lengths(given: list[int] | None, sampler: str | Path | None, default: list[int]) -> list[int]:
    """The block lengths of a command that decodes with the trained ``sampler``: ``given`` when set, else the
    sampler's own block length ``[B]`` (``default`` without a sampler or a recorded B)."""
    if given is not None:
        return list(given)
    b = trained_block_length(sampler)
    return [b] if b is not None else list(default)


def check_sampler_block_lengths(block_lengths: list[int], sampler: str | Path | None, every: bool = False) -> None:
    """Refuse ``--block_lengths`` that conflict with the trained ``sampler``: without the sampler's B, or (``every``,
    a command whose every decode is the sampler's) with any other B.

    Raises :class:`~workbench.sampler.network.SamplerError` (a ``ValueError``), one line naming both and the fix."""
    b = trained_block_length(sampler)
    if b is None:
        return
    if b not in block_lengths or (every and set(block_lengths) != {b}):
        raise SamplerError(f"--block_lengths {list(block_lengths)} conflicts with --sampler {sampler}, trained at block "
                           f"length {b}: leave --block_lengths out (it defaults to the sampler's [{b}]) or pass "
                           f"[{b}], or train a sampler at the block length you want")


__all__ = ["trained_block_length", "sampler_block_lengths", "check_sampler_block_lengths"]
