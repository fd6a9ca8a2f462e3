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


def ar_target_checkpoint(path, tok, vocab: int, seed: int = 1):
    """A tiny random Qwen2 AR model (2 layers, hidden 32) saved with ``save_pretrained`` beside ``tok`` at ``path``:
    an AR target for the drafters of released diffusion LMs. Returns ``path``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


#: A ChatML template (Qwen2.5's format, without its tool-calling branches).
CHATML_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                   "{%- endif %}")


def qwen2_chat_checkpoint(path, seed: int = 0):
    """A tiny random Qwen2 instruct model (2 layers, hidden 32, context 2048) saved with ``save_pretrained`` at
    ``path``, beside a small BPE tokenizer with Qwen's special tokens (``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>`` as its end of turn) and a ChatML chat template: the mechanics of an instruct model's HumanEval
    run (chat prompt, end-of-turn stop, code extraction). Returns ``path``."""
    from tokenizers import AddedToken
    from transformers import AutoConfig, AutoModelForCausalLM

    from conftest import bpe_tokenizer

    tok = bpe_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [AddedToken("<|im_start|>", special=True),
                                                          AddedToken("<|im_end|>", special=True)]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML_TEMPLATE
    cfg = AutoConfig.for_model("qwen2", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                               tie_word_embeddings=False)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path
