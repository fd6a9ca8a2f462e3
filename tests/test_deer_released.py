"""DEER's drafter started from a released diffusion LM (issue 57; deer.txt §4 / App. B: the paper's code drafter is
continued from Open-dCoder-0.5B, a released dLLM). Stage I runs from an NLD checkpoint's weights (its built-in
Ministral3 class, its mask token, its tokenizer), Stage II from that drafter, and DEER decoding with it equals the AR
target's greedy decoding; a drafter of another tokenizer, a family whose forward is not DEER's drafter forward and a
tokenizer with no room for a separator are refused in one line."""
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import bpe_tokenizer
from small_models import ar_target_checkpoint
from workbench.decoding import get_policy
from workbench.deer.models import RELEASED_KEY, TokenizerMismatchError, build_drafter, load_drafter
from workbench.deer.teacher import TeacherConfig, generate_teacher
from workbench.model.families.fixtures import fixture_tokenizer, write_family_checkpoint
from workbench.model.io import load_checkpoint, read_workbench_json
from workbench.tokenizer import TokenizerError

PROMPTS = [[72, 101, 108, 108, 111, 32, 119], [100, 101, 102, 32, 102, 40, 120, 41, 58]]
PAD = 256                                             # the fixture tokenizer's <|endoftext|> (end of text and pad)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, small_corpus):
    root = tmp_path_factory.mktemp("deer_released")
    nld = write_family_checkpoint("nld", root / "nld")
    target = ar_target_checkpoint(root / "target", fixture_tokenizer("<mask>"), 264)
    cfg = TeacherConfig(target=str(target), corpus=str(small_corpus), n_answers=16, prompt_len=24, gen_len=12,
                        batch_size=8, chunk_size=16, out_dir=str(root / "teacher"))
    generate_teacher(cfg, *load_checkpoint(target)[:2])
    return {"root": root, "nld": nld, "target": target, "teacher": root / "teacher"}


def test_stage1_starts_from_the_released_dllm_and_decodes_losslessly(folders, monkeypatch):
    import workbench.deer.train as train_mod
    from workbench.deer.train import DeerTrainConfig, train_deer

    nld, root = folders["nld"], folders["root"]
    released = load_file(str(nld / "model.safetensors"))
    mask_id = json.loads((nld / "config.json").read_text())["mask_token_id"]
    seen = {}
    real = train_mod.build_drafter

    def spy(*a, **kw):                                  # the drafter as stage 1 receives it, before any step
        drafter, tok = real(*a, **kw)
        seen.update(cls=type(drafter.backbone).__name__, mask=drafter.mask_token_id, sep=tok.sep_token_id,
                    embed=drafter.backbone.model.embed_tokens.weight.detach().clone(),
                    q1=drafter.backbone.model.layers[1].self_attn.q_proj.weight.detach().clone(),
                    head=drafter.backbone.lm_head.weight.detach().clone())
        return drafter, tok

    monkeypatch.setattr(train_mod, "build_drafter", spy)
    common = dict(teacher=str(folders["teacher"]), batch_size=4, val_every=3, val_percent=30, warmup_steps=1,
                  checkpoint_every=3, progress_bar=False, accelerator="cpu", r_max=8)
    s1 = train_deer(DeerTrainConfig(stage=1, drafter_init=str(nld), out_dir=str(root / "s1"), max_steps=3, **common))
    assert seen["cls"] == "Ministral3ForCausalLM" and seen["mask"] == mask_id
    torch.testing.assert_close(seen["embed"], released["encoder.embed_tokens.weight"], rtol=0, atol=0)
    torch.testing.assert_close(seen["q1"], released["encoder.layers.1.self_attn.q_proj.weight"], rtol=0, atol=0)
    torch.testing.assert_close(seen["head"], released["diffusion_head.weight"], rtol=0, atol=0)
    assert 258 <= seen["sep"] < 264                      # no separator in the byte tokenizer: an unused embedding row

    trained, dtok, meta = load_checkpoint(s1)
    assert meta[RELEASED_KEY] == "nld" and meta["init_from"] == str(nld) and meta["global_step"] == 3
    assert type(trained.backbone).__name__ == "Ministral3ForCausalLM" and trained.mask_token_id == mask_id
    assert dtok.sep_token_id == seen["sep"]
    assert not torch.equal(trained.backbone.model.embed_tokens.weight, seen["embed"])   # stage 1 trained it

    s2 = train_deer(DeerTrainConfig(stage=2, drafter_init=str(s1), out_dir=str(root / "s2"), max_steps=2, **common))
    assert read_workbench_json(s2)[RELEASED_KEY] == "nld"
    target, ttok, _ = load_checkpoint(folders["target"])
    drafter = load_drafter(str(s2), target, ttok)       # the `deer` decoder's loader
    assert drafter.sep_token_id == seen["sep"] and drafter.mask_token_id == mask_id
    ar = get_policy("ar_greedy")(target, PROMPTS, 16, pad_id=PAD)
    res = get_policy("deer")(target, PROMPTS, 16, drafter=drafter, draft_length=4, pad_id=PAD)
    assert res.tokens == ar.tokens                      # lossless at temperature 0
    assert all(f > 0 for f in res.forwards) and res.drafter_params > 0


def test_a_released_drafter_of_another_tokenizer_is_refused_in_one_line(folders):
    other = ar_target_checkpoint(folders["root"] / "other", bpe_tokenizer(), 320)
    target, tok, _ = load_checkpoint(other)
    with pytest.raises(TokenizerMismatchError, match=r"does not speak the target's tokenizer \(token .+ is id \d+ "
                                                     r"in the target but .+ in the drafter\)") as e:
        build_drafter(target, tok, drafter_init=str(folders["nld"]))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family, why", [("sdar", "block-causal"), ("llada", "full bidirectional"),
                                         ("dream", "shifted logits")])
def test_a_family_whose_forward_is_not_deers_is_refused_before_anything_is_written(tmp_path, capsys, family, why):
    from workbench.cli import main

    ckpt = write_family_checkpoint(family, tmp_path / family)
    out = tmp_path / "run"
    assert main(["train", "deer", "--stage", "1", "--drafter_init", str(ckpt), "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"the {family} checkpoint" in err and why in err
    assert err.endswith("families that can: nld") and not out.exists()


def test_a_released_dllm_without_room_for_a_separator_is_refused_in_one_line(tmp_path):
    nld = write_family_checkpoint("nld", tmp_path / "nld", vocab_size=258)        # every row is a token
    target, tok, _ = load_checkpoint(ar_target_checkpoint(tmp_path / "target", fixture_tokenizer("<mask>"), 258))
    with pytest.raises(TokenizerError, match="no separator token '<|im_start|>' and its embedding no unused row") as e:
        build_drafter(target, tok, drafter_init=str(nld))
    assert "\n" not in str(e.value)
    drafter, dtok = build_drafter(target, tok, drafter_init=str(nld), sep_token="<|endoftext|>")   # an existing one
    assert dtok.sep_token_id == 256 and len(dtok) == 258 and drafter.released_family == "nld"
