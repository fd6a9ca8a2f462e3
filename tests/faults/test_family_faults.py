"""Released-dLLM folders the loader used to open wrongly or with a traceback: a training-only
``"attn_implementation": "flex_attention"`` (a segmentation fault on a CPU), NaN weights (NUL bytes decoded, NaN
probabilities stored), an I-DLM folder opened as SDAR without a word, a mask id that is EOS or not the tokenizer's
mask, a family prefix that does not fit the folder, special ids outside the vocabulary, a wrong-shape tensor.
Each ends clean: a folder that is fine decodes (exit 0), a bad one gives exit 2 and one line naming what is wrong
and how to fix it, and nothing is written."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench.model.families.fixtures import write_family_checkpoint
from workbench.model.load import load_model

SHORT = ["--prompt", "def f(x):", "--gen_len", "4", "--device", "cpu", "--block_length", "4"]


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """One tiny checkpoint per family, each config.json the release's field set (SDAR's and I-DLM's with
    ``"attn_implementation": "flex_attention"``); I-DLM's block size is I-DLM-8B's 3."""
    root = tmp_path_factory.mktemp("family_faults")
    fams = ("sdar", "idlm", "dream", "llada", "fast_dllm_v2", "nld", "diffusion_gemma")
    return {f: write_family_checkpoint(f, root / f, block_size=4 if f in ("sdar", "fast_dllm_v2") else None)
            for f in fams}


def damaged(ck, family: str, dest, config=None, weights=None):
    """A copy of ``ck[family]`` in ``dest`` with ``config(raw)`` applied to config.json and ``weights(state)`` to
    the safetensors (each edits its argument in place)."""
    shutil.copytree(ck[family], dest)
    if config is not None:
        raw = json.loads((dest / "config.json").read_text())
        config(raw)
        (dest / "config.json").write_text(json.dumps(raw))
    if weights is not None:
        state = load_file(str(dest / "model.safetensors"))
        weights(state)
        save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def lines(r) -> list[str]:
    return [line for line in r.stderr.strip().splitlines() if line.strip()]


def one_line(r, *needles) -> str:
    """``r`` is a user error: exit code 2, one stderr line holding every needle, nothing on stdout."""
    err = lines(r)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert len(err) == 1, err
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert str(needle) in err[0], (needle, err[0])
    return err[0]


def notes(r) -> list[str]:
    return [line for line in lines(r) if line.startswith("workbench: note:")]


# ---- a training-only attention implementation ----------------------------------------------------------------


@pytest.mark.parametrize("family", ["sdar", "idlm", "dream"])
def test_flex_attention_in_config_decodes_with_sdpa_on_a_cpu(ck, family, tmp_path, cli):
    folder = ck[family]
    if family == "dream":                  # Dream's release carries no attn_implementation; the fault set it
        folder = damaged(ck, "dream", tmp_path / "dream", config=lambda raw: raw.update(
            attn_implementation="flex_attention"))
    assert json.loads((folder / "config.json").read_text())["attn_implementation"] == "flex_attention"
    model, _, meta = load_model(str(folder), strict_family=False)
    # checked before any forward: flex_attention's CPU forward crashes the process
    assert model.backbone.config._attn_implementation == "sdpa" == meta["family"]["attn_implementation"]
    r = cli("decode", "--model", folder, *SHORT)
    assert r.returncode == 0 and r.stdout.startswith("def f(x):"), r.stderr[-2000:]
    assert all(line.startswith("workbench: note:") for line in lines(r)), r.stderr   # only the family note, if any


def test_flex_attention_in_config_collects_on_a_cpu(ck, tmp_path, cli):
    r = cli("collect", "--model", ck["sdar"], "--out", tmp_path / "store", "--n_prompts", "2", "--block_lengths", "[4]",
            "--blocks_per_prompt", "1", "--context_len", "16", "--batch_size", "2", "--progress_bar", "false")
    assert r.returncode == 0, r.stderr[-2000:]
    assert cli("store", "verify", "--store", tmp_path / "store", "--model", ck["sdar"]).returncode == 0


def test_inspect_names_the_implementation_and_the_ignored_training_fields(ck, cli):
    r = cli("models", "inspect", ck["sdar"])
    assert r.returncode == 0, r.stderr
    assert "implementation sdpa" in r.stdout
    ignored = next(line for line in r.stdout.splitlines() if line.startswith("ignored:"))
    for field in ("attn_implementation (flex_attention)", "fuse_cross_entropy", "use_deepep", "skip_checkpoint"):
        assert field in ignored


def test_attn_implementation_option_overrides_and_is_checked(ck, tmp_path, cli):
    r = cli("models", "inspect", ck["sdar"], "--attn_implementation", "eager")
    assert r.returncode == 0 and "implementation eager" in r.stdout, r.stderr
    r = cli("decode", "--model", ck["dream"], *SHORT, "--attn_implementation", "eager")
    assert r.returncode == 0, r.stderr
    one_line(cli("decode", "--model", ck["dream"], *SHORT, "--attn_implementation", "bogus"),
             "unknown attn_implementation 'bogus'", "sdpa, eager")
    # one line in a --config file too, before anything is written
    cfg = tmp_path / "c.yaml"
    cfg.write_text("attn_implementation: bogus\n")
    one_line(cli("collect", "--config", cfg, "--model", ck["sdar"], "--out", tmp_path / "s"), "unknown attn_impl")
    assert not (tmp_path / "s").exists()
    model, _, _ = load_model(str(ck["dream"]), attn_implementation="eager")
    assert model.backbone.config._attn_implementation == "eager"


@pytest.mark.skipif(torch.cuda.is_available(), reason="flex_attention is allowed where a CUDA device is visible")
def test_flex_attention_asked_for_on_a_cpu_is_refused(ck, cli):
    one_line(cli("decode", "--model", ck["dream"], *SHORT, "--attn_implementation", "flex_attention"),
             "flex_attention needs a CUDA device", "sdpa or eager")


def test_an_ordinary_checkpoint_does_not_inherit_flex_attention(tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

    from workbench.model.io import load_checkpoint
    from workbench.model.families.fixtures import fixture_tokenizer

    small = dict(vocab_size=264, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, pad_token_id=256, bos_token_id=None, eos_token_id=256)
    models = {"llama": LlamaForCausalLM(LlamaConfig(**small)),
              "gemma2": Gemma2ForCausalLM(Gemma2Config(**small, head_dim=8))}
    for name, model in models.items():
        d = tmp_path / name
        model.save_pretrained(d)
        fixture_tokenizer("<mask>").save_pretrained(d)
        raw = json.loads((d / "config.json").read_text())
        raw["attn_implementation"] = "flex_attention"
        (d / "config.json").write_text(json.dumps(raw))
        loaded, _, _ = load_checkpoint(d)
        # the class's own default (Gemma 2's is eager), never the config's
        assert loaded.backbone.config._attn_implementation == {"llama": "sdpa", "gemma2": "eager"}[name]


# ---- NaN weights ---------------------------------------------------------------------------------------------


def _nan_q(state):
    k = next(k for k in sorted(state) if "q_proj.weight" in k)
    state[k][0, 0] = float("nan")


def test_nan_weights_are_refused_naming_the_tensor(ck, tmp_path, cli):
    dream = damaged(ck, "dream", tmp_path / "dream_nan", weights=_nan_q)
    one_line(cli("decode", "--model", dream, *SHORT), "tensor model.layers.0.self_attn.q_proj.weight",
             "1 NaN or infinite value")
    r = cli("collect", "--model", dream, "--out", tmp_path / "store", "--n_prompts", "2", "--block_lengths", "[4]",
            "--blocks_per_prompt", "1", "--context_len", "16", "--batch_size", "2", "--progress_bar", "false")
    one_line(r, "q_proj.weight")
    assert not (tmp_path / "store").exists()                       # no store of NaN probabilities
    llada = damaged(ck, "llada", tmp_path / "llada_inf", weights=lambda s: s["model.transformer.ff_out.weight"]
                    .__setitem__((3, 1), float("inf")))
    one_line(cli("decode", "--model", llada, *SHORT), "tensor model.transformer.ff_out.weight")   # LLaDA's own name


def test_nan_weights_of_an_ordinary_checkpoint_are_refused(micro_checkpoint, tmp_path, cli):
    d = tmp_path / "micro"
    shutil.copytree(micro_checkpoint, d)
    f = next(d.glob("*.safetensors"))
    state = load_file(str(f))
    k = sorted(state)[-1]
    state[k] = state[k].clone()
    state[k].view(-1)[0] = float("nan")
    save_file(state, str(f), metadata={"format": "pt"})
    one_line(cli("decode", "--model", d, *SHORT, "--policy", "ar_greedy"), f"tensor {k}")


# ---- SDAR or I-DLM: never a silent guess --------------------------------------------------------------------


def test_an_idlm_folder_is_named_as_a_guess_with_the_prefix_for_sdar(ck, cli):
    r = cli("decode", "--model", ck["idlm"], *SHORT, "--policy", "ar_greedy")
    assert r.returncode == 0, r.stderr
    (note,) = notes(r)
    assert lines(r) == [note]
    assert f"{ck['idlm']} opened as idlm" in note and "block_size 3" in note and f"sdar:{ck['idlm']}" in note
    assert "File " not in note and "Warning" not in note                  # a plain line, not a Python warning
    r = cli("decode", "--model", f"idlm:{ck['idlm']}", *SHORT, "--policy", "ar_greedy")
    assert r.returncode == 0 and not notes(r), r.stderr                   # the prefix chose: nothing to say
    r = cli("decode", "--model", f"sdar:{ck['idlm']}", *SHORT)
    assert r.returncode == 0 and not notes(r), r.stderr
    one_line(cli("decode", "--model", ck["idlm"], *SHORT, "--strict_family", "true"),
             "--strict_family", f"idlm:{ck['idlm']}", f"sdar:{ck['idlm']}")


def test_an_sdar_folder_is_named_as_a_guess_with_the_prefix_for_idlm(ck, tmp_path, cli):
    r = cli("decode", "--model", ck["sdar"], *SHORT)
    assert r.returncode == 0, r.stderr
    (note,) = notes(r)
    assert "opened as sdar" in note and f"idlm:{ck['sdar']}" in note and "block_size 4" in note
    one_line(cli("decode", "--model", ck["sdar"], *SHORT, "--strict_family", "true"), f"idlm:{ck['sdar']}")
    # an I-DLM trained for a stride of 5 has SDAR's default block size: still opened with a line, never silently
    n5 = damaged(ck, "idlm", tmp_path / "idlm_n5", config=lambda raw: raw.update(block_size=4))
    r = cli("models", "inspect", n5)
    assert r.returncode == 0 and "family:      sdar" in r.stdout and "a guess" in r.stdout
    (note,) = notes(r)
    assert f"idlm:{n5}" in note
    one_line(cli("models", "inspect", n5, "--strict_family", "true"), f"idlm:{n5}", f"sdar:{n5}")


def test_the_strict_family_setting_reaches_every_load_of_a_command(ck, tmp_path, cli):
    """``--strict_family`` in a --config file, and a guessed family refused before anything is written."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("strict_family: true\n")
    one_line(cli("collect", "--config", cfg, "--model", ck["sdar"], "--out", tmp_path / "s", "--n_prompts", "2",
                 "--block_lengths", "[4]", "--blocks_per_prompt", "1", "--context_len", "16", "--batch_size", "2",
                 "--progress_bar", "false"), "--strict_family")
    assert not (tmp_path / "s").exists()


