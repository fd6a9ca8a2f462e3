"""A table of bad inputs across the commands (issue 27 §6-7). For each: exit code 2, exactly one line on stderr,
and no new file in the working folder (every command's output goes there). Run in-process (the ``cli`` fixture,
which prints warnings and log records as a fresh process would) so that the table stays inside the default
suite's time budget."""
from pathlib import Path

import pytest

from workbench.assets import builtin_model_path

TINY = str(builtin_model_path("tiny"))


def _fixtures(root: Path) -> dict:
    """Bad files the cases point at, made once."""
    (root / "empty_corpus").mkdir()
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("the user's own file\n")
    (root / "nomodel").mkdir()
    (root / "nomodel" / "config.json").write_text("{}")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") * 50)
    (root / "afile").write_text("x")
    store = root / "garbage.zarr"
    store.mkdir()
    (store / "zarr.json").write_bytes(b"\xb4 not json")
    return {"root": root}


CASES = [
    # decode
    ("decode-missing-model", ["decode", "--model", "{root}/nope"], "does not exist"),
    ("decode-unknown-model-name", ["decode", "--model", "smollm2-999m"], "valid:"),
    ("decode-unknown-policy", ["decode", "--policy", "nope"], "valid:"),
    ("decode-threshold-0", ["decode", "--threshold", "0"], "threshold"),
    ("decode-threshold-1.5", ["decode", "--threshold", "1.5"], "threshold"),
    ("decode-block-0", ["decode", "--block_length", "0"], "block length"),
    ("decode-block-not-dividing", ["decode", "--block_length", "5", "--gen_len", "16"], "does not divide"),
    ("decode-gen-0", ["decode", "--gen_len", "0"], "generation length"),
    ("decode-precision", ["decode", "--precision", "fp8"], "precision"),
    ("decode-cuda", ["decode", "--device", "cuda:7"], "cuda"),
    ("decode-prompt-file-missing", ["decode", "--prompt", "@{root}/nope.txt"], "does not exist"),
    ("decode-prompt-file-dir", ["decode", "--prompt", "@{root}/foreign"], "not a file"),
    ("decode-prompt-not-utf8", ["decode", "--prompt", "@{root}/latin1.txt"], "UTF-8"),
    ("decode-sampler-block", ["decode", "--policy", "sampler", "--block_length", "16"], "trained at block length 8"),
    ("decode-ar-sample-t0", ["decode", "--policy", "ar_sample", "--temperature", "0"], "temperature"),
    ("decode-isd-stride-1", ["decode", "--policy", "isd", "--block_length", "1", "--gen_len", "8"], "stride"),
    ("decode-unknown-option", ["decode", "--bogus", "1"], "bogus"),
    ("decode-bad-type", ["decode", "--gen_len", "many"], "gen_len"),
    # evaluate
    ("evaluate-modes-empty", ["evaluate", "--modes", "[]"], "modes"),
    ("evaluate-modes-bogus", ["evaluate", "--modes", "[bogus]"], "bogus"),
    ("evaluate-threshold", ["evaluate", "--thresholds", "[0]"], "threshold"),
    ("evaluate-block-0", ["evaluate", "--block_lengths", "[0]"], "block length"),
    ("evaluate-gen-not-dividing", ["evaluate", "--gen_len", "100"], "divide"),
    ("evaluate-precision", ["evaluate", "--precision", "fp8"], "precision"),
    ("evaluate-out-is-file", ["evaluate", "--out_dir", "{root}/afile"], "not a directory"),
    ("evaluate-foreign-out", ["evaluate", "--out_dir", "{root}/foreign"], "not written by a workbench"),
    ("evaluate-missing-corpus", ["evaluate", "--corpus", "{root}/nope.txt", "--n_prompts", "2"], "neither"),
    # sol
    ("sol-threshold", ["sol", "--threshold", "0"], "threshold"),
    ("sol-block-0", ["sol", "--block_lengths", "[0]"], "block length"),
    ("sol-foreign-out", ["sol", "--out_dir", "{root}/foreign"], "not written by a workbench"),
    # collect
    ("collect-blocks-empty", ["collect", "--block_lengths", "[]", "--out", "s.zarr"], "block_lengths"),
    ("collect-rows-per-chunk-0", ["collect", "--rows_per_chunk", "0", "--out", "s.zarr"], "rows_per_chunk"),
    ("collect-rows-per-chunk-neg", ["collect", "--rows_per_chunk", "-5", "--out", "s.zarr"], "rows_per_chunk"),
    ("collect-context-0", ["collect", "--context_len", "0", "--out", "s.zarr"], "context_len"),
    ("collect-policy", ["collect", "--policy", "nope", "--out", "s.zarr"], "valid:"),
    ("collect-threshold", ["collect", "--threshold", "2", "--out", "s.zarr"], "threshold"),
    ("collect-n-prompts-0", ["collect", "--n_prompts", "0", "--out", "s.zarr"], "n_prompts"),
    ("collect-prompts-not-utf8", ["collect", "--prompts", "{root}/latin1.txt", "--out", "s.zarr"], "latin1.txt"),
    ("collect-feature-dim", ["collect", "--feature_dim", "7", "--out", "s.zarr"], "feature"),
    # stores
    ("store-verify-missing", ["store", "verify", "--store", "{root}/nope.zarr"], "no trajectory store"),
    ("store-info-missing", ["store", "info", "--store", "{root}/nope.zarr"], "no trajectory store"),
    ("store-verify-garbage-metadata", ["store", "verify", "--store", "{root}/garbage.zarr"], "zarr.json"),
    # train lm
    ("train-lm-seq-0", ["train", "lm", "--preset", "micro", "--seq_len", "0"], "seq_len"),
    ("train-lm-preset", ["train", "lm", "--preset", "huge"], "valid:"),
    ("train-lm-averaging", ["train", "lm", "--averaging", "bogus"], "valid:"),
    ("train-lm-lr", ["train", "lm", "--preset", "micro", "--lr", "-1"], "lr"),
    ("train-lm-block-not-dividing", ["train", "lm", "--block_lengths", "[5]"], "divide"),
    ("train-lm-objective", ["train", "lm", "--objective", "bogus"], "valid:"),
    ("train-lm-lora-without-init", ["train", "lm", "--lora_rank", "4"], "init_from"),
    ("train-lm-foreign-out", ["train", "lm", "--preset", "micro", "--out_dir", "{root}/foreign"],
     "not a `workbench train lm` run"),
    ("train-lm-empty-corpus", ["train", "lm", "--preset", "micro", "--corpus", "{root}/empty_corpus"], "empty"),
    ("train-lm-init-without-weights", ["train", "lm", "--init_from", "{root}/nomodel"], "nomodel"),
    ("train-lm-seq-beyond-context", ["train", "lm", "--init_from", TINY, "--seq_len", "4096"], "context"),
    ("train-lm-max-steps-0", ["train", "lm", "--max_steps", "0", "--stage1_steps", "0"], "max_steps"),
    ("train-unknown-kind", ["train", "gan"], "usage"),
    # train sampler / lora / deer
    ("train-sampler-missing-store", ["train", "sampler", "--store", "{root}/nope.zarr"], "no trajectory store"),
    ("train-sampler-preset", ["train", "sampler", "--preset", "bogus"], "valid:"),
    ("train-sampler-batch-0", ["train", "sampler", "--batch_size", "0"], "positive"),
    ("train-lora-loss", ["train", "lora", "--loss", "reverse_kl"], "valid:"),
    ("train-lora-rank-0", ["train", "lora", "--rank", "0"], "rank"),
    ("train-deer-stage", ["train", "deer", "--stage", "3"], "stage"),
    ("train-deer-missing-teacher", ["train", "deer", "--teacher", "{root}/nope"], "teacher"),
    # sweep
    ("sweep-bogus-storage", ["sweep", "--storage", "bogus://x/y", "--out_dir", "sw"], "RDB URL"),
    ("sweep-storage-foreign-file", ["sweep", "--storage", "{root}/latin1.txt", "--out_dir", "sw"], "not an Optuna journal"),
    ("sweep-policy", ["sweep", "--policy", "nope", "--out_dir", "sw"], "valid:"),
    ("sweep-mode", ["sweep", "--mode", "bogus", "--out_dir", "sw"], "valid:"),
    ("sweep-sampler-missing", ["sweep", "--policy", "sampler", "--out_dir", "sw"], "--sampler"),
    # leaderboard
    ("leaderboard-decoder", ["leaderboard", "--decoders", "[nope]"], "valid:"),
    ("leaderboard-modes-empty", ["leaderboard", "--modes", "[]"], "modes"),
    ("leaderboard-block-not-dividing", ["leaderboard", "--block_lengths", "[5]"], "divide"),
    ("leaderboard-temperature", ["leaderboard", "--temperature", "0"], "temperature"),
    ("leaderboard-missing-sampler", ["leaderboard", "--decoders", "[sampler]", "--sampler", "{root}/no_sampler"],
     "workbench train sampler"),
    ("leaderboard-foreign-out", ["leaderboard", "--out_dir", "{root}/foreign"], "not written by a workbench"),
    # models, speculate, deer
    ("models-unknown", ["models", "fetch", "nope"], "valid:"),
    ("speculate-draft-0", ["speculate", "--draft_lengths", "[0]"], "draft length"),
    ("deer-eval-missing-drafter", ["deer", "eval", "--drafter", "{root}/nope"], "nope"),
    ("unknown-command", ["frobnicate"], "valid:"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("fuzz")
    _fixtures(r)
    return r


def _listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def test_the_table_is_large_enough():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("name, argv, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, argv, needle, root, tmp_path, cli):
    work = tmp_path / "work"
    work.mkdir()
    argv = [a.replace("{root}", str(root)) for a in argv]
    before_root, before_work = _listing(root), _listing(work)
    p = cli(*argv, cwd=work)                         # default and relative outputs land in work
    rc, err = p.returncode, p.stderr.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(err) == 1, err
    assert needle in err[0], err[0]
    assert _listing(work) == before_work and _listing(root) == before_root
