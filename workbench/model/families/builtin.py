"""The registered families of released diffusion LMs: one :class:`~workbench.model.families.spec.FamilySpec` each.

Each entry names the built-in transformers class that computes the family, how its weight names and config
fields map to that class, and its decoding semantics, read from the family's own code (``reference``). Adding a
family is one entry here (listed in :data:`BUILTIN_FAMILIES`, which
:mod:`~workbench.model.families.registry` registers) or a
:func:`~workbench.model.families.registry.register_family` call elsewhere, plus its tests in
``tests/test_dllm_families.py``.
"""
from __future__ import annotations

from .adapters import BlockCausalFamilyLM, CausalFamilyLM, RecomputeFamilyLM, WindowFamilyLM
from .spec import FamilySpec

#: Fields of a released config that belong to the family, not to the built-in backbone's config.
_OWN_FIELDS = ("model_type", "architectures", "auto_map", "mask_token_id", "block_size", "bd_size",
               "transformers_version", "torch_dtype", "dtype")

#: Training-time fields of the released configs (where each was found: docs/models.md, "What the released
#: configs carry"), never passed to the backbone: inference takes none of them from the checkpoint.
TRAINING_ONLY = {
    "attn_implementation": "the training run's attention kernel (flex_attention in SDAR's and I-DLM's configs); "
                           "the workbench chooses its own (--attn_implementation)",
    "_attn_implementation": "as attn_implementation",
    "fuse_cross_entropy": "a fused training loss (SDAR, I-DLM)",
    "debug": "SDAR trainer switch",
    "ep_size": "SDAR trainer's expert-parallel size",
    "micro_forward": "SDAR trainer switch",
    "skip_checkpoint": "SDAR trainer's activation-checkpointing switch",
    "use_deepep": "SDAR trainer's DeepEP switch",
    "use_regular_causal": "I-DLM trainer's clean-region mask (read only as evidence of an I-DLM folder)",
    "conplemenrary_mask": "Fast-dLLM v2's complementary training mask",
    "dlm_paradigm": "NLD's training paradigm (its inference attention is the family's, docs/models.md)",
    "dlm_type": "NLD's training objective",
    "ar_loss_weight": "NLD's training loss weight",
    "dlm_loss_weight": "NLD's training loss weight",
    "dp_varying_mask_ratio": "NLD's training noise schedule",
    "use_cache": "the workbench passes use_cache with every forward (false in most released configs)",
}


def _passthrough(raw: dict) -> dict:
    """The built-in config's fields of a family that keeps its backbone's field names (Qwen2, Qwen3, Ministral3),
    without the family's own fields and the training-only ones (:data:`TRAINING_ONLY`)."""
    return {k: v for k, v in raw.items() if k not in _OWN_FIELDS and k not in TRAINING_ONLY}


#: ``block_size`` of the published I-DLM configs: N − 1 mask slots for an ISD stride of N (thuEcstasy/I-DLM
#: ``training/model/Qwen3-8B-b{1,2,3}-allmasked/config.json``; 7 for the N = 8 model in a public fork's model card).
IDLM_BLOCK_SIZES = (1, 2, 3, 7)
#: ``block_size`` of SDAR's releases: 4 (the default models), 8, 16, 32 and 64 (JetAstra/SDAR README).
SDAR_BLOCK_SIZES = (4, 8, 16, 32, 64)


def _idlm_evidence(raw: dict) -> str | None:
    """Why an SDAR-format config looks like I-DLM, or ``None``: ``use_regular_causal`` (a field of I-DLM's own
    ``SDARConfig``, absent from SDAR's), or a block size only I-DLM's configs carry."""
    if raw.get("use_regular_causal") is True:
        return "use_regular_causal: true (a field of I-DLM's SDARConfig, not SDAR's)"
    block = raw.get("block_size")
    if block in IDLM_BLOCK_SIZES:
        return f"block_size {block} (I-DLM's {block} mask slots for a stride of {block + 1}; no SDAR release has it)"
    return None


def _sdar_evidence(raw: dict) -> str:
    """Why an SDAR-format config is taken as SDAR (I-DLM's evidence absent)."""
    block = raw.get("block_size")
    if block in SDAR_BLOCK_SIZES:
        return f"block_size {block} (an SDAR release's block size)"
    return f"block_size {block} (neither family's published block size; SDAR owns the format)"


# LLaDA's config uses the OLMo field names of its modeling file (``configuration_llada.py``).
_LLADA_FIELDS = {"d_model": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
                 "n_kv_heads": "num_key_value_heads", "max_sequence_length": "max_position_embeddings",
                 "rope_theta": "rope_theta", "rms_norm_eps": "rms_norm_eps", "pad_token_id": "pad_token_id",
                 "eos_token_id": "eos_token_id", "bos_token_id": "bos_token_id"}