# ---- mask ids ------------------------------------------------------------------------------------------------


def test_a_mask_id_equal_to_eos_is_refused(ck, tmp_path, cli):
    d = damaged(ck, "nld", tmp_path / "nld_eos", config=lambda raw: raw.update(mask_token_id=256))
    one_line(cli("models", "inspect", d), "mask token id 256 is also the end-of-sequence token", "mask_token_id")
    one_line(cli("decode", "--model", d, *SHORT), "end-of-sequence")


def test_a_mask_id_contradicting_the_tokenizer_is_refused(ck, tmp_path, cli):
    d = damaged(ck, "sdar", tmp_path / "sdar_a", config=lambda raw: raw.update(mask_token_id=65))
    one_line(cli("decode", "--model", d, *SHORT), "mask token id 65 ('A'", "'<|MASK|>' (id 257)",
             "set mask_token_id to 257")


# ---- prefixes and config fields that gave tracebacks --------------------------------------------------------


def test_a_family_prefix_that_does_not_fit_the_folder_is_one_line(ck, tmp_path, cli):
    dream, gemma, sdar = ck["dream"], ck["diffusion_gemma"], ck["sdar"]
    one_line(cli("decode", "--model", f"llada:{dream}", *SHORT), "model_type 'Dream'", f"dream:{dream}")
    one_line(cli("models", "inspect", dream, "--family", "llada"), "model_type 'Dream'")
    one_line(cli("models", "inspect", f"llada:{dream}"), "model_type 'Dream'")
    one_line(cli("leaderboard", "--model", f"llada:{dream}", "--n_prompts", "2", "--gen_len", "8",
                 "--block_lengths", "[4]", "--out_dir", tmp_path / "lb", "--device", "cpu"), "model_type 'Dream'")
    assert not (tmp_path / "lb").exists()
    one_line(cli("decode", "--model", f"sdar:{gemma}", *SHORT), "model_type 'diffusion_gemma'")
    one_line(cli("decode", "--model", f"diffusion_gemma:{sdar}", *SHORT), "model_type 'sdar'", f"sdar:{sdar}")


