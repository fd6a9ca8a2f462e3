"""Inputs checked against each other (issue 56 §3): an adapter's config against its weights and the model, a
tokenizer against the model's embedding, a ``--config`` file against what a config file is. Each fault gives exit
code 2, exactly one stderr line naming what is wrong, and no output; the intact inputs still load."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import bpe_tokenizer, run_cli
from workbench.assets import builtin_model_path
from workbench.model.io import load_checkpoint
from workbench.model.load import load_model

TINY = str(builtin_model_path("tiny"))


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def one_line(p, *needles):
    """``p`` (a CompletedProcess) is a user error: exit code 2, one stderr line holding every needle."""
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-3000:])
    assert len(err) == 1, err
    for needle in needles:
        assert str(needle) in err[0], err[0]
    return err[0]


@pytest.fixture
def work(tmp_path):
    """An empty working folder: every command's default and relative outputs land here, and must not."""
    d = tmp_path / "work"
    d.mkdir()
    return d


# ---- adapters -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, micro_checkpoint):
    """A peft LoRA drafter (q_proj, o_proj, r = 4) and a gated adapter (every projection, r = 4, the mask row)
    trained on nothing, saved with the code's own writers on the micro checkpoint."""
    from workbench.drafter.lora import add_lora, save_adapter
    from workbench.model.gated_lora import attach_gated_lora, save_gated_adapter

    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    model, _, _ = load_checkpoint(micro_checkpoint)
    save_adapter(add_lora(model, 4, 8, target_modules=["q_proj", "o_proj"]), root / "lora")
    model, _, _ = load_checkpoint(micro_checkpoint)
    save_gated_adapter(attach_gated_lora(model, 4, 8), root / "gated", {"init_from": str(micro_checkpoint)})
    return root


def _edit_config(d: Path, **changes) -> None:
    f = d / "adapter_config.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), **changes}))


def _truncate_weights(d: Path) -> None:
    f = d / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:-64])


#: (case, how the copy of the adapter is damaged, words the one line must hold)
LORA_FAULTS = [
    ("fewer-targets", lambda d: _edit_config(d, target_modules=["o_proj"]),
     ["target_modules [o_proj]", "o_proj, q_proj", "re-save"]),
    ("more-targets", lambda d: _edit_config(d, target_modules=["q_proj", "k_proj", "o_proj"]),
     ["target_modules [k_proj, o_proj, q_proj]", "hold o_proj, q_proj"]),
    ("rank", lambda d: _edit_config(d, r=8), ["r = 8", "rank 4", "re-save"]),
    ("truncated", _truncate_weights, ["adapter_model.safetensors", "truncated"]),
    ("no-weights", lambda d: (d / "adapter_model.safetensors").unlink(), ["no adapter_model.safetensors"]),
]


@pytest.mark.parametrize("case, damage, needles", LORA_FAULTS, ids=[c[0] for c in LORA_FAULTS])
def test_lora_drafter_whose_config_disagrees_with_its_weights_is_refused(case, damage, needles, adapters,
                                                                         micro_checkpoint, work, cli):
    """A peft drafter whose adapter_config.json lists fewer target modules than its weights hold loaded silently and
    decoded garbage; a changed rank gave a 453-line traceback, a truncated weights file 34 lines. Now each is one line
    naming the folder, before the model decodes (speculate stops there, before its corpus is read)."""
    bad = work.parent / f"lora-{case}"
    shutil.copytree(adapters / "lora", bad)
    damage(bad)
    before = _listing(work)

    def speculate(adapter):
        return cli("speculate", "--model", micro_checkpoint, "--adapter", adapter, "--corpus",
                   work.parent / "nope.txt", "--out_dir", "spec", cwd=work)

    one_line(speculate(bad), str(bad), *needles)
    assert _listing(work) == before
    one_line(speculate(adapters / "lora"), "nope.txt")       # the intact adapter loads: the corpus is next


def _rebase(d: Path, base: Path) -> None:
    """Point the gated adapter ``d`` at another base (and drop the mask id the other tokenizer would not give)."""
    f = d / "workbench.json"
    meta = {k: v for k, v in json.loads(f.read_text()).items() if k != "mask_token_id"}
    f.write_text(json.dumps({**meta, "init_from": str(base)}))


GATED_FAULTS = [
    ("fewer-targets", lambda d, _: _edit_config(d, target_modules=["q_proj", "o_proj"]),
     ["target_modules [o_proj, q_proj]", "down_proj, gate_proj, k_proj"]),
    ("rank", lambda d, _: _edit_config(d, r=2), ["r = 2", "rank 4"]),
    ("truncated", lambda d, _: _truncate_weights(d), ["adapter_model.safetensors", "truncated"]),
    ("token-rows", lambda d, _: _edit_config(d, trainable_token_indices={"embed_tokens": [256, 257]}),
     ["2 token ids", "[1, 64]"]),
    ("another-base", lambda d, ar: _rebase(d, ar), ["mlp.down_proj", "176", "another model"]),
]


@pytest.mark.parametrize("case, damage, needles", GATED_FAULTS, ids=[c[0] for c in GATED_FAULTS])
def test_gated_adapter_whose_config_disagrees_with_its_weights_is_refused(case, damage, needles, adapters,
                                                                          ar_checkpoint, work, cli):
    """The gated adapter of a converted model (loaded by --model <adapter folder>) is checked the same way: its
    config against its weights, and every weight's shape against the base it is loaded on (``another-base``: the
    micro adapter put on a two-layer model with another MLP width gave peft's size-mismatch traceback)."""
    bad = work.parent / f"gated-{case}"
    shutil.copytree(adapters / "gated", bad)
    damage(bad, ar_checkpoint)
    before = _listing(work)
    p = cli("decode", "--model", bad, "--prompt", "def f", "--gen_len", "8", "--block_length", "4", cwd=work)
    one_line(p, str(bad), *needles)
    assert _listing(work) == before
    ok = cli("decode", "--model", adapters / "gated", "--prompt", "def f", "--gen_len", "8", "--block_length", "4",
             cwd=work)
    assert ok.returncode == 0, ok.stderr[-2000:]


