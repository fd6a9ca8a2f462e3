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


#: Options of the block-diffusion decoders built on :func:`diffusion_decode` (besides the rule's own).
DIFFUSION_OPTIONS = ("block_length", "real_continuation", "use_cache", "pad_id", "precision", "on_step",
                     "commit_last_block")
#: Options of :func:`ar_decode` (``threshold``: a knob of the block decoders, accepted and unused).
AR_OPTIONS = ("threshold", "use_cache", "real_continuation", "block_length", "pad_id", "precision", "stop_ids")

register_decoder(DecoderSpec("ar_greedy", _ar_greedy, family="ar", lossless=True, options=AR_OPTIONS,
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) §3.1: AR greedy decoding, the "
                             "baseline",
                             description="AR greedy with a KV cache (the baseline; NLD §3.1)"))
register_decoder(DecoderSpec("ar_sample", _ar_sample, family="ar", temperature=True,
                             options=AR_OPTIONS + ("temperature", "seed", "top_k", "top_p"),
                             reference="own: AR sampling with transformers generate's temperature, top-k, top-p order",
                             description="AR sampling at a temperature > 0"))
register_decoder(DecoderSpec("confidence", _confidence, sweep="block_length+threshold", block_commits=True,
                             ceiling="serial", options=DIFFUSION_OPTIONS + ("threshold",),
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) §3.2 (Fast-dLLM's confidence "
                             "threshold, every block starting from masks as vLLM's NLD); own: the mask token is "
                             "never predicted",
                             description="block diffusion, commit every position with top-1 "
                             "probability ≥ τ (NLD §3.2)"))
register_decoder(DecoderSpec("serial", _serial, sweep="block_length", block_commits=True, ceiling="serial",
                             options=DIFFUSION_OPTIONS + ("threshold",),
                             reference="Nemotron-Labs-Diffusion (arXiv:2607.05722) §4.1: serial denoising, k = 1 "
                             "(threshold accepted and unused)",
                             description="block diffusion, one position per forward: the serial target (NLD §4.1)"))

from . import families as _families  # noqa: E402,F401  (registers the released families' own decoders)

#: Name → decode function of every decoder registered so far (a view kept for older callers).
POLICIES = DECODERS


def register_policy(name: str, fn, block_commits: bool = False) -> None:
    """Register a bare decode function under ``name`` (a :class:`DecoderSpec` with defaults)."""
    register_decoder(DecoderSpec(name, fn, block_commits=block_commits))


__all__ = ["DECODERS", "DecoderSpec", "DecodeError", "DecodeResult", "get_decoder", "get_policy", "load_decoders",
           "register_decoder", "register_policy", "ar_decode", "diffusion_decode", "stop_at_eos"]