def test_an_unknown_family_prefix_is_named(ck, cli):
    for args in (["models", "inspect", f"foo:{ck['dream']}"], ["decode", "--model", f"foo:{ck['dream']}", *SHORT]):
        one_line(cli(*args), "unknown model family 'foo'", "dream", "idlm")


def test_a_config_without_model_type_is_named(ck, tmp_path, cli):
    d = damaged(ck, "sdar", tmp_path / "nomt", config=lambda raw: raw.pop("model_type"))
    err = one_line(cli("decode", "--model", d, *SHORT), "config.json has no model_type", "sdar")
    assert "remote code" not in err


def test_special_ids_outside_the_vocabulary_are_one_line(ck, tmp_path, cli):
    d = damaged(ck, "idlm", tmp_path / "idlm_vocab_small", config=lambda raw: raw.update(vocab_size=100))
    one_line(cli("models", "inspect", d, "--family", "idlm"), "eos_token_id 256", "vocabulary of 100 tokens")
    one_line(cli("decode", "--model", f"idlm:{d}", *SHORT), "outside its vocabulary")


@pytest.mark.parametrize("family,tensor", [("llada", "model.transformer.blocks.0.q_proj.weight"),
                                           ("fast_dllm_v2", "model.layers.0.self_attn.q_proj.weight")])
