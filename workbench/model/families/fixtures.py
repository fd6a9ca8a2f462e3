"""Tiny random checkpoints in each family's exact on-disk layout: ``config.json`` with the released config's own
field set (:data:`RELEASED_CONFIGS`: every field of the release, training-only ones such as SDAR's
``"attn_implementation": "flex_attention"`` included, with tiny sizes), safetensors with the family's weight names,
a tokenizer with the family's mask token at the id the config names. Tests and benchmarks open them as a user opens
a released checkpoint.

The weights are random; the shapes are tiny (2 layers, hidden 32) unless ``sizes`` says otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .registry import get_family
from .spec import rename_key

#: Mask token text of each family's tokenizer (the released tokenizers' own strings).
MASK_TEXT = {"nld": "<mask>", "sdar": "<|MASK|>", "llada": "<|mdm_mask|>", "dream": "<|mask|>",
             "fast_dllm_v2": "|<MASK>|", "idlm": "<|MASK|>"}
#: The released ``config.json`` of each family (where each was read: docs/models.md, "What the released configs
#: carry"), whose field set the fixtures write. Sizes, token ids and the block size are replaced by the fixture's;
#: every other value is the release's.
_QWEN3_BASE = {"architectures": ["SDARForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
               "attn_implementation": "flex_attention", "bos_token_id": 151643, "block_size": 4,
               "mask_token_id": 151669, "fuse_cross_entropy": True, "head_dim": 128, "hidden_act": "silu",
               "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
               "max_position_embeddings": 32768, "max_window_layers": 36, "model_type": "sdar",
               "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
               "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16", "use_cache": False, "use_sliding_window": False, "vocab_size": 151936}
RELEASED_CONFIGS = {
    # JetAstra/SDAR training/model/SDAR-8B-Chat/config.json (c2041a8)
    "sdar": {**_QWEN3_BASE, "debug": False, "eos_token_id": 151643, "ep_size": 1, "micro_forward": False,
             "skip_checkpoint": False, "transformers_version": "4.52.4", "use_deepep": False},
    # thuEcstasy/I-DLM training/model/Qwen3-8B-b3-allmasked/config.json (3342a17): I-DLM-8B's stride 4
    "idlm": {**_QWEN3_BASE, "block_size": 3, "eos_token_id": 151645, "max_position_embeddings": 40960,
             "transformers_version": "4.51.0"},
    # every field of GSAI-ML/LLaDA-8B-Instruct's config.json (scripts/golden/make_dllm_golden.py, LLADA_CONFIG;
    # transformers_version and torch_dtype, which that list leaves out, as the golden fixture's save wrote them)
    "llada": {"activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
              "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
              "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                           "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                           "AutoModel": "modeling_llada.LLaDAModelLM"},
              "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 4096,
              "embedding_dropout": 0.0, "embedding_size": 126464, "eos_token_id": 126081, "flash_attention": False,
              "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
              "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
              "layer_norm_with_affine": True, "mask_token_id": 126336, "max_sequence_length": 4096,
              "mlp_hidden_size": 12288, "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
              "n_heads": 32, "n_kv_heads": 32, "n_layers": 32, "pad_token_id": 126081, "precision": "amp_bf16",
              "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True,
              "rope_theta": 500000.0, "scale_logits": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.57.6", "use_cache": False, "vocab_size": 126464, "weight_tying": False},
    # every field of Dream-org/Dream-v0-Instruct-7B's config.json (scripts/golden/make_dllm_golden.py, DREAM_CONFIG;
    # transformers_version and torch_dtype as for LLaDA)
    "dream": {"architectures": ["DreamModel"], "attention_dropout": 0.0,
              "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
              "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
              "initializer_range": 0.02, "intermediate_size": 18944, "mask_token_id": 151666,
              "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "Dream",
              "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "pad_token_id": 151643,
              "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.57.6",
              "use_cache": False, "use_sliding_window": False, "vocab_size": 152064},
    # Efficient-Large-Model/Fast_dLLM_v2_7B's config.json, as copied in Satgoy152/DualDiffusion
    # FastDLLM_inferencing/Fast_dLLM_v2_7B/config.json (9587d1e); the mask id is the token |<MASK>|'s
    "fast_dllm_v2": {"architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0,
                     "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                                  "AutoModel": "modeling.Fast_dLLM_QwenModel",
                                  "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
                     "bd_size": 32, "bos_token_id": 151643, "conplemenrary_mask": True, "eos_token_id": 151645,
                     "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
                     "intermediate_size": 18944, "layer_types": ["full_attention"] * 28,
                     "max_position_embeddings": 32768, "max_window_layers": 28, "model_type": "Fast_dLLM_Qwen",
                     "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
                     "pad_token_id": 151645, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
                     "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                     "transformers_version": "4.53.1", "use_cache": True, "use_sliding_window": False,
                     "vocab_size": 152064},
    # nvidia/Nemotron-Labs-Diffusion-8B's config.json, as quoted in full by public third-party notes
    "nld": {"ar_loss_weight": 1.0, "architectures": ["NemotronLabsDiffusionModel"], "attention_bias": False,
            "attention_dropout": 0.0, "attn_implementation": "sdpa",
            "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                         "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
            "block_size": 32, "bos_token_id": 1, "dlm_loss_weight": None, "dlm_paradigm": "bidirectional",
            "dp_varying_mask_ratio": False, "eos_token_id": 11, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "mask_token_id": 100,
            "max_position_embeddings": 262144, "mlp_bias": False, "model_type": "nemotron_labs_diffusion",
            "num_attention_heads": 32, "num_hidden_layers": 34, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
            "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                                "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 16384,
                                "rope_theta": 1000000.0, "rope_type": "yarn"},
            "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "5.0.0", "use_cache": False, "vocab_size": 131072},
}

#: Built-in config fields of the tiny fixtures (every family), before the family's own.
TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rms_norm_eps=1e-6)


def fixture_tokenizer(mask_text: str):
    """A byte-level tokenizer: 256 byte tokens, then ``<|endoftext|>`` (256) and the family's mask token (257)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ...tokenizer import _bytes_to_unicode

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True), AddedToken(mask_text, special=True)])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def write_family_checkpoint(family: str, out: str | Path, seed: int = 0, vocab_size: int = 264,
                            block_size: int | None = None, sizes: dict | None = None,
                            dtype: torch.dtype = torch.float32) -> Path:
    """Write a random checkpoint of ``family`` in its on-disk layout to ``out``; returns ``out``.

    The ``config.json`` holds the released config's field set (:data:`RELEASED_CONFIGS`, training-only fields
    included) with the fixture's sizes, token ids (end of text 256 is EOS and padding, no BOS, the mask 257) and
    block size; the weights are initialised from the config the loader itself builds from that file, so a fixture
    opens exactly as written.

    Args:
        family: a registered family name (DiffusionGemma: written by its native class).
        out: the folder to write (created).
        seed: seed of the random weights.
        vocab_size: embedding rows (≥ 258: bytes, end of text, mask).
        block_size: the config's block size (family default if None); ignored by families without one
            (LLaDA, Dream; I-DLM's config keeps I-DLM-8B's ``block_size: 3``, the mask slots of its stride 4).
        sizes: built-in config fields replacing :data:`TINY` (e.g. a real model's shape for a benchmark).
        dtype: dtype of the saved weights.

    Raises ``ValueError`` for a family without a built-in backbone or a released config.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from .load import backbone_config

    spec = get_family(family)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if family == "diffusion_gemma":
        return _write_diffusion_gemma(out, seed, vocab_size, block_size or 8, dtype)
    if spec.backbone is None or family not in RELEASED_CONFIGS:
        raise ValueError(f"family {family} has its own native class and no fixture writer")
    tok = fixture_tokenizer(MASK_TEXT[family])
    mask_id = tok.convert_tokens_to_ids(MASK_TEXT[family])
    fields = {**TINY, **(sizes or {}), "vocab_size": vocab_size, "eos_token_id": tok.eos_token_id,
              "pad_token_id": tok.pad_token_id, "bos_token_id": None, "tie_word_embeddings": False}
    fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    release = RELEASED_CONFIGS[family]
    if spec.inverse_config is not None:                                   # LLaDA's own field names
        fields = spec.inverse_config(fields)
    if spec.backbone == "ministral3":                                     # NLD's YaRN, at the fixture's length
        fields["rope_parameters"] = {**release["rope_parameters"],
                                     "original_max_position_embeddings": fields["max_position_embeddings"] // 16}
    raw = {k: v for k, v in release.items()}
    raw.update({k: v for k, v in fields.items() if k in release})
    if "max_window_layers" in release:
        raw["max_window_layers"] = fields.get("num_hidden_layers", raw["max_window_layers"])
    if "layer_types" in release:
        raw["layer_types"] = ["full_attention"] * fields["num_hidden_layers"]
    if spec.mask_field:
        raw[spec.mask_field] = mask_id
    if spec.block_field and spec.block_field in raw:
        raw[spec.block_field] = block_size or spec.default_block or 4
    cfg = backbone_config(spec, raw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    with torch.no_grad():                        # larger than the 0.02 init, so argmaxes differ between positions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    state = {rename_key(k, spec.inverse_renames): v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(out)
    return out


def _write_diffusion_gemma(out: Path, seed: int, vocab_size: int, canvas_length: int, dtype) -> Path:
    """A tiny DiffusionGemma (text MoE + a tiny vision tower) saved by its native class, with the fixture tokenizer;
    end of text (256) is its pad and EOS."""
    from transformers import (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DiffusionGemmaTextConfig,
                              Gemma4VisionConfig)

    from .diffusion_gemma import TINY_TEXT, TINY_VISION

    tok = fixture_tokenizer("<mask>")
    text = DiffusionGemmaTextConfig(vocab_size=vocab_size, **{**TINY_TEXT, "pad_token_id": tok.pad_token_id,
                                                               "eos_token_id": tok.eos_token_id, "bos_token_id": None})
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=Gemma4VisionConfig(**TINY_VISION),
                               canvas_length=canvas_length, boi_token_id=vocab_size - 4, eoi_token_id=vocab_size - 3,
                               image_token_id=vocab_size - 2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        DiffusionGemmaForBlockDiffusion(cfg).to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    return out


__all__ = ["write_family_checkpoint", "fixture_tokenizer", "MASK_TEXT", "TINY", "RELEASED_CONFIGS"]
