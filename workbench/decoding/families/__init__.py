"""Family-specific decoders: a released diffusion LM's own reference sampler, re-implemented on the workbench's
model interface and registered beside the workbench's policies, so the leaderboard compares them. Each names the
upstream file and function it reproduces (:attr:`~workbench.decoding.registry.DecoderSpec.reference`), takes that
function's options (any other is refused in one line) and stops at an EOS as it does
(:attr:`~workbench.decoding.registry.DecoderSpec.own_eos_rule`)."""
from __future__ import annotations

from functools import partial

from ..registry import DecoderSpec, register_decoder
from ..base import DecodeError
from .aligned import fast_dllm_v2_decode, sdar_decode
from .diffusion_gemma import entropy_bound_decode, resolve_settings
from .dream import ALGORITHMS, dream_decode
from .fast_dllm_v1 import prefix_cache_decode
from .llada import llada_decode
from .nld import nld_generate_decode
from .stopping import cut_at_eos

register_decoder(DecoderSpec(
    "llada", llada_decode, sweep="block_length", block_commits=True, ceiling="serial", real_context=False,
    reference_of=("llada",), own_eos_rule=True,
    reference="ML-GSAI/LLaDA generate.py: generate (cfg_scale, remasking 'low_confidence' / 'random', Gumbel-max "
    "sampling at temperature > 0; not logits_eos_inf, confidence_eos_eot_inf)",
    description="LLaDA's generate: semi-AR blocks, a fixed number of transfers per step (LLaDA generate.py)"))
for _alg in ALGORITHMS:
    register_decoder(DecoderSpec(
        f"dream_{_alg}", partial(dream_decode, alg=_alg), ceiling="serial", real_context=False,
        reference_of=("dream",), own_eos_rule=True,
        reference=f"Dream-org/Dream-v0-Instruct-7B generation_utils.py: DreamGenerationMixin._sample via "
        f"diffusion_generate, alg='{_alg}' (temperature, top_p, top_k, alg_temp, eps; the hub file as vendored by "
        "ZHZisZZ/dllm)",
        description=f"Dream's diffusion_generate, {_alg} ordering (Dream generation_utils.py)"))


def _diffusion_gemma(model, prompts, gen_len, block_length=None, threshold=None, real_continuation=None,
                     eos_id=None, seed=0, max_denoising_steps=None, entropy_bound=None, t_min=None, t_max=None,
                     stability_threshold=None, confidence_threshold=None, eos_token_id=None, pad_token_id=None,
                     pad_id=0, precision="fp32"):
    """:func:`~.diffusion_gemma.entropy_bound_decode` under the registry's call. Its canvas length is the model's:
    a ``block_length`` or ``threshold`` is refused. ``generate`` finishes a row at its ``eos_token_id`` (given, else
    the checkpoint's generation config's, else ``eos_id``), counting no forward after it; tokens are cut after the
    first ``eos_id``. Free-running only."""
    if real_continuation is not None:
        raise DecodeError("the diffusion_gemma decoder has no real-context mode (its canvases follow its own output)")
    if block_length is not None or threshold is not None:
        raise DecodeError("the diffusion_gemma decoder decodes the model's own canvases by entropy-bound acceptance; "
                          "it takes no block_length or threshold")
    if eos_token_id is None and resolve_settings(model)["eos_token_id"] is None:
        eos_token_id = eos_id
    res = entropy_bound_decode(model, prompts, gen_len, seed=seed, max_denoising_steps=max_denoising_steps,
                               entropy_bound=entropy_bound, t_min=t_min, t_max=t_max,
                               stability_threshold=stability_threshold, confidence_threshold=confidence_threshold,
                               eos_token_id=eos_token_id, pad_token_id=pad_token_id, pad_id=pad_id,
                               precision=precision)
    return cut_at_eos(res, eos_id)


register_decoder(DecoderSpec(
    "diffusion_gemma", _diffusion_gemma, real_context=False, reference_of=("diffusion_gemma",), own_eos_rule=True,
    reference="transformers 5.24 models/diffusion_gemma/generation_diffusion_gemma.py: "
    "DiffusionGemmaGenerationMixin.generate (_denoising_step, _finalize_canvas)",
    description="DiffusionGemma's generate: entropy-bound acceptance with re-noising, "
    "self-conditioning, stable-and-confident stopping (transformers 5.24)"))

register_decoder(DecoderSpec(
    "sdar", sdar_decode, block_commits=True, ceiling="serial", real_context=False, reference_of=("sdar",),
    own_eos_rule=True,
    reference="JetAstra/SDAR evaluation/opencompass/opencompass/models/huggingface_bd3.py: block_diffusion_generate "
    "(eval_sdar_hf.py's temperature=1.0, top_k=1, remasking='low_confidence', denoising_steps=block_length); "
    "not generate.py, which has no greedy path",
    description="SDAR's evaluation loop (huggingface_bd3.py): every token above 0.85, else the top-k of an even "
    "schedule"))
register_decoder(DecoderSpec(
    "fast_dllm_v2", fast_dllm_v2_decode, block_commits=True, ceiling="serial", real_context=False,
    reference_of=("fast_dllm_v2",), own_eos_rule=True,
    reference="NVlabs/Fast-dLLM v2/generation_functions.py: Fast_dLLM_QwenForCausalLM.batch_sample (temperature 0, "
    "use_block_cache=False; upstream 8292f3c, read from the fork ydshi0/Fast-dLLM)",
    description="Fast-dLLM v2's batch_sample: threshold decoding in sub-blocks of 8, the next block seeded with the "
    "commit's greedy token"))

register_decoder(DecoderSpec(
    "nld_ar_seeded", nld_generate_decode, sweep="block_length+threshold", block_commits=True, ceiling="serial",
    needs_mode="ar", reference_of=("nld",), own_eos_rule=True,
    reference="NLD Hugging Face remote code chat_utils.py: generate_with_prefix_cache_block_diff (causal_context="
    "True, shift_logits=False, remasking='low_confidence', temperature 0, a threshold), as generate_diffusion calls "
    "it",
    description="NLD's HF generate_diffusion: each block starts with the AR token, then confidence ≥ τ over the "
    "whole vocabulary (the all-masks start of vLLM is 'confidence')"))

register_decoder(DecoderSpec(
    "confidence_prefix_cache", prefix_cache_decode, sweep="block_length+threshold", block_commits=True,
    ceiling="serial", reference_of=("llada", "dream"), approximates="confidence", own_eos_rule=True,
    reference="NVlabs/Fast-dLLM (v1) llada/generate.py: generate_with_prefix_cache (threshold); "
    "dream/model/generation_utils_block.py: DreamGenerationMixin._sample (alg='confidence_threshold', "
    "dual_cache=False)",
    description="Fast-dLLM v1's threshold decoding with its prefix cache (approximate: the prefix's keys are "
    "computed once per block); on Dream, block position 0 comes from the block's first forward"))
