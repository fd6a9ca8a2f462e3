"""Decoding: AR and block-diffusion decoders of a tri-mode model, and the decoder registry.

Decoders are picked by name (:func:`get_policy`, :func:`get_decoder`). This package registers the ones it
implements; higher packages register theirs in their own ``decoders`` module (see :mod:`.registry`).
"""
from __future__ import annotations

from functools import partial

from .ar import ar_decode
from .base import DecodeError, DecodeResult, check_threshold, stop_at_eos
from .diffusion import diffusion_decode
from .registry import (DECODERS, DecoderSpec, get_decoder, get_policy, load_decoders,  # noqa: F401
                       register_decoder)
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


register_decoder(DecoderSpec("ar_greedy", _ar_greedy, family="ar", lossless=True,
                             description="AR greedy with a KV cache (the baseline; NLD §3.1)"))
register_decoder(DecoderSpec("ar_sample", _ar_sample, family="ar", temperature=True,
                             description="AR sampling at a temperature > 0"))
register_decoder(DecoderSpec("confidence", _confidence, sweep="block_length+threshold", block_commits=True,
                             ceiling="serial", description="block diffusion, commit every position with top-1 "
                             "probability ≥ τ (NLD §3.2)"))
register_decoder(DecoderSpec("serial", _serial, sweep="block_length", block_commits=True, ceiling="serial",
                             description="block diffusion, one position per forward: the serial target (NLD §4.1)"))

from . import families as _families  # noqa: E402,F401  (registers the released families' own decoders)

#: Name → decode function of every decoder registered so far (a view kept for older callers).
POLICIES = DECODERS


def register_policy(name: str, fn, block_commits: bool = False) -> None:
    """Register a bare decode function under ``name`` (a :class:`DecoderSpec` with defaults)."""
    register_decoder(DecoderSpec(name, fn, block_commits=block_commits))


__all__ = ["DECODERS", "DecoderSpec", "DecodeError", "DecodeResult", "get_decoder", "get_policy", "load_decoders",
           "register_decoder", "register_policy", "ar_decode", "diffusion_decode", "stop_at_eos"]
