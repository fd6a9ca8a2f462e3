"""Tiny random checkpoints in each family's exact on-disk layout: ``config.json`` with the family's
``model_type`` and field names, safetensors with the family's weight names, a tokenizer with the family's mask
token at the id the config names. Tests and benchmarks open them as a user opens a released checkpoint.

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

    Args:
        family: a registered family name with a built-in backbone.
        out: the folder to write (created).
        seed: seed of the random weights.
        vocab_size: embedding rows (≥ 258: bytes, end of text, mask).
        block_size: the config's block size (family default if None).
        sizes: built-in config fields replacing :data:`TINY` (e.g. a real model's shape for a benchmark).
        dtype: dtype of the saved weights.

    Raises ``ValueError`` for a family without a built-in backbone.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = get_family(family)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if family == "diffusion_gemma":
        return _write_diffusion_gemma(out, seed, vocab_size, block_size or 8, dtype)
    if spec.backbone is None:
        raise ValueError(f"family {family} has its own native class and no fixture writer")
    tok = fixture_tokenizer(MASK_TEXT[family])
    mask_id = tok.convert_tokens_to_ids(MASK_TEXT[family])
    fields = {**TINY, **(sizes or {}), "vocab_size": vocab_size, "eos_token_id": tok.eos_token_id,
              "pad_token_id": tok.pad_token_id, "bos_token_id": None, "tie_word_embeddings": False}
    if spec.backbone in ("qwen3", "ministral3"):
        fields.setdefault("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    if spec.backbone == "ministral3":
        fields["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,   # NLD's YaRN
                                     "original_max_position_embeddings": fields["max_position_embeddings"] // 16,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                     "llama_4_scaling_beta": 0.1}
    cfg = AutoConfig.for_model(spec.backbone, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype)
    with torch.no_grad():                        # larger than the 0.02 init, so argmaxes differ between positions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    state = {rename_key(k, spec.inverse_renames): v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = {k: v for k, v in cfg.to_dict().items() if k not in ("architectures", "model_type", "transformers_version",
                                                                  "dtype", "torch_dtype")}
    if spec.inverse_config is not None:
        raw = spec.inverse_config(raw)
    raw["model_type"] = spec.model_types[0] if spec.model_types else "sdar"
    raw["architectures"] = [_ARCHITECTURE[family]]
    raw["auto_map"] = {"AutoConfig": f"configuration_{family}.Config", "AutoModel": f"modeling_{family}.Model"}
    if spec.mask_field:
        raw[spec.mask_field] = mask_id
    if spec.block_field:
        raw[spec.block_field] = block_size or spec.default_block or 4
    if family == "idlm":
        raw["block_size"] = 1
    (out / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True, default=str) + "\n")
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


#: ``architectures`` of each family's released config.json.
_ARCHITECTURE = {"nld": "NemotronLabsDiffusionModel", "sdar": "SDARForCausalLM", "llada": "LLaDAModelLM",
                 "dream": "DreamModel", "fast_dllm_v2": "Fast_dLLM_QwenForCausalLM", "idlm": "SDARForCausalLM"}

__all__ = ["write_family_checkpoint", "fixture_tokenizer", "MASK_TEXT", "TINY"]
