"""Options that went silently wrong, crashed or half-wrote (fault pass 3, findings 3–7):

* ``[]`` lists: `evaluate --block_lengths "[]"` dropped serial and confidence without a word, `leaderboard
  --thresholds "[]"` dropped confidence and sampler without listing them, `sol --block_lengths "[]"` crashed with a
  32-line KeyError (rc 1). An empty list that would drop decoders or crash is refused in one line (rc 2) everywhere;
  the empty lists that mean something (`--decoders []`: all; `--sample_temperatures []`: none) keep their meaning.
* `train sampler --max_steps 0` exported an untrained sampler: refused.
* `collect --accelerator gpu` on a CPU machine left a store skeleton (after 148 s of choosing prompts) that blocked
  later runs; `train lm --accelerator gpu` said only "No supported gpu backend found!".
* A full disk in `sol`, `leaderboard` and `train sampler` named neither the path nor the space; the sampler's
  single-class validation warning added two lines before the error.
* `collect` with a changed `--n_prompts` named `categories`, not `n_prompts`, and never suggested `--extend`; its
  rerun on a complete store printed Lightning's "Total length of `DataLoader` across ranks is zero".
* README paths (`--config workbench/configs/…`, `drafter: workbench/assets/…` inside a config) worked only from the
  repository root.
"""
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO
from faultkit import fill, small_disk, one_line, stderr_lines  # noqa: F401 (a fixture)
from test_sampler import V, make_store, synth_item

SAMPLER = ["--config", "workbench/configs/sampler_micro.yaml", "--progress_bar", "false", "--accelerator", "cpu",
           "--max_epochs", "1"]
TINY = ["--model", "tiny", "--n_prompts", "2", "--gen_len", "8", "--device", "cpu", "--progress_bar", "false"]



EMPTY = [
    (["evaluate", *TINY], "--block_lengths", "--block_lengths is empty, which would drop the serial and confidence"),
    (["evaluate", *TINY], "--thresholds", "--thresholds is empty, which would drop the confidence"),
    (["leaderboard", *TINY, "--block_lengths", "[4]"], "--thresholds", "would drop the decoders that sweep a threshold (confidence, "),
    (["leaderboard", *TINY], "--block_lengths", "--block_lengths is empty"),
    (["sol", *TINY], "--block_lengths", "--block_lengths is empty"),
    (["sweep", "--model", "tiny", "--n_prompts", "2", "--gen_len", "8"], "--block_lengths",
     "--block_lengths is empty"),
    (["speculate", *TINY, "--block_length", "8"], "--modes", "--modes is empty"),
    (["speculate", *TINY, "--block_length", "8"], "--ensemble_lambdas", "would drop the quadratic runs"),
    (["drafter", "eval", *TINY], "--modes", "--modes is empty"),
    (["drafter", "ablation", "--max_steps", "2"], "--losses", "--losses is empty"),
    (["train", "lm", "--config", "workbench/configs/micro.yaml"], "--block_lengths", "block_lengths is empty"),
    (["sweep", "sampler", "--store", "none.zarr"], "--widths", "--widths must be a non-empty list"),
]


@pytest.mark.parametrize("args,option,needle", EMPTY, ids=[f"{' '.join(a[:2]).strip('-')} {o}" for a, o, _ in EMPTY])
def test_an_empty_list_that_would_drop_runs_is_refused(cli, tmp_path, args, option, needle):
    out = tmp_path / "out"
    one_line(cli(*args, option, "[]", "--out_dir", out), 2, needle)
    assert not out.exists()


def test_an_empty_list_that_means_something_keeps_its_meaning(cli, tmp_path):
    """`--thresholds []` with only decoders that sweep none drops nothing: the leaderboard runs (the references
    and ss_linear), rc 0."""
    import pandas as pd

    out = tmp_path / "lb"
    p = cli("leaderboard", *TINY, "--block_lengths", "[4]", "--thresholds", "[]", "--decoders", "[ss_linear]",
            "--modes", "[free]", "--sol", "false", "--out_dir", out)
    assert p.returncode == 0, p.stderr[-3000:]
    df = pd.read_parquet(out / "leaderboard.parquet")
    assert set(df["decoder"]) == {"ar_greedy", "serial", "ss_linear"} and set(df["status"]) == {"ok"}


def test_train_sampler_max_steps_0_is_refused(cli, tmp_path):
    store = make_store(tmp_path / "s.zarr")
    out = tmp_path / "run"
    one_line(cli("train", "sampler", *SAMPLER, "--store", store, "--out_dir", out, "--max_steps", "0"), 2,
             "--max_steps must be positive, or -1", "untrained sampler")
    one_line(cli("train", "sampler", *SAMPLER, "--store", store, "--out_dir", out, "--max_steps", "-2"), 2,
             "--max_steps")
    assert not out.exists()


needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(),
                                  reason="this machine has a GPU")


@needs_no_gpu
def test_collect_on_a_gpu_that_is_absent_writes_nothing(cli, tmp_path, monkeypatch):
    """The README's GPU line on a CPU machine: one line naming the fix, before the model loads, prompts are chosen
    or the store is made (so a later run with other settings is not blocked)."""
    import workbench.trajectories.collect as collect

    monkeypatch.setattr(collect, "make_prompts", lambda *a, **k: pytest.fail("prompts chosen before the device check"))
    out = tmp_path / "gpu_store"
    t0 = time.time()
    one_line(cli("collect", "--config", "workbench/configs/smollm2_collect.yaml", "--accelerator", "gpu",
                 "--devices", "8", "--out", out, "--n_prompts", "16"), 2,
             "--accelerator gpu: no GPU", "pass --accelerator cpu --devices 1")
    assert time.time() - t0 < 60 and not out.exists()


