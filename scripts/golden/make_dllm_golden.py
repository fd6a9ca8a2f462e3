"""Make the golden LLaDA and Dream fixtures under tests/data/dllm_golden/.

The fixtures are tiny random checkpoints in each family's released on-disk
layout, plus the logits and the ``generate`` outputs that the families' OWN
reference code computes on them.  The reference code is not part of this
repository and is never imported by the workbench: this script loads it from
directories given on the command line, in a scratch environment.

Environment (outside the repository)::

    python3.11 -m venv /tmp/golden_venv
    /tmp/golden_venv/bin/pip install "transformers==4.57.6"
    # reuse the main venv's CPU torch; the scratch venv's own packages come first
    echo /work/main/.venv/lib/python3.11/site-packages \
        > /tmp/golden_venv/lib/python3.11/site-packages/zz_main_torch.pth

Reference files (copied out of public git repositories, see PROVENANCE.md in
each fixture folder for the exact repository, commit and path of each)::

    LLADA_REF/  modeling_llada.py  configuration_llada.py  generate.py
    DREAM_REF/  modeling_dream.py  configuration_dream.py  generation_utils.py

Run from the repository root::

    /tmp/golden_venv/bin/python scripts/golden/make_dllm_golden.py \
        --llada-ref /tmp/golden_ref/llada --dream-ref /tmp/golden_ref/dream \
        --out tests/data/dllm_golden

Everything is fp32 on CPU, single-threaded, with fixed seeds; rerunning
reproduces the files byte for byte on the same torch build (the weights are
drawn from torch's CPU generator, so another torch version may draw other
numbers: in that case regenerate the whole folder, never a part of it). On
another CPU ``reference_logits.safetensors`` may differ in the last bits (3.6e-6
seen; the tests allow 1e-5) while every other file is identical; cases added to
``reference.json`` then replace that file only (PROVENANCE.md says so).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import sys
import types
from pathlib import Path

import torch

SEED = 20250611

# --------------------------------------------------------------------------
# loading the reference code from a directory, as a package (their files use
# relative imports such as ``from .configuration_llada import ...``)
# --------------------------------------------------------------------------


def load_package(name: str, directory: Path) -> types.ModuleType:
    directory = directory.resolve()
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    package = importlib.util.module_from_spec(spec)
    package.__path__ = [str(directory)]  # type: ignore[attr-defined]
    sys.modules[name] = package
    return package


def import_from(package: str, module: str) -> types.ModuleType:
    return importlib.import_module(f"{package}.{module}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_blob(path: Path) -> str:
    """The id git gives the file's content (``git hash-object``)."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def reference_files(directory: Path, names: tuple[str, ...]) -> dict:
    return {n: {"git_blob": git_blob(directory / n), "sha256": sha256(directory / n)} for n in names}


# --------------------------------------------------------------------------
# tiny tokenizers
# --------------------------------------------------------------------------


