"""A DEER drafter over a pretrained AR target's frozen, shared embedding and head (workbench/deer/shared.py),
on a random two-layer Llama saved like SmolLM2 (BPE tokenizer, no mask or separator token)."""
import pytest
import torch
from transformers import AutoTokenizer

from workbench.decoding.ar import ar_decode
from workbench.deer.decode import deer_decode
from workbench.deer.models import load_drafter, load_target
from workbench.deer.shared import (drafter_from_target, is_shared_drafter, prepare_target, save_shared_drafter)
from workbench.model.fingerprint import weights_fingerprint
from workbench.model.io import CheckpointError


def _sep(tok) -> str:
    return tok.convert_ids_to_tokens(5)          # any existing token can serve as the separator


def _prepared(ar_checkpoint):
    target, tok = load_target(str(ar_checkpoint))
    return prepare_target(target, tok, _sep(AutoTokenizer.from_pretrained(ar_checkpoint)))


def test_prepare_target_keeps_ar_outputs(ar_checkpoint):
    plain, _ = load_target(str(ar_checkpoint))
    target, tok = _prepared(ar_checkpoint)
    assert tok.mask_token_id == len(tok) - 1 and tok.sep_token_id == 5
    ids = torch.tensor([[3, 17, 40, 9, 77, 12]])
    valid = torch.ones_like(ids, dtype=torch.bool)
    a = plain.extend(ids, plain.new_cache(), valid)
    b = target.extend(ids, target.new_cache(), valid)
    assert b.shape[-1] == a.shape[-1] + 1 and torch.isneginf(b[..., tok.mask_token_id]).all()
    torch.testing.assert_close(b[..., :-1], a, rtol=0, atol=0)


def test_drafter_shares_frozen_embedding_and_copies_layers(ar_checkpoint):
    target, tok = _prepared(ar_checkpoint)
    drafter = drafter_from_target(target, 1)
    tb, db = target.backbone, drafter.backbone
    assert db.get_input_embeddings() is tb.get_input_embeddings()
    assert db.get_output_embeddings() is tb.get_output_embeddings()
    assert not tb.get_input_embeddings().weight.requires_grad
    assert len(db.model.layers) == 1
    for (n, p), q in zip(db.model.layers[0].named_parameters(), tb.model.layers[0].parameters()):
        assert p.requires_grad and torch.equal(p, q) and p.data_ptr() != q.data_ptr(), n
    with pytest.raises(ValueError, match="n_layers must be in 1..2"):
        drafter_from_target(target, 3)