def test_a_wrong_shape_tensor_is_named_with_both_shapes(ck, tmp_path, cli, family, tensor):
    def shrink(state):
        state[tensor] = state[tensor][:-1].clone()

    d = damaged(ck, family, tmp_path / f"{family}_shape", weights=shrink)
    want = list(load_file(str(ck[family] / "model.safetensors"))[tensor].shape)
    got = [want[0] - 1, *want[1:]]
    err = one_line(cli("decode", "--model", d, *SHORT), f"tensor {tensor} has shape {got}", f"describes {want}")
    assert "look at the above report" not in err
    r = cli("collect", "--model", d, "--out", tmp_path / "store", "--n_prompts", "2", "--block_lengths", "[4]",
            "--blocks_per_prompt", "1", "--context_len", "16", "--batch_size", "2", "--progress_bar", "false")
    one_line(r, tensor)
    assert not (tmp_path / "store").exists()


def test_a_wrong_shape_tensor_of_diffusion_gemma_is_named(ck, tmp_path, cli):
    state = load_file(str(ck["diffusion_gemma"] / "model.safetensors"))
    tensor = next(k for k in sorted(state) if k.endswith("down_proj.weight"))

    def shrink(s):
        s[tensor] = s[tensor][:, :-1].clone()

    d = damaged(ck, "diffusion_gemma", tmp_path / "gemma_shape", weights=shrink)
    one_line(cli("decode", "--model", d, "--policy", "diffusion_gemma", *SHORT), f"tensor {tensor}", "describes")
