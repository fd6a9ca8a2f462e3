"""Small real models shared by the sampling tests: distributions peaked enough that exact enumeration of short
continuations is cheap and speculative drafts are often accepted."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.model.trimode import TriModeLM


def peaked_model(scale: float, seed: int = 0) -> TriModeLM:
    """1-layer Llama, vocabulary of 7 ids (6 tokens + [MASK] = 6), its LM head scaled by ``scale`` (peaked
    distributions), in eval mode."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=7, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    bb = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        bb.lm_head.weight.mul_(scale)
    return TriModeLM(bb, 6)