def test_shared_drafter_round_trip_and_lossless_deer(ar_checkpoint, tmp_path):
    target, tok = _prepared(ar_checkpoint)
    drafter = drafter_from_target(target, 1)
    with torch.no_grad():                        # what ships is bf16: round first so the reload is exact
        for p in drafter.backbone.model.layers.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    out = save_shared_drafter(drafter, target, tok, tmp_path / "d", {"deer_stage": 1}, weights_fingerprint(target))
    assert is_shared_drafter(out)
    from safetensors.torch import load_file

    keys = set(load_file(str(out / "drafter.safetensors")))
    assert keys and not any("embed" in k or "lm_head" in k for k in keys)        # embedding and head not shipped
    assert all(load_file(str(out / "drafter.safetensors"))[k].dtype == torch.bfloat16 for k in keys)

    fresh, ftok = load_target(str(ar_checkpoint))          # a plain target: loading prepares it
    loaded = load_drafter(str(out), fresh, ftok)
    assert ftok.sep_token_id == 5 and loaded.sep_token_id == 5
    ids = torch.tensor([[3, 17, 40, 9]])
    block = torch.tensor([[5] + [tok.mask_token_id] * 3])
    from workbench.deer.attention import draft_block_logits

    valid = torch.ones((1, 8), dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(draft_block_logits(loaded, ids, block, valid),
                                   draft_block_logits(drafter, ids, block, valid), rtol=0, atol=0)
    prompts = [[3, 17, 40, 9, 77], [12, 5, 8]]
    ref = ar_decode(fresh, prompts, 12).tokens
    assert deer_decode(fresh, loaded, prompts, 12, 4, sep_id=loaded.sep_token_id).tokens == ref


def test_shared_drafter_for_other_weights_is_refused(ar_checkpoint, tmp_path):
    target, tok = _prepared(ar_checkpoint)
    out = save_shared_drafter(drafter_from_target(target, 1), target, tok, tmp_path / "d", {},
                              weights_fingerprint(target))
    other, otok = load_target(str(ar_checkpoint))
    with torch.no_grad():
        other.backbone.model.layers[1].mlp.down_proj.weight.add_(0.01)
    with pytest.raises(CheckpointError, match="trained on base weights [0-9a-f]{16}, but the target has weights"):
        load_drafter(str(out), other, otok)


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_shared_drafter_of_other_families(family):
    """The drafter is the target's own first layers in any decoder-only family (Qwen3: model.layers; GPT-2:
    transformer.h with learned positions); DEER with it stays AR greedy of the target."""
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen3Config

    torch.manual_seed(0)
    cfg = (Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=True)
           if family == "qwen3" else GPT2Config(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=128))
    backbone = AutoModelForCausalLM.from_config(cfg).eval()
    from workbench.model.trimode import TriModeLM

    target = TriModeLM(backbone, 63)
    drafter = drafter_from_target(target, 2)
    assert drafter.backbone.get_input_embeddings() is backbone.get_input_embeddings()
    assert drafter.backbone.config.num_hidden_layers == 2
    prompts = [[3, 17, 40, 9, 7], [12, 5, 8]]
    ref = ar_decode(target, prompts, 12).tokens
    assert deer_decode(target, drafter, prompts, 12, 4, sep_id=1).tokens == ref


@pytest.mark.parametrize("family", ["qwen3", "gpt2", "gemma3_text"])
def test_fresh_drafter_is_of_the_target_family(family):
    """A fresh preset drafter (``build_drafter``) is the target's own family at the preset's size, and so is a
    drafter cut to its first layers (``keep_first_layers``); DEER with either stays AR greedy of the target."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.deer.models import build_drafter, keep_first_layers
    from workbench.model.trimode import TriModeLM

    kw = (dict(n_embd=32, n_layer=3, n_head=4, n_positions=128) if family == "gpt2" else
          dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=128))
    if family == "gemma3_text":                 # a 2-layer pattern, cycled over the 3-layer drafter
        kw.update(num_hidden_layers=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    target = TriModeLM(AutoModelForCausalLM.from_config(AutoConfig.for_model(family, vocab_size=64, **kw)).eval(), 63)

    class Tok:                                   # the target's tokenizer, as build_drafter reads it
        mask_token_id, sep_token_id, pad_token_id, eos_token_id, vocab_size = 63, 1, 0, 2, 64

        def get_vocab(self):
            return {f"t{i}": i for i in range(64)}

    drafter, _ = build_drafter(target, Tok(), "deer_drafter", seed=0)
    cfg = drafter.backbone.config
    assert cfg.model_type == target.backbone.config.model_type
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (128, 3)
    if family == "gemma3_text":
        assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    prompts = [[3, 17, 40, 9, 7, 5, 11, 30], [12, 5, 8]]
    ref = ar_decode(target, prompts, 12).tokens
    assert deer_decode(target, drafter.eval(), prompts, 12, 4, sep_id=1).tokens == ref
    if family == "gpt2":
        assert drafter.backbone.transformer.h[0].mlp.c_fc.nf == 352        # the preset's MLP width (n_inner)
    small = keep_first_layers(drafter, 1)
    assert small.backbone.config.num_hidden_layers == 1 and len(small.backbone.get_submodule(
        "transformer.h" if family == "gpt2" else "model.layers")) == 1
    if family == "gemma3_text":
        assert small.backbone.config.layer_types == ["sliding_attention"]
    assert deer_decode(target, small, prompts, 12, 4, sep_id=1).tokens == ref
