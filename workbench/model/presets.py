"""Model presets: plain ``transformers`` Llama configs for the byte-level vocabulary.

* ``micro``: tests; trains in seconds.
* ``tiny``: the embedded CPU model shipped in the repository (head size 64: at head size 32 the
  attention kernel dominated a CPU training step).
* ``small``: a GPU preset.
* ``deer_drafter``: the separate small diffusion drafter of DEER (arXiv:2512.15176 §3) for the ``tiny`` target
  (d = 128, 3 layers, head size 64: about 1/8 of the target's parameters).
"""
from __future__ import annotations

from transformers import LlamaConfig

from ..tokenizer import EOS_ID

#: Byte vocabulary (256) + 3 specials, padded to a multiple of 8 for efficient matmuls.
BYTE_MODEL_VOCAB = 264

_PRESETS = {
    "micro": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, max_position_embeddings=1024),
    "tiny": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=4, max_position_embeddings=1024),
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=12, max_position_embeddings=2048),
    "deer_drafter": dict(hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=1024),
}
PRESETS = tuple(_PRESETS)


def preset_sizes(name: str) -> dict:
    """Width, depth, heads and context of preset ``name`` (the fields :func:`preset_config` sets). Raises
    ``ValueError`` listing the valid presets for an unknown name."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return dict(_PRESETS[name])


def preset_config(name: str, vocab_size: int = BYTE_MODEL_VOCAB) -> LlamaConfig:
    """The ``LlamaConfig`` of preset ``name`` (``micro``, ``tiny``, ``small`` or ``deer_drafter``).

    Raises ``ValueError`` listing the valid presets for an unknown name.
    """
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=True, rms_norm_eps=1e-5,
                       rope_theta=10000.0, attention_dropout=0.0, pad_token_id=EOS_ID, eos_token_id=EOS_ID,
                       bos_token_id=None, **_PRESETS[name], attn_implementation="sdpa")