# ---- tokenizer against model ----------------------------------------------------------------------------------


def test_tokenizer_of_another_model_is_refused(micro_checkpoint, ar_checkpoint, work, cli):
    """The micro model (264 embedding rows) given a 320-token BPE tokenizer in place of its own decoded garbage (or
    indexed past its embedding); now loading refuses it in one line naming the folder and both sizes. The models
    that fit still load: the shipped tiny and micro (more rows than tokens), an AR model whose tokenizer lacks a mask
    token (the row added), and one with the mask added."""
    foreign = work.parent / "micro-foreign-tokenizer"
    shutil.copytree(micro_checkpoint, foreign)
    for f in foreign.glob("tokenizer*"):
        f.unlink()
    bpe_tokenizer().save_pretrained(foreign)
    before = _listing(work)
    p = cli("decode", "--model", foreign, "--prompt", "def f", "--gen_len", "8", "--block_length", "4", cwd=work)
    one_line(p, str(foreign), "320 tokens", "264 rows", "belong to another model", "restore")
    assert _listing(work) == before
    for spec in (TINY, micro_checkpoint):
        load_model(str(spec))
    model, tok, _ = load_model(str(ar_checkpoint), add_mask_token=True)
    assert model.mask_token_id == len(tok) - 1 < model.backbone.get_input_embeddings().num_embeddings


def test_special_token_outside_the_embedding_is_refused():
    """A special token id past the embedding (a tokenizer whose ids have holes) is refused naming the token."""
    from workbench.tokenizer import TokenizerError, check_tokenizer_fits

    class Holey:
        all_special_tokens, all_special_ids = ["<s>", "<pad>"], [0, 5000]

        def __len__(self):
            return 100

    with pytest.raises(TokenizerError, match=r"'<pad>' the id 5000.*200 rows.*belong to another model"):
        check_tokenizer_fits(Holey(), 200, "/m")
    check_tokenizer_fits(Holey(), 5001, "/m")


# ---- config files ---------------------------------------------------------------------------------------------


def test_config_fifo_is_refused_without_being_read(tmp_path):
    """``--config <a FIFO>`` blocked forever (jsonargparse opened it and waited for a writer); now it is refused
    from its file type alone, at once. A process of its own, so that the old hang ends at the timeout."""
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    p = run_cli("store", "info", "--config", str(fifo), timeout=60)
    one_line(p, str(fifo), "is a FIFO, not a regular file")


@pytest.fixture
def configs(tmp_path):
    """Bad config files, in a folder of their own."""
    d = tmp_path / "configs"
    d.mkdir()
    files = {"empty.yaml": b"", "comments.yaml": b"# nothing set\n", "latin1.yaml": "store: caf\xe9\n".encode("latin-1"),
             "list.yaml": b"- store\n- x\n", "scalar.yaml": b"store\n",
             "dup.yaml": b"store: a.zarr\nstore: b.zarr\n", "dup-nested.yaml": b"store: a.zarr\nx:\n  y: 1\n  y: 2\n"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return d


#: (file, how the option is spelled, words the one line must hold): every spelling reaches the same check
CONFIG_FAULTS = [
    ("empty.yaml", "--config", "is empty"),
    ("comments.yaml", "--config", "is empty"),
    ("latin1.yaml", "--config", "is not UTF-8"),
    ("list.yaml", "--config", "holds a YAML list, not a mapping"),
    ("scalar.yaml", "--config", "holds a YAML str, not a mapping"),
    ("dup.yaml", "--config=", "sets 'store' twice (lines 1 and 2)"),
    ("dup-nested.yaml", "--conf", "sets 'y' twice (lines 3 and 4)"),
    ("/dev/zero", "--config", "is a character device, not a regular file"),
    ("configs", "--config", "is a directory, not a regular file"),
]


@pytest.mark.parametrize("name, option, needle", CONFIG_FAULTS, ids=[c[0] for c in CONFIG_FAULTS])
def test_bad_config_file_is_refused_naming_it(name, option, needle, configs, work, cli):
    """Config files that are not a regular UTF-8 YAML mapping with each option once: an empty one, a list, a
    latin-1 one were refused without the file's name, and a repeated option silently kept its last value."""
    f = {"/dev/zero": Path("/dev/zero"), "configs": configs}.get(name, configs / name)
    before = _listing(work)
    args = [f"{option}{f}"] if option.endswith("=") else [option, f]
    one_line(cli("store", "info", *args, cwd=work), f"config file {f}", needle)
    assert _listing(work) == before


NULL_FIELDS = [("evaluate", "n_prompts", "int"), ("collect", "batch_size", "int"), ("sweep", "gen_len", "int")]


@pytest.mark.parametrize("cmd, field, kind", NULL_FIELDS, ids=[c[0] for c in NULL_FIELDS])
def test_null_for_an_option_that_cannot_be_none_is_one_line(cmd, field, kind, tmp_path, work, cli):
    """``field: null`` in a YAML config gave a 19-28-line TypeError; it is now one line naming the option, as
    ``--field null`` on the command line already was."""
    f = tmp_path / "null.yaml"
    f.write_text(f"{field}: null\n")
    before = _listing(work)
    one_line(cli(cmd, "--config", f, cwd=work), f"option {field} is null", f"must be of type {kind}")
    one_line(cli(cmd, f"--{field}", "null", cwd=work), field)
    assert _listing(work) == before