def _llada_config(raw: dict) -> dict:
    """LLaDA's OLMo-style fields → ``LlamaConfig`` fields. The embedding has ``embedding_size`` rows (the vocabulary
    padded up), which is the logits' width; the MLP width is ``mlp_hidden_size`` (else ``mlp_ratio × d_model``)."""
    out = {dst: raw[src] for src, dst in _LLADA_FIELDS.items() if raw.get(src) is not None}
    out["vocab_size"] = int(raw.get("embedding_size") or raw["vocab_size"])
    out["intermediate_size"] = int(raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * raw["d_model"])
    out.setdefault("num_key_value_heads", out.get("num_attention_heads"))
    out["attention_bias"] = bool(raw.get("include_bias") or raw.get("include_qkv_bias"))
    out["mlp_bias"] = bool(raw.get("include_bias"))
    out["tie_word_embeddings"] = bool(raw.get("weight_tying"))
    out["hidden_act"] = "silu"
    return out


def _llada_inverse(cfg: dict) -> dict:
    """``LlamaConfig`` fields → LLaDA's field names (for writing a checkpoint in LLaDA's layout)."""
    out = {src: cfg[dst] for src, dst in _LLADA_FIELDS.items() if cfg.get(dst) is not None}
    out.update(vocab_size=cfg["vocab_size"], embedding_size=cfg["vocab_size"], mlp_hidden_size=cfg["intermediate_size"],
               mlp_ratio=4, include_bias=False, include_qkv_bias=bool(cfg.get("attention_bias")),
               weight_tying=bool(cfg.get("tie_word_embeddings")), block_type="llama", layer_norm_type="rms",
               activation_type="silu", rope=True, alibi=False, flash_attention=False, scale_logits=False)
    return out


#: LLaDA's weight names (``modeling_llada.py``: ``model.transformer.{wte, blocks.i.*, ln_f, ff_out}``) → Llama's.
LLADA_RENAMES = (
    (r"^model\.transformer\.ff_out\.", "lm_head."),
    (r"^model\.transformer\.wte\.", "model.embed_tokens."),
    (r"^model\.transformer\.ln_f\.", "model.norm."),
    (r"^model\.transformer\.blocks\.", "model.layers."),
    (r"\.attn_out\.", ".self_attn.o_proj."),
    (r"\.q_proj\.", ".self_attn.q_proj."),
    (r"\.k_proj\.", ".self_attn.k_proj."),
    (r"\.v_proj\.", ".self_attn.v_proj."),
    (r"\.ff_proj\.", ".mlp.gate_proj."),
    (r"\.up_proj\.", ".mlp.up_proj."),
    (r"\.ff_out\.", ".mlp.down_proj."),
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ff_norm\.", ".post_attention_layernorm."),
)

#: Llama's weight names → LLaDA's (writing a checkpoint in LLaDA's layout).
LLADA_INVERSE = (
    (r"^lm_head\.", "model.transformer.ff_out."),
    (r"^model\.embed_tokens\.", "model.transformer.wte."),
    (r"^model\.norm\.", "model.transformer.ln_f."),
    (r"\.self_attn\.o_proj\.", ".attn_out."),
    (r"\.self_attn\.", "."),
    (r"\.mlp\.gate_proj\.", ".ff_proj."),
    (r"\.mlp\.up_proj\.", ".up_proj."),
    (r"\.mlp\.down_proj\.", ".ff_out."),
    (r"\.input_layernorm\.", ".attn_norm."),
    (r"\.post_attention_layernorm\.", ".ff_norm."),
    (r"^model\.layers\.", "model.transformer.blocks."),
)

#: NLD's weight names: the Ministral3 backbone under ``encoder.``, the (untied) head ``diffusion_head``.
NLD_RENAMES = ((r"^encoder\.", "model."), (r"^diffusion_head\.", "lm_head."))
NLD_INVERSE = ((r"^model\.", "encoder."), (r"^lm_head\.", "diffusion_head."))

NLD = FamilySpec(
    name="nld", model_types=("nemotron_labs_diffusion", "ministral_dlm"), backbone="ministral3",
    adapter=WindowFamilyLM, key_renames=NLD_RENAMES, inverse_renames=NLD_INVERSE, config_map=_passthrough,
    default_block=32,
    diffusion_attention="window", commit_attention="causal", modes=frozenset({"diffusion", "ar"}),
    reference="vLLM vllm/model_executor/models/nemotron_dllm.py; NLD remote code generate_with_prefix_cache_block_diff",
    description="Nemotron-Labs-Diffusion 3B/8B/14B (Ministral3; block 32; causal prefix, block bidirectional, "
                "AR mode)")

