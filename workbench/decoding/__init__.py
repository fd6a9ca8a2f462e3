"""Decoding policies, picked by name from :data:`POLICIES` (see :func:`get_policy`)."""
from __future__ import annotations

from functools import partial
from typing import Callable

from .ar import ar_decode
from .base import DecodeError, DecodeResult, check_threshold
from .diffusion import diffusion_decode
from .rules import confidence_rule, serial_rule


def _ar_greedy(model, prompts, gen_len, **kw) -> DecodeResult:
    kw.pop("threshold", None)
    return ar_decode(model, prompts, gen_len, temperature=0.0, **kw)


def _ar_sample(model, prompts, gen_len, temperature: float = 1.0, **kw) -> DecodeResult:
    kw.pop("threshold", None)
    return ar_decode(model, prompts, gen_len, temperature=temperature, **kw)


def _confidence(model, prompts, gen_len, block_length: int, threshold: float = 0.9, **kw) -> DecodeResult:
    rule = partial(confidence_rule, threshold=check_threshold(threshold))
    return diffusion_decode(model, prompts, gen_len, block_length, rule, **kw)


def _serial(model, prompts, gen_len, block_length: int, **kw) -> DecodeResult:
    kw.pop("threshold", None)
    return diffusion_decode(model, prompts, gen_len, block_length, serial_rule, **kw)


def _sampler(model, prompts, gen_len, block_length: int, threshold: float = 0.5, sampler=None, **kw) -> DecodeResult:
    from .sampler_policy import sampler_decode

    return sampler_decode(model, prompts, gen_len, block_length, threshold=threshold, sampler=sampler, **kw)


#: Registered decoding policies: name → ``decode(model, prompts, gen_len, **options) -> DecodeResult``.
POLICIES: dict[str, Callable[..., DecodeResult]] = {
    "ar_greedy": _ar_greedy,
    "ar_sample": _ar_sample,
    "confidence": _confidence,
    "serial": _serial,
    "sampler": _sampler,
}


def register_policy(name: str, fn: Callable[..., DecodeResult]) -> None:
    """Add a policy to the registry (later stages: sampler, self-speculation, DEER...)."""
    POLICIES[name] = fn


def get_policy(name: str) -> Callable[..., DecodeResult]:
    """The decode function of policy ``name``; raises :class:`DecodeError` listing the valid names."""
    if name not in POLICIES:
        raise DecodeError(f"unknown decoding policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


__all__ = ["POLICIES", "DecodeError", "DecodeResult", "get_policy", "register_policy", "ar_decode", "diffusion_decode"]