def build_tokenizer(vocab_size: int, specials: dict[int, str], roles: dict[str, str],
                    chat_template: str):
    """A WordLevel tokenizer: ``<unk>`` at 0, words ``w<i>`` at every id that
    is not named in ``specials``; ``roles`` maps bos/eos/pad/mask/unk to texts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for i in range(1, vocab_size):
        vocab[specials.get(i, f"w{i}")] = i
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for _, t in sorted(specials.items())])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", model_max_length=4096,
        padding_side="left", **roles)
    fast.chat_template = chat_template
    for i, t in specials.items():
        assert fast.convert_tokens_to_ids(t) == i, (t, i)
    assert len(fast) == vocab_size
    return fast


# --------------------------------------------------------------------------
# weight initialisation (deterministic, and far from the all-flat std 0.02
# init: norm gains and biases are random too, so a wrong name mapping of any
# tensor changes the logits).  The output row of the mask token is then set to
# zero, so that its logit (0) is never the argmax: a random model that predicts
# the mask id would "commit" a mask, a corner the released models never reach.
# --------------------------------------------------------------------------


@torch.no_grad()
def scatter_weights(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if p.ndim == 1 and name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif p.ndim == 1:  # RMSNorm gains
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif "wte" in name or "embed_tokens" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        elif name in ("model.transformer.ff_out.weight", "lm_head.weight"):  # output head
            p.copy_(2.5 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
        else:  # Linear [out, in]
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def save_and_reload(model, cls, head, mask_id: int, seed: int, out: Path, tok):
    """Scatter ``model``'s weights (``seed``), zero the mask id's row of its output head (``head(model)``: the mask id
    is then never an argmax, as in the release), save it and ``tok`` to ``out``, and reload it exactly as a user
    would (their class ``cls``, our folder). Returns the reloaded model, fp32, in eval mode."""
    scatter_weights(model, seed)
    with torch.no_grad():
        head(model)[mask_id].zero_()
    model = model.float().eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return cls.from_pretrained(out, torch_dtype=torch.float32).eval()


def tensor_list(t: torch.Tensor) -> list:
    return t.detach().cpu().tolist()


# --------------------------------------------------------------------------
# LLaDA
# --------------------------------------------------------------------------

LLADA_VOCAB = 160
LLADA_SPECIALS = {
    144: "<|startoftext|>",      # 126080 in LLaDA-8B
    145: "<|endoftext|>",        # 126081: eos and pad
    152: "<|mdm_mask|>",         # 126336: mask
    153: "<|start_header_id|>",  # 126346
    154: "<|end_header_id|>",    # 126347
    155: "<|eot_id|>",           # 126348
}
for _i in (146, 147, 148, 149, 150, 151, 156, 157, 158, 159):
    LLADA_SPECIALS[_i] = f"<|reserved_token_{_i}|>"
LLADA_BOS, LLADA_EOS, LLADA_MASK, LLADA_EOT = 144, 145, 152, 155

LLADA_CHAT = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|> {{ m['role'] }} <|end_header_id|> "
    "{{ m['content'] }} <|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|> assistant <|end_header_id|> {% endif %}"
)

# every field of GSAI-ML/LLaDA-8B-Instruct's config.json, at tiny sizes
# (8B value in the comment where it differs)
LLADA_CONFIG = dict(
    activation_type="silu",
    alibi=False,
    alibi_bias_max=8.0,
    attention_dropout=0.0,
    attention_layer_norm=False,
    attention_layer_norm_with_affine=True,
    auto_map={
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        "AutoModel": "modeling_llada.LLaDAModelLM",
    },
    bias_for_layer_norm=False,
    block_group_size=1,
    block_type="llama",
    d_model=32,                 # 4096
    embedding_dropout=0.0,
    embedding_size=LLADA_VOCAB,  # 126464
    eos_token_id=LLADA_EOS,     # 126081
    flash_attention=False,
    include_bias=False,
    include_qkv_bias=False,
    init_cutoff_factor=None,
    init_device="meta",
    init_fn="mitchell",
    init_std=0.02,
    input_emb_norm=False,
    layer_norm_type="rms",
    layer_norm_with_affine=True,
    mask_token_id=LLADA_MASK,   # 126336
    max_sequence_length=128,    # 4096
    mlp_hidden_size=96,         # 12288
    mlp_ratio=4,
    multi_query_attention=None,
    n_heads=4,                  # 32
    n_kv_heads=4,               # 32
    n_layers=2,                 # 32
    pad_token_id=LLADA_EOS,     # 126081
    precision="amp_bf16",
    residual_dropout=0.0,
    rms_norm_eps=1e-05,
    rope=True,
    rope_full_precision=True,
    rope_theta=500000.0,
    scale_logits=False,
    use_cache=False,
    vocab_size=LLADA_VOCAB,     # 126464
    weight_tying=False,
)

M = LLADA_MASK
# prompts (lengths 6 and 6), a shorter prompt for left padding (length 3)
LLADA_PROMPT_A = [LLADA_BOS, 17, 5, 88, 42, 101]
LLADA_PROMPT_B = [LLADA_BOS, 3, 64, 64, 120, 9]
LLADA_PROMPT_SHORT = [LLADA_BOS, 77, 23]


def llada_inputs():
    a = LLADA_PROMPT_A + [M] * 10
    b = LLADA_PROMPT_B + [M] * 10
    partial = LLADA_PROMPT_A + [33, M, M, 61, M, 7, M, M, LLADA_EOS, M]
    partial_b = LLADA_PROMPT_B + [M, 12, M, M, 130, M, M, 2, M, LLADA_EOT]
    pad = [LLADA_EOS] * 3 + LLADA_PROMPT_SHORT + [M] * 10
    return {
        "prompt_then_masks": {"input_ids": [a, b], "attention_mask": None},
        "partial_canvas": {"input_ids": [partial, partial_b], "attention_mask": None},
        "left_padded": {
            "input_ids": [pad, a],
            "attention_mask": [[0] * 3 + [1] * 13, [1] * 16],
        },
    }


def llada_generate_cases():
    cases = []
    for steps, gen, block in [(8, 16, 8), (16, 16, 8), (16, 16, 16), (8, 16, 4), (6, 16, 8), (4, 8, 8)]:
        cases.append(dict(name=f"b1_gen{gen}_block{block}_steps{steps}", prompt=[LLADA_PROMPT_A],
                          attention_mask=None, steps=steps, gen_length=gen, block_length=block,
                          temperature=0.0, cfg_scale=0.0, remasking="low_confidence"))
    cases.append(dict(name="b2_gen16_block8_steps8", prompt=[LLADA_PROMPT_A, LLADA_PROMPT_B],
                      attention_mask=None, steps=8, gen_length=16, block_length=8,
                      temperature=0.0, cfg_scale=0.0, remasking="low_confidence"))
    cases.append(dict(name="b2_leftpad_gen16_block8_steps16",
                      prompt=[[LLADA_EOS] * 3 + LLADA_PROMPT_SHORT, LLADA_PROMPT_A],
                      attention_mask=[[0, 0, 0, 1, 1, 1], [1] * 6], steps=16, gen_length=16,
                      block_length=8, temperature=0.0, cfg_scale=0.0, remasking="low_confidence"))
    cases.append(dict(name="b1_cfg0.5_gen16_block8_steps8", prompt=[LLADA_PROMPT_A],
                      attention_mask=[[1] * 6], steps=8, gen_length=16, block_length=8,
                      temperature=0.0, cfg_scale=0.5, remasking="low_confidence"))
    cases.append(dict(name="b1_temp0.7_seed_gen16_block8_steps8", prompt=[LLADA_PROMPT_A],
                      attention_mask=None, steps=8, gen_length=16, block_length=8,
                      temperature=0.7, cfg_scale=0.0, remasking="low_confidence",
                      torch_manual_seed=1234, rng_dependent=True))
    # classifier-free guidance with left padding, random remasking, Gumbel sampling with CFG and with padding
    # (the seeded cases reproduce only with the same random draws, in generate's order and shapes)
    leftpad = dict(prompt=[[LLADA_EOS] * 3 + LLADA_PROMPT_SHORT, LLADA_PROMPT_A],
                   attention_mask=[[0, 0, 0, 1, 1, 1], [1] * 6])
    cases.append(dict(name="b2_leftpad_cfg1.0_gen16_block8_steps16", **leftpad, steps=16, gen_length=16,
                      block_length=8, temperature=0.0, cfg_scale=1.0, remasking="low_confidence"))
    cases.append(dict(name="b1_random_seed_gen16_block8_steps8", prompt=[LLADA_PROMPT_A], attention_mask=None,
                      steps=8, gen_length=16, block_length=8, temperature=0.0, cfg_scale=0.0, remasking="random",
                      torch_manual_seed=7, rng_dependent=True))
    cases.append(dict(name="b2_temp1.0_random_cfg0.5_seed_gen16_block8_steps8",
                      prompt=[LLADA_PROMPT_A, LLADA_PROMPT_B], attention_mask=[[1] * 6, [1] * 6], steps=8,
                      gen_length=16, block_length=8, temperature=1.0, cfg_scale=0.5, remasking="random",
                      torch_manual_seed=99, rng_dependent=True))
    cases.append(dict(name="b2_leftpad_temp0.5_seed_gen16_block4_steps8", **leftpad, steps=8, gen_length=16,
                      block_length=4, temperature=0.5, cfg_scale=0.0, remasking="low_confidence",
                      torch_manual_seed=5, rng_dependent=True))
    return cases


def make_llada(ref: Path, out: Path) -> dict:
    load_package("llada_ref", ref)
    cfg_mod = import_from("llada_ref", "configuration_llada")
    mod = import_from("llada_ref", "modeling_llada")
    gen_mod = import_from("llada_ref", "generate")

    config = cfg_mod.LLaDAConfig(**LLADA_CONFIG)
    torch.manual_seed(SEED)
    model = mod.LLaDAModelLM(config, init_params=False)
    tok = build_tokenizer(
        LLADA_VOCAB, LLADA_SPECIALS,
        dict(bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
             mask_token="<|mdm_mask|>"),
        LLADA_CHAT)
    model = save_and_reload(model, mod.LLaDAModelLM, lambda m: m.model.transformer.ff_out.weight, LLADA_MASK, SEED,
                            out, tok)

    logits = {}
    record_inputs = {}
    with torch.no_grad():
        for name, spec in llada_inputs().items():
            ids = torch.tensor(spec["input_ids"])
            am = None if spec["attention_mask"] is None else torch.tensor(spec["attention_mask"])
            logits[name] = model(ids, attention_mask=am).logits.float().contiguous()
            record_inputs[name] = spec

    gens = []
    for case in llada_generate_cases():
        prompt = torch.tensor(case["prompt"])
        am = None if case["attention_mask"] is None else torch.tensor(case["attention_mask"])
        if "torch_manual_seed" in case:
            torch.manual_seed(case["torch_manual_seed"])
        x = gen_mod.generate(model, prompt, attention_mask=am, steps=case["steps"],
                             gen_length=case["gen_length"], block_length=case["block_length"],
                             temperature=case["temperature"], cfg_scale=case["cfg_scale"],
                             remasking=case["remasking"], mask_id=LLADA_MASK)
        gens.append({**case, "mask_id": LLADA_MASK, "output": tensor_list(x)})

    return dict(logits=logits, inputs=record_inputs, generate=gens,
                tokenizer_check=tok("w17 w5 <|mdm_mask|> <|eot_id|>")["input_ids"])


# --------------------------------------------------------------------------
# Dream
# --------------------------------------------------------------------------

DREAM_VOCAB = 160
DREAM_SPECIALS = {
    144: "<|endoftext|>",   # 151643: bos, eos and pad
    145: "<|im_start|>",    # 151644
    146: "<|im_end|>",      # 151645
    152: "<|beginoftext|>",  # 151665
    153: "<|mask|>",        # 151666: mask
}
for _i in (147, 148, 149, 150, 151, 154, 155, 156, 157, 158, 159):
    DREAM_SPECIALS[_i] = f"<|reserved_{_i}|>"
DREAM_EOS, DREAM_IM_START, DREAM_IM_END, DREAM_MASK = 144, 145, 146, 153

DREAM_CHAT = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)

# every field of Dream-org/Dream-v0-Instruct-7B's config.json, at tiny sizes
DREAM_CONFIG = dict(
    attention_dropout=0.0,
    auto_map={
        "AutoConfig": "configuration_dream.DreamConfig",
        "AutoModel": "modeling_dream.DreamModel",
    },
    bos_token_id=DREAM_EOS,      # 151643
    eos_token_id=DREAM_EOS,      # 151643
    hidden_act="silu",
    hidden_size=32,              # 3584
    initializer_range=0.02,
    intermediate_size=96,        # 18944
    mask_token_id=DREAM_MASK,    # 151666
    max_position_embeddings=256,  # 131072
    max_window_layers=2,         # 28
    num_attention_heads=4,       # 28
    num_hidden_layers=2,         # 28
    num_key_value_heads=2,       # 4
    pad_token_id=DREAM_EOS,      # 151643
    rms_norm_eps=1e-06,
    rope_scaling=None,
    rope_theta=1000000.0,
    sliding_window=None,
    tie_word_embeddings=False,
    use_cache=False,
    use_sliding_window=False,
    vocab_size=DREAM_VOCAB,      # 152064
)

D = DREAM_MASK
DREAM_PROMPT_A = [DREAM_IM_START, 17, 5, 88, 42, 101]
DREAM_PROMPT_B = [DREAM_IM_START, 3, 64, 64, 120, 9]
DREAM_PROMPT_SHORT = [DREAM_IM_START, 77, 23]


def dream_inputs():
    a = DREAM_PROMPT_A + [D] * 10
    b = DREAM_PROMPT_B + [D] * 10
    partial = DREAM_PROMPT_A + [33, D, D, 61, D, 7, D, D, DREAM_EOS, D]
    partial_b = DREAM_PROMPT_B + [D, 12, D, D, 130, D, D, 2, D, DREAM_IM_END]
    pad = [DREAM_EOS] * 3 + DREAM_PROMPT_SHORT + [D] * 10
    am2d = torch.tensor([[0] * 3 + [1] * 13, [1] * 16])
    # exactly what DreamGenerationMixin._sample builds from a 2-D mask with zeros
    tok_idx = am2d.long().cumsum(-1) - 1
    tok_idx.masked_fill_(am2d == 0, 1)
    return {
        "prompt_then_masks": {"input_ids": [a, b], "attention_mask": "full", "position_ids": None},
        "partial_canvas": {"input_ids": [partial, partial_b], "attention_mask": "full",
                           "position_ids": None},
        "left_padded": {"input_ids": [pad, a], "attention_mask_2d": tensor_list(am2d),
                        "attention_mask": "4d_bool: am[:,None,None,:] & am[:,None,:,None]",
                        "position_ids": tensor_list(tok_idx)},
    }


def dream_generate_cases():
    cases = []
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        for steps in (16, 8):
            cases.append(dict(name=f"b1_{alg}_new16_steps{steps}", prompt=[DREAM_PROMPT_A],
                              attention_mask=None, max_new_tokens=16, steps=steps, alg=alg,
                              alg_temp=0.0, temperature=0.0, top_p=None, top_k=None,
                              output_history=(steps == 8)))
    cases.append(dict(name="b1_maskgit_plus_new8_steps16", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=8, steps=16, alg="maskgit_plus",
                      alg_temp=0.0, temperature=0.0, top_p=None, top_k=None, output_history=True))
    cases.append(dict(name="b1_maskgit_plus_topp0.5_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="maskgit_plus",
                      alg_temp=0.0, temperature=0.0, top_p=0.5, top_k=None, output_history=False))
    cases.append(dict(name="b1_entropy_topk5_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="entropy",
                      alg_temp=0.0, temperature=0.0, top_p=None, top_k=5, output_history=False))
    cases.append(dict(name="b2_maskgit_plus_new16_steps8", prompt=[DREAM_PROMPT_A, DREAM_PROMPT_B],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="maskgit_plus",
                      alg_temp=0.0, temperature=0.0, top_p=None, top_k=None, output_history=True))
    cases.append(dict(name="b2_leftpad_entropy_new16_steps16",
                      prompt=[[DREAM_EOS] * 3 + DREAM_PROMPT_SHORT, DREAM_PROMPT_A],
                      attention_mask=[[0, 0, 0, 1, 1, 1], [1] * 6], max_new_tokens=16, steps=16,
                      alg="entropy", alg_temp=0.0, temperature=0.0, top_p=None, top_k=None,
                      output_history=False))
    cases.append(dict(name="b1_origin_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="origin",
                      alg_temp=0.0, temperature=0.0, top_p=None, top_k=None, output_history=True,
                      torch_manual_seed=1234, rng_dependent=True))
    cases.append(dict(name="b1_maskgit_plus_temp0.5_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="maskgit_plus",
                      alg_temp=0.0, temperature=0.5, top_p=None, top_k=None, output_history=False,
                      torch_manual_seed=1234, rng_dependent=True))
    # sampling with the top_p / top_k filters, alg_temp, origin with sampling, left padding (seeded: they
    # reproduce only with the same random draws, in _sample's order and shapes)
    seeded = dict(output_history=False, rng_dependent=True)
    cases.append(dict(name="b1_maskgit_plus_temp1.0_topp0.9_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="maskgit_plus", alg_temp=0.0,
                      temperature=1.0, top_p=0.9, top_k=None, torch_manual_seed=11, **seeded))
    cases.append(dict(name="b1_topk_margin_temp0.8_topk5_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="topk_margin", alg_temp=0.0,
                      temperature=0.8, top_p=None, top_k=5, torch_manual_seed=12, **seeded))
    cases.append(dict(name="b1_entropy_temp0.6_algtemp0.5_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="entropy", alg_temp=0.5,
                      temperature=0.6, top_p=None, top_k=None, torch_manual_seed=13, **seeded))
    cases.append(dict(name="b2_origin_temp0.7_topk20_seed_new16_steps8", prompt=[DREAM_PROMPT_A, DREAM_PROMPT_B],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="origin", alg_temp=0.0,
                      temperature=0.7, top_p=None, top_k=20, torch_manual_seed=14, **seeded))
    cases.append(dict(name="b1_maskgit_plus_algtemp1.0_seed_new16_steps8", prompt=[DREAM_PROMPT_A],
                      attention_mask=None, max_new_tokens=16, steps=8, alg="maskgit_plus", alg_temp=1.0,
                      temperature=0.0, top_p=None, top_k=None, torch_manual_seed=15, **seeded))
    cases.append(dict(name="b2_leftpad_maskgit_plus_temp1.0_seed_new16_steps16",
                      prompt=[[DREAM_EOS] * 3 + DREAM_PROMPT_SHORT, DREAM_PROMPT_A],
                      attention_mask=[[0, 0, 0, 1, 1, 1], [1] * 6], max_new_tokens=16, steps=16,
                      alg="maskgit_plus", alg_temp=0.0, temperature=1.0, top_p=None, top_k=None,
                      torch_manual_seed=16, **seeded))
    return cases


def make_dream(ref: Path, out: Path) -> dict:
    load_package("dream_ref", ref)
    cfg_mod = import_from("dream_ref", "configuration_dream")
    mod = import_from("dream_ref", "modeling_dream")

    config = cfg_mod.DreamConfig(**DREAM_CONFIG)
    torch.manual_seed(SEED)
    model = mod.DreamModel(config)
    tok = build_tokenizer(
        DREAM_VOCAB, DREAM_SPECIALS,
        dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>", mask_token="<|mask|>"),
        DREAM_CHAT)
    model = save_and_reload(model, mod.DreamModel, lambda m: m.lm_head.weight, DREAM_MASK, SEED + 1, out, tok)

    logits = {}
    record_inputs = {}
    with torch.no_grad():
        for name, spec in dream_inputs().items():
            ids = torch.tensor(spec["input_ids"])
            if "attention_mask_2d" in spec:
                am = torch.tensor(spec["attention_mask_2d"]).bool()
                am4 = torch.logical_and(am.unsqueeze(1).unsqueeze(-2), am.unsqueeze(1).unsqueeze(-1))
                pos = torch.tensor(spec["position_ids"])
                out_logits = model(ids, am4, pos).logits
            else:
                out_logits = model(ids, "full", None).logits
            logits[name] = out_logits.float().contiguous()
            record_inputs[name] = spec

    gens = []
    for case in dream_generate_cases():
        prompt = torch.tensor(case["prompt"])
        kwargs = {}
        if case["attention_mask"] is not None:
            kwargs["attention_mask"] = torch.tensor(case["attention_mask"])
        if "torch_manual_seed" in case:
            torch.manual_seed(case["torch_manual_seed"])
        res = model.diffusion_generate(
            prompt, max_new_tokens=case["max_new_tokens"], steps=case["steps"], alg=case["alg"],
            alg_temp=case["alg_temp"], temperature=case["temperature"], top_p=case["top_p"],
            top_k=case["top_k"], output_history=case["output_history"],
            return_dict_in_generate=True, **kwargs)
        rec = {**case, "output": tensor_list(res.sequences)}
        if case["output_history"]:
            rec["history"] = [tensor_list(h) for h in res.history]
        gens.append(rec)

    return dict(logits=logits, inputs=record_inputs, generate=gens,
                tokenizer_check=tok("w17 w5 <|mask|> <|im_end|>")["input_ids"])


# --------------------------------------------------------------------------


def write_outputs(out: Path, family: str, result: dict, extra: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v for k, v in result["logits"].items()}, str(out / "reference_logits.safetensors"),
              metadata={"family": family, "dtype": "float32"})
    ref = {
        "family": family,
        "note": ("Computed by the family's own reference code under transformers "
                 f"{extra['transformers']} / torch {extra['torch']}, fp32, CPU. See PROVENANCE.md."),
        "reference_files": extra["reference_files"],
        **extra["semantics"],
        "logits_inputs": result["inputs"],
        "generate": result["generate"],
        "tokenizer_check": result["tokenizer_check"],
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llada-ref", type=Path, required=True)
    ap.add_argument("--dream-ref", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("tests/data/dllm_golden"))
    args = ap.parse_args()

    import transformers

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    if transformers.__version__ != "4.57.6":
        raise SystemExit(f"needs transformers 4.57.6, found {transformers.__version__}")

    llada = make_llada(args.llada_ref, args.out / "llada")
    write_outputs(args.out / "llada", "llada", llada, {**versions, "reference_files": reference_files(
        args.llada_ref, ("modeling_llada.py", "configuration_llada.py", "generate.py")), "semantics": {
        "model_class": "LLaDAModelLM (their modeling_llada.py), loaded with from_pretrained",
        "logits_call": "model(input_ids, attention_mask=attention_mask).logits  (no shift)",
        "generate_call": ("generate(model, prompt, attention_mask=..., steps, gen_length, block_length, "
                          "temperature, cfg_scale, remasking, mask_id) from their generate.py; "
                          "output = full canvas [prompt | generated]"),
        "mask_token_id": LLADA_MASK, "eos_token_id": LLADA_EOS, "bos_token_id": LLADA_BOS,
        "eot_token_id": LLADA_EOT,
    }})
    dream = make_dream(args.dream_ref, args.out / "dream")
    write_outputs(args.out / "dream", "dream", dream, {**versions, "reference_files": reference_files(
        args.dream_ref, ("modeling_dream.py", "configuration_dream.py", "generation_utils.py")), "semantics": {
        "model_class": "DreamModel (their modeling_dream.py), loaded with from_pretrained",
        "logits_call": ("model(input_ids, attention_mask, position_ids).logits, UNSHIFTED: logits[:, i] "
                        "predicts token i+1; diffusion_generate uses cat([l[:, :1], l[:, :-1]], 1)"),
        "generate_call": ("model.diffusion_generate(prompt, attention_mask=..., max_new_tokens, steps, alg, "
                          "alg_temp, temperature, top_p, top_k, output_history, "
                          "return_dict_in_generate=True); eps left at its default 1e-3"),
        "mask_token_id": DREAM_MASK, "eos_token_id": DREAM_EOS, "pad_token_id": DREAM_EOS,
        "im_start_token_id": DREAM_IM_START, "im_end_token_id": DREAM_IM_END,
    }})
    for fam in ("llada", "dream"):
        d = args.out / fam
        print(fam, {p.name: p.stat().st_size for p in sorted(d.iterdir())})
        print(fam, "model.safetensors sha256", sha256(d / "model.safetensors"))


if __name__ == "__main__":
    main()
