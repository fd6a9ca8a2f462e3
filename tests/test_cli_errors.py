"""Bad input: one-line error, non-zero exit, nothing half-written."""
import json
from pathlib import Path

import pytest
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from conftest import run_cli
from workbench.model.presets import preset_config


def _assert_one_line_error(proc, *needles):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [l for l in proc.stderr.strip().splitlines() if "error" in l]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def demo_args(tmp_path, small_corpus):
    return ["--corpus", str(small_corpus), "--n_prompts", "2", "--gen_len", "16", "--prompt_len", "32",
            "--block_lengths", "[4]", "--thresholds", "[0.9]", "--heldout_windows", "2", "--progress_bar", "false",
            "--collect_block_lengths", "[4]", "--sampler_block_length", "4"]


def test_missing_model_path(tmp_path, demo_args):
    out = tmp_path / "run"
    p = run_cli("demo", "--model", str(tmp_path / "nope"), "--out_dir", str(out), *demo_args)
    _assert_one_line_error(p, "does not exist")
    assert not out.exists() and not (tmp_path / "run.partial").exists()


def test_non_hf_model_path(cli, tmp_path, demo_args):
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "weights.bin").write_bytes(b"\0" * 10)
    out = tmp_path / "run"
    p = cli("demo", "--model", str(tmp_path / "notamodel"), "--out_dir", str(out), *demo_args)
    _assert_one_line_error(p, "not a Hugging Face checkpoint")
    assert not out.exists()


def test_tokenizer_without_mask_token_offers_to_add(cli, tmp_path, demo_args, tokenizer):
    ck = tmp_path / "nomask"
    LlamaForCausalLM(preset_config("micro")).save_pretrained(ck)
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="[EOS]", pad_token="[EOS]")
    tok.save_pretrained(ck)
    cfg = json.loads((ck / "tokenizer_config.json").read_text())
    assert cfg.get("mask_token") is None
    out = tmp_path / "run"
    p = cli("decode", "--model", str(ck), "--gen_len", "8", "--block_length", "4")
    _assert_one_line_error(p, "no mask token", "--add_mask_token true")
    p = cli("decode", "--model", str(ck), "--gen_len", "8", "--block_length", "4", "--add_mask_token", "true")
    assert p.returncode == 0, p.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["--block_lengths", "[0]"], "block length must be positive"),
    (["--block_lengths", "[-8]"], "block length must be positive"),
    (["--block_lengths", "[4096]", "--gen_len", "4096"], "larger than the model context"),
    (["--thresholds", "[0.0]"], "threshold must be in (0, 1]"),
    (["--thresholds", "[1.2]"], "threshold must be in (0, 1]"),
])
def test_bad_block_length_and_threshold(cli, tmp_path, demo_args, args, needle, micro_checkpoint):
    out = tmp_path / "run"
    p = cli("demo", "--model", str(micro_checkpoint), "--out_dir", str(out), *demo_args, *args)
    _assert_one_line_error(p, needle)
    assert not out.exists() and not (tmp_path / "run.partial").exists()


def test_empty_corpus(cli, tmp_path, demo_args, micro_checkpoint):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "run"
    args = [a if a != demo_args[1] else str(empty) for a in demo_args]
    p = cli("demo", "--model", str(micro_checkpoint), "--out_dir", str(out), *args)
    _assert_one_line_error(p, "is empty")
    assert not out.exists() and not (tmp_path / "run.partial").exists()


def test_unwritable_run_dir(cli, tmp_path, demo_args, micro_checkpoint):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = cli("demo", "--model", str(micro_checkpoint), "--out_dir", str(blocker / "run"), *demo_args)
    _assert_one_line_error(p, "not writable")
    p = cli("train", "lm", "--config", "workbench/configs/micro.yaml", "--out_dir", str(blocker / "train"))
    _assert_one_line_error(p, "not writable")
    p = cli("evaluate", "--model", str(micro_checkpoint), "--out_dir", str(blocker / "eval"))
    _assert_one_line_error(p, "not writable")
    p = cli("sol", "--model", str(micro_checkpoint), "--out_dir", str(blocker / "sol"))
    _assert_one_line_error(p, "not writable")


