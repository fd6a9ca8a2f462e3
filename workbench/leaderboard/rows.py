"""The leaderboard's grid: every registered decoder × context mode × setting (block length B, draft length
k = B, confidence threshold τ), built from each :class:`~workbench.decoding.registry.DecoderSpec` alone, so a
decoder registered later gets its rows without an edit here."""
from __future__ import annotations

from dataclasses import dataclass

from ..decoding.registry import DecoderSpec

#: Decoders whose rows come first (the references every other row is compared with).
REFERENCES = ("ar_greedy", "serial")


@dataclass(frozen=True)
class Setting:
    """One leaderboard row to decode.

    Attributes:
        decoder: registry name. label: row name (``ss_linear+lora`` for a decoder run with the LoRA adapter).
        mode: 'real' or 'free'. length: B (block length, draft length k = B, or real-context segment) or None.
        threshold: τ for decoders that sweep one, else None. adapter: run on the model with the LoRA adapter.
    """

    decoder: str
    label: str
    mode: str
    length: int | None
    threshold: float | None = None
    adapter: bool = False


def _order(spec: DecoderSpec) -> tuple:
    return (REFERENCES.index(spec.name) if spec.name in REFERENCES else len(REFERENCES), spec.name)


def grid(specs: list[DecoderSpec], modes: list[str], lengths: list[int], thresholds: list[float],
         with_adapter: bool, real_context: list[str] | None = None) -> list[Setting]:
    """The rows to decode, references first. A decoder that does not run in real-context mode
    (``spec.real_context`` False) gets free-running rows only; AR decoders get one free-running row and one
    real-context row per segment length; decoders that draft with a LoRA drafter (``spec.lora_drafter``) run once
    more with the LoRA adapter when ``with_adapter``. ``real_context``: the decoders that get real-context rows
    (None: all that can; the references always do)."""
    out: list[Setting] = []
    for spec in sorted(specs, key=_order):
        wants_real = real_context is None or spec.name in real_context or spec.name in REFERENCES
        for mode in modes:
            if mode == "real" and not (spec.real_context and wants_real):
                continue
            if spec.sweep == "none":
                ls = [None] if mode == "free" else list(lengths)
            else:
                ls = list(lengths)
            ts = list(thresholds) if spec.sweep == "block_length+threshold" else [None]
            variants = [False, True] if with_adapter and spec.lora_drafter else [False]
            for adapter in variants:
                label = spec.name + ("+lora" if adapter else "")
                out += [Setting(spec.name, label, mode, b, t, adapter) for b in ls for t in ts]
    return out


__all__ = ["Setting", "grid", "REFERENCES"]
