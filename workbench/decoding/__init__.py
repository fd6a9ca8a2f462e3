"""Decoding policies, picked by name from :data:`POLICIES` (see :func:`get_policy`)."""
from __future__ import annotations

from functools import partial
from typing import Callable

from .ar import ar_decode
from .base import DecodeError, DecodeResult, check_threshold, stop_at_eos
from .diffusion import diffusion_decode
from .rules import confidence_rule, serial_rule


def _ar_greedy(model, prompts, gen_len, **kw) -> DecodeResult:
    kw.pop("threshold", None)
    return ar_decode(model, prompts, gen_len, temperature=0.0, **kw)


def _ar_sample(model, prompts, gen_len, temperature: float = 1.0, **kw) -> DecodeResult:
    kw.pop("threshold", None)
    if not temperature > 0:
        raise DecodeError(f"ar_sample needs a temperature > 0, got {temperature} (use ar_greedy for greedy decoding)")
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


def _deer(model, prompts, gen_len, drafter=None, **kw) -> DecodeResult:
    from ..deer.decode import deer_policy

    return deer_policy(model, prompts, gen_len, drafter=drafter, **kw)


def _ss_draft_length(kw: dict) -> int:
    """Self-speculation draft length k: ``draft_length`` if given, else the harness's ``block_length``
    (NLD sweeps self-speculation by its block length), else 8."""
    kw.pop("threshold", None)
    k = kw.pop("draft_length", None)
    return int(k if k is not None else kw.get("block_length") or 8)


def _ss_linear(model, prompts, gen_len, **kw) -> DecodeResult:
    from ..speculative.linear import linear_self_speculation

    k = _ss_draft_length(kw)
    return linear_self_speculation(model, prompts, gen_len, draft_length=k, **kw)


def _ss_quadratic(model, prompts, gen_len, **kw) -> DecodeResult:
    from ..speculative.quadratic import quadratic_self_speculation

    k = _ss_draft_length(kw)
    return quadratic_self_speculation(model, prompts, gen_len, draft_length=k, **kw)


#: Registered decoding policies: name → ``decode(model, prompts, gen_len, **options) -> DecodeResult``.
POLICIES: dict[str, Callable[..., DecodeResult]] = {
    "ar_greedy": _ar_greedy,
    "ar_sample": _ar_sample,
    "confidence": _confidence,
    "serial": _serial,
    "sampler": _sampler,
    "ss_linear": _ss_linear,
    "ss_quadratic": _ss_quadratic,
    "deer": _deer,
}


#: Policies whose tokens become final a whole block at a time (block diffusion); the rest commit in order.
BLOCK_POLICIES: set[str] = {"confidence", "serial", "sampler"}


def register_policy(name: str, fn: Callable[..., DecodeResult], block_commits: bool = False) -> None:
    """Add a decoder to the registry under ``name`` (later stages register theirs from their own packages).
    ``block_commits``: its tokens become final a block at a time (block diffusion), which decides how
    :func:`~workbench.decoding.base.stop_at_eos` recounts forwards."""
    POLICIES[name] = fn
    if block_commits:
        BLOCK_POLICIES.add(name)


def get_policy(name: str) -> Callable[..., DecodeResult]:
    """The decode function of policy ``name``; raises :class:`DecodeError` listing the valid names.

    The function takes ``(model, prompts, gen_len, **options)``; with ``eos_id=<id>`` a free-running decode
    (no ``real_continuation``) stops each row at that token, as ``generate`` does
    (:func:`~workbench.decoding.base.stop_at_eos`)."""
    if name not in POLICIES:
        raise DecodeError(f"unknown decoding policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    fn = POLICIES[name]

    def decode(model, prompts, gen_len, eos_id: int | None = None, **kw) -> DecodeResult:
        res = fn(model, prompts, gen_len, **kw)
        if eos_id is None or kw.get("real_continuation") is not None:
            return res
        return stop_at_eos(res, eos_id, kw.get("block_length") if name in BLOCK_POLICIES else None)

    decode.__doc__ = fn.__doc__
    return decode


__all__ = ["POLICIES", "DecodeError", "DecodeResult", "get_policy", "register_policy", "ar_decode", "diffusion_decode"]