def test_evaluate_checks_run_dir_before_decoding(tmp_path, monkeypatch):
    """An unwritable run directory fails before the model is loaded or anything is decoded."""
    from workbench.evaluation import harness
    from workbench.utils import RunDirError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr(harness, "load_model", lambda *a, **k: pytest.fail("model loaded before the check"))
    with pytest.raises(RunDirError, match="not writable"):
        harness.run_evaluate(harness.EvalConfig(out_dir=str(blocker / "eval")))
    assert not (blocker / "eval").exists()
    foreign = tmp_path / "notes"                # a directory of other files is never replaced
    foreign.mkdir()
    (foreign / "paper.txt").write_text("x")
    with pytest.raises(RunDirError, match="will not be replaced"):
        harness.run_evaluate(harness.EvalConfig(out_dir=str(foreign)))


def test_sol_checks_run_dir_and_lengths_before_the_search(tmp_path, monkeypatch, micro_checkpoint):
    """``workbench sol``: an unwritable run directory fails before the model is loaded; a prompt + generation
    longer than the model context fails before any block is searched."""
    from workbench.decoding.base import DecodeError
    from workbench.evaluation import harness
    from workbench.sol import run as sol_run
    from workbench.utils import RunDirError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with monkeypatch.context() as m:
        m.setattr(harness, "load_model", lambda *a, **k: pytest.fail("model loaded before the check"))
        with pytest.raises(RunDirError, match="not writable"):
            sol_run.run_sol_eval(sol_run.SolConfig(out_dir=str(blocker / "sol")))
    monkeypatch.setattr(sol_run, "run_sol", lambda *a, **k: pytest.fail("searched before the length check"))
    with pytest.raises(DecodeError, match="exceeds the model context"):
        sol_run.run_sol_eval(sol_run.SolConfig(model=str(micro_checkpoint), prompt_len=1000, gen_len=64,
                                               device="cpu", out_dir=str(tmp_path / "sol")))
    assert not (tmp_path / "sol").exists()


def test_check_run_dir_probes_for_real(tmp_path):
    """``check_run_dir`` creates nothing on success and refuses a path it cannot write even where
    ``os.access`` says yes (root on /proc), by making and removing a probe directory."""
    from workbench.utils import RunDirError, check_run_dir

    check_run_dir(tmp_path / "a" / "b")
    assert list(tmp_path.iterdir()) == []
    if Path("/proc/self").is_dir():             # procfs (Linux): no new entries, whoever the user is
        with pytest.raises(RunDirError, match="not writable"):
            check_run_dir("/proc/workbench-run")


def test_bad_option_value(cli, tmp_path):
    p = cli("demo", "--n_prompts", "abc")
    _assert_one_line_error(p, "n_prompts")
    p = run_cli("frobnicate")
    assert p.returncode == 2 and "valid:" in p.stderr


def test_staged_dir_replaces_only_on_success(tmp_path):
    """``staged_dir``: the final directory appears (replacing an old one) only when the block succeeds; a
    failure leaves the old one untouched and no staging folder; with ``relocate`` the text files name the
    final path instead of the staging one (a sub-run's recorded ``out_dir``), binary files are left alone."""
    from workbench.utils import RUN_MARKER, staged_dir

    final = tmp_path / "run"
    final.mkdir()
    (final / "old.txt").write_text("old")
    (final / RUN_MARKER).touch()                                        # an earlier run's output
    with pytest.raises(KeyboardInterrupt):
        with staged_dir(final) as run:
            (run / "half.json").write_text("{}")
            raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and (final / "old.txt").exists()

    with staged_dir(final, relocate=True) as run:
        assert run == tmp_path / "run.partial"
        (run / "sub").mkdir()
        (run / "sub" / "config.yaml").write_text(f"out_dir: {run / 'sub'}\nmodel: builtin:tiny\n")
        (run / "metrics.json").write_text(json.dumps({"adapter": str(run / "lora" / "adapter")}))
        (run / "weights.bin").write_bytes(str(run).encode())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and not (final / "old.txt").exists()
    assert (final / "sub" / "config.yaml").read_text() == f"out_dir: {final / 'sub'}\nmodel: builtin:tiny\n"
    assert json.loads((final / "metrics.json").read_text()) == {"adapter": str(final / "lora" / "adapter")}
    assert (final / "weights.bin").read_bytes() == str(tmp_path / "run.partial").encode()
    assert (final / RUN_MARKER).exists()                               # a rerun may replace it


