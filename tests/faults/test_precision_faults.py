"""The suite on both kinds of CPU: with and without native bf16 matmuls (AVX-512 BF16 or AMX).

On a CPU without them, the sweep's default precision was bf16 and it printed a Python ``UserWarning`` (with its
source path) beside its one line, and two tests failed. Now the commands whose default was bf16 (``evaluate``,
``sweep``, ``collect``) default to 'auto' (docs/guides/precision.md: bf16 where native, fp32 otherwise), record the
precision they resolved to, and print nothing about it; a precision the user chose is never commented on. Both
kinds of CPU are reproduced here through the capability override ``WORKBENCH_NATIVE_BF16``.
"""
from __future__ import annotations

import json

import pytest

from workbench.decoding.base import NATIVE_BF16_ENV

SWEEP = ["sweep", "--model", "tiny", "--n_trials", "1", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "16",
         "--block_lengths", "[8]", "--batch_size", "2"]
EVALUATE = ["evaluate", "--model", "tiny", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8",
            "--block_lengths", "[8]", "--thresholds", "[0.9]", "--modes", "[free]", "--batch_size", "2",
            "--device", "cpu", "--progress_bar", "false"]


@pytest.mark.parametrize("native,want", [("1", "bf16"), ("0", "fp32")], ids=["native-bf16", "no-native-bf16"])
def test_default_precision_follows_the_cpu_silently(tmp_path, cli, native, want):
    env = {NATIVE_BF16_ENV: native}
    p = cli(*SWEEP, "--out_dir", tmp_path / "sw", env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    rec = json.loads((tmp_path / "sw" / "run.json").read_text())
    assert rec["settings"]["precision"] == want
    p = cli(*EVALUATE, "--out_dir", tmp_path / "ev", env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert json.loads((tmp_path / "ev" / "config.json").read_text())["precision"] == want


def test_a_chosen_precision_gets_no_notice_on_either_cpu(tmp_path, cli):
    for native in ("0", "1"):
        p = cli(*EVALUATE, "--precision", "bf16", "--out_dir", tmp_path / f"ev{native}", env={NATIVE_BF16_ENV: native})
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert json.loads((tmp_path / f"ev{native}" / "config.json").read_text())["precision"] == "bf16"


def test_a_sweep_resumed_on_the_other_kind_of_cpu_is_refused_by_name(tmp_path, cli):
    """'auto' resolves per machine; the study records what it measured, so mixing bf16 and fp32 trials on one
    Pareto front is refused by name, in one line."""
    sw = tmp_path / "sw"
    assert cli(*SWEEP, "--out_dir", sw, env={NATIVE_BF16_ENV: "1"}).returncode == 0
    p = cli(*SWEEP, "--n_trials", "2", "--out_dir", sw, env={NATIVE_BF16_ENV: "0"})
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "precision" in lines[0], p.stderr


def test_unknown_precision_lists_auto(cli):
    p = cli(*EVALUATE, "--precision", "fp16", "--out_dir", "/nonexistent/never")
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "valid: auto, fp32, bf16, bf16-true" in lines[0], p.stderr
