"""``workbench leaderboard``: every registered decoder on one prompt set, in both context modes, per block or
draft length, against the SOL ceilings (SOL(serial), SOL(AR greedy)) computed on the same prompts.

Modules: :mod:`.config` (options), :mod:`.rows` (the decoder × setting grid from the registry, and the cost
model), :mod:`.columns` (per-row metrics against the references), :mod:`.ceilings` (the two SOL searches),
:mod:`.report` (markdown table and frontier plot), :mod:`.run` (the command).
"""
from .config import LeaderboardConfig

__all__ = ["LeaderboardConfig"]