def test_staged_dir_never_replaces_a_foreign_directory(cli, tmp_path):
    """``--out_dir .`` or a parent of runs must not be deleted: a non-empty directory without the marker
    (or a file) is refused before anything is built; an empty directory is fine."""
    from workbench.utils import RunDirError, staged_dir

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("keep")
    for target, needle in ((tmp_path / "src", "not written by a workbench command"),
                           (tmp_path / "notes.txt", "not a directory")):
        with pytest.raises(RunDirError, match=needle):
            with staged_dir(target):
                pytest.fail("the block ran")
    assert (tmp_path / "src" / "code.py").read_text() == "x = 1\n" and (tmp_path / "notes.txt").exists()
    assert not list(tmp_path.glob("*.partial"))
    (tmp_path / "empty").mkdir()
    with staged_dir(tmp_path / "empty") as run:
        (run / "a.json").write_text("{}")
    assert (tmp_path / "empty" / "a.json").exists()
    p = cli("speculate", "--out_dir", str(tmp_path / "src"))           # the CLI: one line, rc 2
    _assert_one_line_error(p, "not written by a workbench command")


# ------------------------------------------------ found by a CLI fuzz pass (session 12), run in-process
def _in_process_error(cli, *argv) -> str:
    """Run the CLI in this process (the ``cli`` fixture: warnings and log records reach stderr as in a fresh
    process); assert exit status 2 and one line on stderr; return that line."""
    p = cli(*argv)
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("args, needle", [
    (["--device", "foo"], "unknown device"),
    (["--policy", "ar_sample", "--temperature", "-1"], "temperature > 0"),
    (["--policy", "sampler"], "the sampler policy needs --sampler <path>"),
    (["--policy", "deer"], "the deer policy needs --drafter <path>"),
    (["--policy", "diffuspec"], "the diffuspec policy needs --proxy <path>"),
    (["--prompt", "@/nonexistent/prompt.py"], "does not exist or is not a file"),
    (["--policy", "ar_sample", "--top_p", "0"], "top_p must be in (0, 1]"),
    (["--policy", "ar_sample", "--top_k", "-3"], "top_k must be an integer ≥ 0"),
], ids=["device", "negative_temperature", "sampler_policy", "deer_policy", "diffuspec_policy", "prompt_file", "top_p",
        "top_k"])
def test_decode_bad_options(cli, micro_checkpoint, args, needle):
    line = _in_process_error(cli, "decode", "--model", micro_checkpoint, "--gen_len", "8", "--block_length", "4",
                             *args)
    assert needle in line


