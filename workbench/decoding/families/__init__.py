"""Family-specific decoders: a released diffusion LM's own reference sampler, re-implemented on the workbench's
model interface and registered beside the workbench's policies, so the leaderboard compares them (issue 57 §3)."""
from __future__ import annotations

from functools import partial

from ..registry import DecoderSpec, register_decoder
from ..base import DecodeError, check_threshold
from ..diffusion import diffusion_decode
from ..rules import confidence_rule
from .aligned import fast_dllm_v2_decode, sdar_decode
from .diffusion_gemma import entropy_bound_decode
from .dream import ALGORITHMS, dream_decode
from .llada import llada_decode

register_decoder(DecoderSpec("llada", llada_decode, sweep="block_length", block_commits=True, ceiling="serial",
                             real_context=False, reference_of=("llada",),
                             description="LLaDA's generate: semi-AR blocks, a fixed number of low-confidence transfers "
                             "per step (LLaDA generate.py)"))
for _alg in ALGORITHMS:
    register_decoder(DecoderSpec(f"dream_{_alg}", partial(dream_decode, alg=_alg), ceiling="serial", real_context=False,
                                 reference_of=("dream",),
                                 description=f"Dream's diffusion_generate, {_alg} ordering "
                                 "(Dream generation_utils.py)"))


def _diffusion_gemma(model, prompts, gen_len, block_length=None, threshold=None, real_continuation=None, **kw):
    """:func:`~.diffusion_gemma.entropy_bound_decode` under the registry's call (its canvas length is the model's;
    ``block_length`` and ``threshold`` of the leaderboard's grid do not apply). Free-running only."""
    if real_continuation is not None:
        raise DecodeError("the diffusion_gemma decoder has no real-context mode (its canvases follow its own output)")
    return entropy_bound_decode(model, prompts, gen_len, **kw)


register_decoder(DecoderSpec("diffusion_gemma", _diffusion_gemma, real_context=False, reference_of=("diffusion_gemma",),
                             description="DiffusionGemma's generate: entropy-bound acceptance with re-noising, "
                             "self-conditioning, stable-and-confident stopping (transformers 5.24)"))


register_decoder(DecoderSpec("sdar", sdar_decode, block_commits=True, ceiling="serial", real_context=False,
                             reference_of=("sdar",), description="SDAR's block_diffusion_generate, "
                             "low_confidence_dynamic: every token above 0.85, else the top-k of an even schedule"))
register_decoder(DecoderSpec("fast_dllm_v2", fast_dllm_v2_decode, block_commits=True, ceiling="serial",
                             real_context=False, reference_of=("fast_dllm_v2",),
                             description="Fast-dLLM v2's generate: threshold decoding in sub-blocks of 8, the next "
                             "block seeded with the commit's greedy token"))


def _nld_ar_seeded(model, prompts, gen_len, block_length: int, threshold: float = 0.9, **kw):
    """NLD's Hugging Face ``generate_diffusion``: block position 0 is the AR next token, then the confidence rule
    (every position ≥ τ and at least the top one); vLLM's all-masks start is the ``confidence`` decoder."""
    rule = partial(confidence_rule, threshold=check_threshold(threshold))
    return diffusion_decode(model, prompts, gen_len, block_length, rule, seed_block_start=True, **kw)


register_decoder(DecoderSpec("nld_ar_seeded", _nld_ar_seeded, sweep="block_length+threshold", block_commits=True,
                             ceiling="serial", needs_mode="ar", reference_of=("nld",),
                             description="NLD's HF generate_diffusion: each block starts with the AR token, then "
                             "confidence ≥ τ (the all-masks start of vLLM is 'confidence')"))


def _confidence_prefix_cache(model, prompts, gen_len, block_length: int, threshold: float = 0.9, **kw):
    """The ``confidence`` decoder with Fast-dLLM v1's prefix cache: an approximation for the families whose exact
    path recomputes the whole sequence every forward (LLaDA, Dream)."""
    approximate = getattr(model, "approximate_prefix_cache", None)
    if approximate is None:
        raise DecodeError("confidence_prefix_cache approximates the full recompute of LLaDA and Dream; this model's "
                          "forward has an exact cache (use confidence)")
    rule = partial(confidence_rule, threshold=check_threshold(threshold))
    with approximate():
        return diffusion_decode(model, prompts, gen_len, block_length, rule, **kw)


register_decoder(DecoderSpec("confidence_prefix_cache", _confidence_prefix_cache, sweep="block_length+threshold",
                             block_commits=True, ceiling="serial", reference_of=("llada", "dream"),
                             approximates="confidence",
                             description="confidence ≥ τ with Fast-dLLM v1's prefix cache (approximate: the "
                             "prefix's "
                             "keys are computed once per block)"))