SDAR = FamilySpec(
    name="sdar", model_types=("sdar",), backbone="qwen3", adapter=BlockCausalFamilyLM, config_map=_passthrough,
    default_block=4, matches=_sdar_evidence, diffusion_attention="block_causal", commit_attention="block_causal",
    aligned=True,
    reference="JetAstra/SDAR generate.py block_diffusion_generate",
    description="SDAR (Qwen3; block-causal at absolute positions, block 4)")

LLADA = FamilySpec(
    name="llada", model_types=("llada",), backbone="llama", adapter=RecomputeFamilyLM, key_renames=LLADA_RENAMES,
    inverse_renames=LLADA_INVERSE, config_map=_llada_config, inverse_config=_llada_inverse, block_field=None,
    diffusion_attention="full",
    commit_attention=None, reference="ML-GSAI/LLaDA generate.py; modeling_llada.py",
    description="LLaDA-8B (Llama with renamed weights; fully bidirectional, no KV cache)")

DREAM = FamilySpec(
    name="dream", model_types=("Dream",), backbone="qwen2", adapter=RecomputeFamilyLM, config_map=_passthrough,
    block_field=None, diffusion_attention="full", commit_attention=None, shift=True,
    reference="Dream generation_utils.py diffusion_generate / _sample",
    description="Dream-7B (Qwen2; fully bidirectional, shifted logits, no KV cache)")

FAST_DLLM_V2 = FamilySpec(
    name="fast_dllm_v2", model_types=("Fast_dLLM_Qwen",), backbone="qwen2", adapter=BlockCausalFamilyLM,
    config_map=_passthrough, mask_field=None, mask_token="|<MASK>|", block_field="bd_size", default_block=32,
    diffusion_attention="block_causal",
    commit_attention="block_causal", shift=True, aligned=True,
    reference=("NVlabs/Fast-dLLM v2/ (modeling + generate; the mask id 151665 is the token |<MASK>|, not a "
               "config field)"),
    description="Fast-dLLM v2 (Qwen2; block-causal at absolute positions, bd_size 32, shifted logits)")

IDLM = FamilySpec(
    name="idlm", model_types=(), backbone="qwen3", adapter=CausalFamilyLM, config_map=_passthrough, block_field=None,
    diffusion_attention="causal", commit_attention="causal", shift=True, modes=frozenset({"diffusion", "ar"}),
    format_of="sdar", matches=_idlm_evidence,
    reference="I-DLM (SDAR format, converted Qwen3): strictly causal, shifted; SGLang IDLMBlockN",
    description="I-DLM-8B (Qwen3 in SDAR's format; causal, shifted, AR mode)")



def _load_diffusion_gemma(path, raw: dict, device, dtype, attn_implementation: str):
    """DiffusionGemma's native class (transformers 5.24), loaded strictly from the folder with the workbench's
    attention implementation (never the config's)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from .load import load_weights

    return load_weights(DiffusionGemmaForBlockDiffusion, path, "diffusion_gemma", dtype=dtype,
                        attn_implementation=attn_implementation)


def _diffusion_gemma_adapter(backbone, spec, mask_token_id, block_size):
    from .diffusion_gemma import DiffusionGemmaLM

    model = DiffusionGemmaLM(backbone)
    model.family, model.block_size = spec, block_size
    return model


DIFFUSION_GEMMA = FamilySpec(
    name="diffusion_gemma", model_types=("diffusion_gemma",), backbone=None, adapter=_diffusion_gemma_adapter,
    loader=_load_diffusion_gemma, mask_field=None, block_field="canvas_length", default_block=256,
    diffusion_attention="window", commit_attention="causal",
    reference="transformers 5.24 models/diffusion_gemma (DiffusionGemmaGenerationMixin.generate)",
    description="DiffusionGemma (native transformers class; no mask token, canvases of random tokens re-noised)")

#: Every built-in family, in the order the registry tries them.
BUILTIN_FAMILIES = (NLD, SDAR, LLADA, DREAM, FAST_DLLM_V2, IDLM, DIFFUSION_GEMMA)

__all__ = ["BUILTIN_FAMILIES", "TRAINING_ONLY", "IDLM_BLOCK_SIZES", "SDAR_BLOCK_SIZES", "NLD", "SDAR", "LLADA", "DREAM", "FAST_DLLM_V2", "IDLM", "DIFFUSION_GEMMA",
           "LLADA_RENAMES", "NLD_RENAMES"]