def test_checkpoint_whose_config_does_not_match_its_weights(tmp_path, cli, micro_checkpoint):
    """A config.json of another architecture used to load a randomly initialised model and decode (exit 0)."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(micro_checkpoint, bad)
    (bad / "config.json").write_text(json.dumps({"model_type": "bert", "is_decoder": True}))
    assert "are not in the checkpoint" in _in_process_error(cli, "decode", "--model", bad, "--gen_len", "8",
                                                             "--block_length", "4")
    shutil.rmtree(bad)
    shutil.copytree(micro_checkpoint, bad)
    (bad / "workbench.json").write_text("{oops")
    assert "workbench.json is not valid JSON" in _in_process_error(cli, "decode", "--model", bad, "--gen_len",
                                                                    "8", "--block_length", "4")


def test_sweep_never_appends_to_a_user_file(tmp_path, cli, micro_checkpoint, small_corpus):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    line = _in_process_error(cli, "sweep", "--model", micro_checkpoint, "--corpus", small_corpus, "--storage", notes,
                             "--out_dir", tmp_path / "sw", "--n_trials", "1", "--n_prompts", "2", "--gen_len", "8",
                             "--prompt_len", "16", "--block_lengths", "[4]")
    assert "not an Optuna journal" in line and notes.read_text() == "my notes\n"
    assert "unknown context mode" in _in_process_error(cli, "sweep", "--mode", "bogus", "--out_dir", tmp_path / "s2")


def test_deer_teacher_never_writes_into_a_user_directory(tmp_path, cli, micro_checkpoint, small_corpus):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    line = _in_process_error(cli, "deer", "teacher", "--target", micro_checkpoint, "--corpus", small_corpus,
                             "--out_dir", src, "--n_answers", "4", "--prompt_len", "16", "--gen_len", "8")
    assert "holds no teacher data" in line and [p.name for p in src.iterdir()] == ["a.py"]


def test_evaluate_sol_and_demo_option_checks(tmp_path, cli, micro_checkpoint, small_corpus):
    assert "--modes is empty" in _in_process_error(cli, "evaluate", "--model", micro_checkpoint, "--modes", "[]",
                                                   "--out_dir", tmp_path / "ev")
    assert "threshold must be in (0, 1]" in _in_process_error(cli, "sol", "--model", micro_checkpoint,
                                                              "--threshold", "1.5", "--out_dir", tmp_path / "sol")
    line = _in_process_error(cli, "demo", "--model", micro_checkpoint, "--sampler_block_length", "16",
                             "--out_dir", tmp_path / "demo")
    assert "--sampler_block_length 16 is not among --collect_block_lengths" in line
    line = _in_process_error(cli, "demo", "--model", micro_checkpoint, "--collect_block_lengths", "[8, 32]",
                             "--sampler_block_length", "32", "--out_dir", tmp_path / "demo")
    assert "--sampler_block_length 32 is not among --leaderboard_block_lengths [4, 8, 16]" in line
    line = _in_process_error(cli, "demo", "--model", micro_checkpoint, "--block_lengths", "[8]",
                             "--headline_block_length", "16", "--out_dir", tmp_path / "demo")
    assert "--headline_block_length 16 is not among --block_lengths [8]" in line
    assert not any((tmp_path / d).exists() for d in ("ev", "sol", "demo"))


def test_in_process_cli_sees_what_a_process_would_print(cli, monkeypatch):
    """The ``cli`` fixture's one-line checks can fail: a command's warnings, log records (WARNING and above) and
    transformers' logger reach its stderr, as they would a fresh process's, and the environment is restored."""
    import logging
    import os
    import warnings

    from transformers.utils import logging as hf_logging

    from workbench import cli as workbench_cli

    def noisy(argv):
        warnings.warn("a library warning", UserWarning)
        logging.getLogger("some.library").warning("a log record")
        hf_logging.get_logger("transformers.some_module").error("a transformers error")
        os.environ["WORKBENCH_TEST_LEAK"] = "1"
        return 0

    monkeypatch.setattr(workbench_cli, "_commands", lambda: {"noisy": noisy})
    p = cli("noisy")
    assert p.returncode == 0
    for line in ("a library warning", "a log record", "a transformers error"):
        assert line in p.stderr, p.stderr
    assert "WORKBENCH_TEST_LEAK" not in os.environ


def test_workbench_help_lists_every_command_the_cli_dispatches():
    """`workbench --help` names every command `workbench` dispatches (and every `train` kind), so none can hide."""
    from workbench import cli

    lines = [line.split()[:2] for line in cli.USAGE.splitlines() if line.startswith("  ")]
    listed = {words[0] for words in lines}
    assert set(cli._commands()) <= listed, sorted(set(cli._commands()) - listed)
    trains = {words[1] for words in lines if words[0] == "train"}
    assert set(cli.TRAIN_KINDS) <= trains