@needs_no_gpu
def test_train_lm_on_a_gpu_that_is_absent_says_what_to_pass(cli, tmp_path):
    out = tmp_path / "run"
    line = one_line(cli("train", "lm", "--config", "workbench/configs/small_gpu.yaml", "--accelerator", "gpu",
                        "--devices", "8", "--strategy", "ddp", "--out_dir", out), 2,
                    "no GPU (CUDA or Apple MPS) was found", "--accelerator cpu --devices 1 --strategy auto")
    assert "No supported gpu backend" not in line and not out.exists()


# ------------------------------------------------------------------------------------------------- full disk
def _single_class_store(path: Path) -> Path:
    """A store whose labels are all 1: its validation split has one class (as a store of a few prompts can)."""
    from workbench.trajectories import ShardWriter, create_store
    from workbench.trajectories.features import feature_spec

    attrs = {"model_fingerprint": "m1", "tokenizer_hash": "t1", "policy": "serial",
             "feature_spec": feature_spec(144), "categories": ["code"]}
    create_store(path, attrs, [8], token_pca=np.random.default_rng(0).standard_normal((V, 44)))
    with ShardWriter(path, 8, rank=0, rows_per_chunk=64, traj_per_chunk=16) as w:
        for i in range(20):
            rows, trajs = synth_item(i, 8)
            rows["label"][:] = True
            rows["top_ids"][..., 0] = trajs["final_ids"][rows["traj"]]
            w.append(i, rows, trajs)
    return path


FULL = {"sol": (["sol", *TINY, "--block_lengths", "[4]"], 20_000),
        "leaderboard": (["leaderboard", *TINY, "--block_lengths", "[4]", "--thresholds", "[0.9]",
                         "--decoders", "[confidence]", "--sol", "false"], 20_000),
        "train sampler": (["train", "sampler", *SAMPLER], 0)}


@pytest.mark.parametrize("command", list(FULL))
def test_a_full_disk_names_the_path_and_the_space(cli, tmp_path, small_disk, command):
    """One line naming where the write failed and the bytes free, rc 1, nothing left behind; the same command
    finishes once space is freed. The sampler's store has a single-class validation split: its note is one line
    after a finished run, and nothing before an error."""
    args, leave = FULL[command]
    if command == "train sampler":
        args = [*args, "--store", str(_single_class_store(tmp_path / "one.zarr"))]
    disk = small_disk(4 << 20)
    out = disk / "full" / "out"
    filler = fill(disk, leave)
    line = one_line(cli(*args, "--out_dir", out), 1, "no space left on the device writing", str(out), "free)",
                    "rerun the same command")
    assert "bytes free" in line or "kB free" in line
    assert not (disk / "full").exists()
    filler.unlink()
    p = cli(*args, "--out_dir", out)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = stderr_lines(p.stderr)
    if command == "train sampler":
        assert len(lines) == 1 and "have a single class, so val/auc is 0.5" in lines[0], lines
    else:
        assert lines == []


# ------------------------------------------------------------------------------------------------- collect
COLLECT = ["--n_prompts", "12", "--block_lengths", "[4]", "--blocks_per_prompt", "2", "--batch_size", "2",
           "--context_len", "32", "--rows_per_chunk", "16", "--precision", "fp32", "--accelerator", "cpu",
           "--progress_bar", "false"]


def test_collect_names_a_changed_n_prompts_and_reruns_quietly(cli, tmp_path):
    out = tmp_path / "s.zarr"
    assert cli("collect", "--out", out, *COLLECT).returncode == 0
    p = cli("collect", "--out", out, *COLLECT)                      # complete: nothing to do, and nothing to say
    assert p.returncode == 0 and p.stderr == "", p.stderr
    line = one_line(cli("collect", "--out", out, *COLLECT, "--n_prompts", "14"), 2, "n_prompts: 12 != 14",
                    "--extend true")
    assert "categories" not in line
    one_line(cli("collect", "--out", out, *COLLECT, "--n_prompts", "10"), 2, "n_prompts: 12 != 10")


# ------------------------------------------------------------------------------------------------- README paths
def test_readme_paths_work_from_any_directory(cli, tmp_path, monkeypatch):
    """`--config workbench/configs/…` and an asset path inside a config resolve against the package when they do
    not exist from the working directory; outputs stay relative to it; a missing config names where it looked."""
    from workbench.cli_args import PACKAGE_PARENT, parse_dataclass
    from workbench.deer.evaluate import DeerEvalConfig

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = parse_dataclass("workbench deer eval", DeerEvalConfig, ["--config", "workbench/configs/smollm2_deer_eval.yaml"])
    assert cfg.drafter == str(PACKAGE_PARENT / "workbench" / "assets" / "smollm2-135m-deer-drafter")
    assert cfg.out_dir == "runs/smollm2_deer/eval"
    store = make_store(tmp_path / "s.zarr")
    p = cli("train", "sampler", *SAMPLER, "--store", store, "--out_dir", "run", cwd=elsewhere)
    assert p.returncode == 0, p.stderr[-3000:]
    assert (elsewhere / "run" / "sampler" / "sampler.json").is_file()
    p = cli("decode", "--model", "workbench/assets/tiny", "--prompt", "def f(x):", "--gen_len", "16", "--device", "cpu",
            cwd=elsewhere)
    assert p.returncode == 0, p.stderr[-3000:]
    one_line(cli("train", "sampler", "--config", "workbench/configs/nope.yaml", cwd=elsewhere), 2,
             "config file workbench/configs/nope.yaml does not exist", f"looked in {elsewhere} and {REPO}")
