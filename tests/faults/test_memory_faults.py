"""An allocation that does not fit ends a command with one line and exit status 1
(docs/troubleshooting.md#out-of-memory), not a traceback: a CPU allocator failure of torch, a numpy ``MemoryError``
and a CUDA ``OutOfMemoryError`` (its figures kept, the rest of torch's paragraph dropped). Here real allocations of
a petabyte fail inside a real command; any other ``RuntimeError`` is still a traceback (a bug, not the user's
input)."""
import numpy as np
import pytest
import torch

from workbench.cli import OOM_HINT, out_of_memory

EVALUATE = ["evaluate", "--model", "tiny", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8",
            "--block_lengths", "[8]", "--thresholds", "[0.9]", "--modes", "[free]", "--progress_bar", "false"]


def _fails_inside_evaluate(monkeypatch, allocate):
    def load_model(*args, **kwargs):
        allocate()

    monkeypatch.setattr("workbench.evaluation.harness.load_model", load_model)


@pytest.mark.parametrize("allocate,detail", [
    (lambda: torch.empty(10 ** 15, dtype=torch.uint8),
     "out of CPU memory (tried to allocate 1,000,000,000,000,000 bytes)"),
    (lambda: np.empty((10 ** 14, 8)), "out of memory (Unable to allocate 5.68 PiB for an array with shape "
                                      "(100000000000000, 8) and data type float64)"),
], ids=["torch-cpu", "numpy"])
def test_a_real_allocation_that_does_not_fit_is_one_line(cli, tmp_path, monkeypatch, allocate, detail):
    _fails_inside_evaluate(monkeypatch, allocate)
    res = cli(*EVALUATE, "--out_dir", tmp_path / "ev")
    assert res.returncode == 1
    assert res.stderr == f"workbench evaluate: error: {detail}: {OOM_HINT}\n"
    assert not (tmp_path / "ev").exists() and not (tmp_path / "ev.partial").exists()


def test_cuda_out_of_memory_keeps_the_figures_only():
    e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 139.8 "
                               "GiB of which 1.2 GiB is free. Including non-PyTorch memory, this process has 138.5 GiB "
                               "memory in use. If reserved but unallocated memory is large try setting "
                               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert out_of_memory(e) == ("out of GPU memory (tried to allocate 2.00 GiB; GPU 3 has a total capacity of 139.8 "
                                f"GiB of which 1.2 GiB is free): {OOM_HINT}")
    assert out_of_memory(torch.OutOfMemoryError("")) == f"out of GPU memory: {OOM_HINT}"


def test_another_runtime_error_stays_a_traceback(cli, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)")

    monkeypatch.setattr("workbench.evaluation.harness.load_model", broken)
    assert out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        cli(*EVALUATE, "--out_dir", tmp_path / "ev")
