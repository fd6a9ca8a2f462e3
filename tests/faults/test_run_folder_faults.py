"""Run folders that protect themselves (issue 56 §1, §2, §4): no run overwrites another, a resume refuses changed
settings by name or applies them, one writer per folder, Ctrl-C and SIGTERM stop training with a checkpoint and
exit 130 / 143, and a full disk leaves no truncated checkpoint or empty export. Each case failed on the main of
before the issue (silently wrong, a traceback, rc 0 or rc 1)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, stop_lightning_at
from faultkit import fill, interrupt, small_disk, start_cli, one_line, stderr_lines, wait_for  # noqa: F401 (fixture)
from test_sampler import make_store

SAMPLER = ["--config", "workbench/configs/sampler_micro.yaml", "--progress_bar", "false", "--accelerator", "cpu"]
LM = ["--config", "workbench/configs/micro.yaml", "--progress_bar", "false", "--accelerator", "cpu",
      "--precision", "32-true"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("rf") / "s.zarr")


def _files(d: Path) -> dict:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}



@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A finished micro `train lm` run folder (8 steps)."""
    out = tmp_path_factory.mktemp("lm") / "run"
    from workbench.cli import main

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert main(["train", "lm", *LM, "--out_dir", str(out), "--max_steps", "8", "--stage1_steps", "4",
                     "--val_every", "4", "--checkpoint_every", "4"]) == 0
    finally:
        os.chdir(cwd)
    return out


def test_sampler_refuses_a_train_lm_folder_and_leaves_it_untouched(lm_run, store, cli):
    """Case 1: train sampler into a train lm run folder overwrote its config.yaml, renamed its metrics and crashed;
    a later train lm then advised a false --noise_per. Now: one line naming the kind found, nothing changed, and
    the LM run resumes with its own settings."""
    before = _files(lm_run)
    p = cli("train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(lm_run), "--max_steps", "4")
    one_line(p, 2, "`workbench train lm` run", "choose another --out_dir")
    assert _files(lm_run) == before
    assert cli("train", "lm", *LM, "--out_dir", str(lm_run), "--max_steps", "8", "--stage1_steps", "4",
               "--val_every", "4", "--checkpoint_every", "4").returncode == 0
    assert json.loads((lm_run / "model" / "workbench.json").read_text())["train_config"]["noise_per"] == "sequence"


def test_lm_refuses_a_train_sampler_folder(store, tmp_path, cli):
    """Case 2: train lm into a train sampler run folder overwrote its config and crashed with a traceback."""
    run = tmp_path / "sampler_run"
    assert cli("train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run), "--max_epochs", "1"
               ).returncode == 0
    before = _files(run)
    one_line(cli("train", "lm", *LM, "--out_dir", str(run), "--max_steps", "8", "--stage1_steps", "4"), 2,
              "`workbench train sampler` run")
    assert _files(run) == before


@pytest.mark.parametrize("where", ["store", "inside", "group"])
def test_sampler_refuses_a_store_as_run_folder(store, cli, where):
    """A train sampler --out_dir equal to --store (or inside it) wrote checkpoints and logs among its arrays."""
    out = {"store": store, "inside": store / "runs" / "a", "group": store / "B8" / "run"}[where]
    before = _files(store)
    one_line(cli("train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(out), "--max_steps", "2"),
              2, f"the trajectory store {store}:")
    assert _files(store) == before


def test_changed_settings_are_refused_by_name_or_applied(tmp_path, small_corpus):
    """Case 4: a changed --lr on resume was recorded but not applied. Now the resumed schedule is scaled to the new
    peak (logged lr), and a setting that may not change (the schedule's length) is refused by name, with the value
    the folder records."""
    import pandas as pd

    from workbench.run_folder import RunFolderError
    from workbench.train.lm import train_lm
    from test_training import _cfg

    kw = dict(max_steps=40, stage1_steps=4, val_every=10, checkpoint_every=10, precision="32-true", warmup_steps=0,
              min_lr_ratio=1.0)                                       # a constant schedule: lr(t) = peak
    with stop_lightning_at(10):
        train_lm(_cfg(tmp_path, small_corpus, **kw))
    with pytest.raises(RunFolderError, match=r"max_steps 40 \(now 50\).*--max_steps 40"):
        train_lm(_cfg(tmp_path, small_corpus, **{**kw, "max_steps": 50}))
    train_lm(_cfg(tmp_path, small_corpus, **{**kw, "lr": 0.01, "stop_at_step": 20}))
    log = pd.read_csv(tmp_path / "run" / "model" / "training_log.csv").dropna(subset=["lr"])
    assert log[log["step"] < 10]["lr"].round(6).unique().tolist() == [0.0015]
    assert log[log["step"] >= 10]["lr"].round(6).unique().tolist() == [0.01]
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert rec["settings"]["lr"] == 0.01 and [0.0015, 0.01] in [r["changes"].get("lr") for r in rec["resumes"]]


def test_interrupted_sampler_applies_a_new_lr(store, tmp_path, monkeypatch):
    """Case 4 (train sampler, interrupted): a changed --lr was recorded but the restored schedule went on. Now the
    logged lr after the resume point is the uninterrupted schedule scaled by new / old peak."""
    import pandas as pd

    from workbench.sampler.train import main

    monkeypatch.chdir(REPO)
    common = [*SAMPLER, "--store", str(store), "--max_epochs", "3", "--patience", "99", "--warmup_steps", "0"]
    assert main([*common, "--out_dir", str(tmp_path / "ref")]) == 0          # uninterrupted, lr 0.003
    with stop_lightning_at(20):
        main([*common, "--out_dir", str(tmp_path / "run")])
    assert main([*common, "--out_dir", str(tmp_path / "run"), "--lr", "0.006"]) == 0

    def lr(run):
        log = pd.read_csv(tmp_path / run / "logs/version_0/metrics.csv").dropna(subset=["lr"])
        return log.set_index("step")["lr"]

    ref, run = lr("ref"), lr("run")
    before, after = [s for s in ref.index if s < 20], [s for s in ref.index if s > 20]
    assert before and after and set(after) <= set(run.index)
    assert all(abs(run[s] - ref[s]) < 1e-9 for s in before)
    assert all(abs(run[s] - 2 * ref[s]) < 1e-9 for s in after)
    rec = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [0.003, 0.006] in [r["changes"].get("lr") for r in rec["resumes"]]


def test_finished_sampler_refuses_a_new_lr(store, tmp_path, cli):
    """Case 4 (finished run): a changed --lr re-exported sampler.json saying lr 0.01 for weights trained at 0.003.
    A finished run has no step left to apply it to: refused by name, and the export is unchanged."""
    run = tmp_path / "run"
    args = ["train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run), "--max_epochs", "1"]
    assert cli(*args).returncode == 0
    before = _files(run)
    one_line(cli(*args, "--lr", "0.01"), 2, "lr cannot change", "--lr 0.003")
    assert _files(run) == before


def test_second_writer_is_refused_and_a_stale_lock_is_taken_over(store, tmp_path, cli):
    """Case 5: two train sampler runs into one --out_dir mixed their configs and checkpoints. Now the folder is
    locked: a second process is refused naming the holder; the lock of a dead process is taken over."""
    from workbench.run_folder import LOCK, open_run
    from workbench.sampler.train import SamplerTrainConfig, run_folder_args

    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, 'tests')\n"
        "from workbench.run_folder import open_run\n"
        "from workbench.sampler.train import SamplerTrainConfig, run_folder_args\n"
        f"cfg = SamplerTrainConfig(store={str(store)!r}, out_dir={str(run)!r}, lr=0.001)\n"
        "f = open_run(**run_folder_args(cfg)); print('locked', flush=True); time.sleep(120)")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = one_line(cli("train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run),
                             "--lr", "0.003"), 2, "in use by process", str(holder.pid))
        assert "lr" not in line.split("in use")[0]
    finally:
        holder.kill()
        holder.wait()
    assert (run / LOCK).exists()                              # the dead holder's lock file stays: taken over
    with open_run(**run_folder_args(SamplerTrainConfig(store=str(store), out_dir=str(run), lr=0.001))) as f:
        assert f._lock_fd is not None                      # held by this process now
    assert sorted(p.name for p in run.iterdir()) == [LOCK, "run.json"]


def test_a_command_does_not_replace_another_commands_results(tmp_path, cli):
    """`evaluate` given the results folder of another command (`sol`) replaced it; now it is refused by kind."""
    out = tmp_path / "sol_out"
    out.mkdir()
    (out / ".workbench-run").touch()
    (out / "run.json").write_text(json.dumps({"kind": "sol", "settings": {}, "finished": True}))
    (out / "sol.parquet").write_bytes(b"results")
    before = _files(out)
    one_line(cli("evaluate", "--out_dir", str(out), "--n_prompts", "1"), 2, "`workbench sol`")
    assert _files(out) == before


def _signal_run(args: list[str], ready: Path, sig: int):
    proc = start_cli(*args)
    wait_for(ready.exists, proc=proc)
    return interrupt(proc, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_train_lm_saves_a_checkpoint_and_resumes(tmp_path, sig):
    """SIGINT to the process group in train lm exited rc 1 with nothing on stderr, SIGTERM rc 0 with no model/.
    Now: one line, exit 130 / 143, a checkpoint at the step reached, and a rerun resumes from it."""
    run = tmp_path / "run"
    args = ["train", "lm", *LM, "--out_dir", str(run), "--max_steps", "100000", "--stage1_steps", "4",
            "--val_every", "1000", "--checkpoint_every", "10"]
    rc, out, err = _signal_run(args, run / "checkpoints" / "last.ckpt", sig)
    lines = stderr_lines(err)
    assert rc == 128 + sig and len(lines) == 1 and "interrupted at step" in lines[0], err[-3000:]
    step = int(lines[0].split("interrupted at step ")[1].split(";")[0])
    ck = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ck["global_step"] == step and not (run / "model").exists()
    from conftest import run_cli

    r = run_cli(*args, "--stop_at_step", str(step + 5))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((run / "model" / "workbench.json").read_text())["global_step"] == step + 5


def test_sigterm_in_train_sampler_saves_a_checkpoint_and_exits_143(store, tmp_path):
    """SIGTERM in train sampler exited 0 with no sampler/ written. Now: exit 143, one line, a resumable checkpoint;
    the rerun finishes and exports."""
    run = tmp_path / "run"
    args = ["train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run), "--max_epochs", "40",
            "--patience", "1000"]
    rc, out, err = _signal_run(args, run / "checkpoints" / "last.ckpt", signal.SIGTERM)
    lines = stderr_lines(err)
    assert rc == 143 and len(lines) == 1 and "interrupted at step" in lines[0], err[-3000:]
    assert not (run / "sampler").exists()
    step = int(lines[0].split("interrupted at step ")[1].split(";")[0])
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == step


def test_full_disk_at_a_checkpoint_leaves_no_truncated_file(store, tmp_path, small_disk, cli):
    """A full disk at a sampler checkpoint left a truncated best-0-2.ckpt for good (and a 0-byte one while the disk
    stayed full). Now: one line naming the checkpoint, exit 1, only whole checkpoints; after freeing space the
    same command resumes and finishes."""
    disk = small_disk(4 << 20)
    run = disk / "run"
    args = ["train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run), "--max_epochs", "2",
            "--patience", "1000"]
    filler = fill(disk, 150_000)                      # room for the run record and log, not for a checkpoint
    p = cli(*args)
    one_line(p, 1, "no space left", ".ckpt", "rerun the same command")
    for f in run.rglob("*"):
        assert not f.name.endswith(".tmp"), f
        if f.suffix == ".ckpt":
            torch.load(f, weights_only=False)          # whole, or not there
    assert not (run / "sampler").exists()
    filler.unlink()
    assert cli(*args).returncode == 0 and (run / "sampler" / "sampler.json").is_file()


def test_full_disk_at_export_leaves_no_empty_folder(store, tmp_path, cli, monkeypatch):
    """A full disk at the sampler export left an empty sampler/ and, after the rerun, a metrics.json without the
    final metrics. Now: one line, exit 1, no sampler/ (nor its staging folder); the rerun exports everything."""
    import errno

    import workbench.sampler.network as network

    real = network.save_sampler
    run = tmp_path / "run"
    args = ["train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(run), "--max_epochs", "1"]

    def full(net, cfg, out_dir, meta=None):
        real(net, cfg, out_dir, meta)
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(out_dir) / "sampler.json"))

    monkeypatch.setattr("workbench.sampler.train.save_sampler", full)
    one_line(cli(*args), 1, "no space left", "sampler.json")
    assert not (run / "sampler").exists() and not list(run.glob("sampler.*"))
    monkeypatch.setattr("workbench.sampler.train.save_sampler", real)
    assert cli(*args).returncode == 0
    assert "best_val_auc" in json.loads((run / "metrics.json").read_text()) and (run / "sampler").is_dir()


SWEEP = ["sweep", "--n_trials", "2", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "16",
         "--block_lengths", "[8]", "--batch_size", "2"]


@pytest.fixture
def tiny_copy(tmp_path):
    import shutil

    from workbench.assets import builtin_model_path

    return Path(shutil.copytree(builtin_model_path("tiny"), tmp_path / "tiny"))


def test_sweep_resumed_with_other_settings_is_refused(tmp_path, tiny_copy, cli):
    """Case 3: a sweep resumed with other settings (prompts, generation length, another model, a shared journal)
    put both settings' trials on one Pareto front, rc 0. Now each is refused by name before anything is written."""
    from workbench.model.io import load_checkpoint, save_checkpoint

    sw, model = tmp_path / "sw", ["--model", str(tiny_copy)]
    p = cli(*SWEEP, *model, "--out_dir", sw)
    assert p.returncode == 0 and p.stderr == "", p.stderr             # no ExperimentalWarning lines either
    before = _files(sw)
    one_line(cli(*SWEEP, *model, "--out_dir", sw, "--n_trials", "3", "--n_prompts", "3", "--gen_len", "32"), 2,
              "n_prompts 2 (now 3)", "gen_len 16 (now 32)")
    one_line(cli(*SWEEP, "--model", "builtin:tiny", "--out_dir", sw, "--n_trials", "3"), 2, "model")
    m, tok, meta = load_checkpoint(tiny_copy)                # other weights behind the same path
    with torch.no_grad():
        m.backbone.get_input_embeddings().weight.mul_(1.5)
    save_checkpoint(m, tok, tiny_copy, meta)
    one_line(cli(*SWEEP, *model, "--out_dir", sw, "--n_trials", "3"), 2, "model_fingerprint")
    assert _files(sw) == before
    journal = tmp_path / "journal.log"                    # a shared storage: the study itself records its identity
    assert cli(*SWEEP, *model, "--out_dir", tmp_path / "a", "--storage", journal).returncode == 0
    one_line(cli(*SWEEP, *model, "--out_dir", tmp_path / "b", "--storage", journal, "--n_trials", "3",
                  "--n_prompts", "3"), 2, "n_prompts 2 (now 3)")
    assert not (tmp_path / "b").exists()
    before = _files(tmp_path / "a")                     # the folder's exports are its own study's
    one_line(cli(*SWEEP, *model, "--out_dir", tmp_path / "a", "--n_trials", "3"), 2, "storage")
    assert _files(tmp_path / "a") == before


def test_ctrl_c_in_a_sweep_is_one_line_and_keeps_finished_trials(tmp_path):
    """Ctrl-C during a sweep printed 114 lines with Optuna's traceback. Now: the trial in flight finishes, then one
    line, exit 130, every finished trial exported and none left RUNNING or FAILED."""
    sw = tmp_path / "sw"
    proc = start_cli(*SWEEP[:2], "400", *SWEEP[3:], "--out_dir", str(sw))
    wait_for(lambda: _trials(sw) >= 2, proc=proc)
    rc, out, err = interrupt(proc, signal.SIGINT)
    lines = stderr_lines(err)
    assert rc == 130 and len(lines) == 1 and "finished trials" in lines[0], err[-3000:]
    import pandas as pd

    done = len(pd.read_parquet(sw / "trials.parquet"))
    assert done >= 2 and done == _trials(sw) and not any("Warning" in x for x in lines)
    import sqlite3

    with sqlite3.connect(sw / "optuna.db") as c:                     # the trial in flight was finished, not left
        assert c.execute("select count(*) from trials where state != 'COMPLETE'").fetchone()[0] == 0


def _trials(sw: Path) -> int:
    import sqlite3

    db = sw / "optuna.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as c:
            return c.execute("select count(*) from trials where state = 'COMPLETE'").fetchone()[0]
    except sqlite3.Error:
        return 0


# ------------------------------------------------------------------ variants of the same kinds (held-out fault pass)
def test_a_relative_path_from_another_working_directory_is_not_the_same_setting(store, tmp_path, cli):
    """`train sampler --store st.zarr` resumed from another working directory, where `st.zarr` is another store,
    trained on it silently; the record now keeps absolute paths, so it is refused by name, and the same store given
    as absolute or relative path is the same setting."""
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    shutil.copytree(store, a / "st.zarr")
    make_store(b / "st.zarr", items=24, fingerprint="m2")
    run = tmp_path / "run"
    args = ["train", "sampler", *SAMPLER, "--store", "st.zarr", "--out_dir", str(run), "--max_epochs", "1"]
    argv = [x if x != "workbench/configs/sampler_micro.yaml" else str(REPO / x) for x in args]
    assert cli(*argv, cwd=a).returncode == 0
    one_line(cli(*argv, cwd=b), 2, f"store '{a / 'st.zarr'}' (now '{b / 'st.zarr'}')")
    absolute = [x if x != "st.zarr" else str(a / "st.zarr") for x in argv]
    assert cli(*absolute, cwd=b).returncode == 0


def test_results_are_not_written_inside_a_store_nor_over_a_users_folder(store, tmp_path, cli):
    """`evaluate --out_dir` inside a store wrote its results among the arrays; a user's `<out_dir>.partial` (or
    `.old`) folder was deleted as if it were the staging folder."""
    args = ["evaluate", "--n_prompts", "1", "--gen_len", "8", "--block_lengths", "[8]", "--thresholds", "[0.9]",
            "--modes", "[real]", "--progress_bar", "false", "--device", "cpu"]
    before = _files(store)
    one_line(cli(*args, "--out_dir", store / "results"), 2, "lies inside the trajectory store")
    assert _files(store) == before
    mine = tmp_path / "ev.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's notes")
    one_line(cli(*args, "--out_dir", tmp_path / "ev"), 2, "ev.partial exists and was not written by a workbench")
    assert (mine / "notes.txt").read_text() == "a user's notes" and not (tmp_path / "ev").exists()


def test_a_run_that_failed_before_its_first_checkpoint_takes_new_settings(tmp_path, micro_checkpoint, small_corpus,
                                                                         cli):
    """`train lora --corpus <empty folder>` failed after its run folder was written, and the rerun with a fixed
    corpus was refused as a changed setting. A folder without a resume point holds nothing to mix: the rerun starts
    afresh."""
    empty = tmp_path / "empty"
    empty.mkdir()
    run = tmp_path / "run"
    args = ["train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from", str(micro_checkpoint),
            "--out_dir", str(run), "--progress_bar", "false"]
    one_line(cli(*args, "--corpus", str(empty)), 2, "empty")
    assert cli(*args, "--corpus", str(small_corpus)).returncode == 0
    rec = json.loads((run / "run.json").read_text())
    assert rec["settings"]["corpus"] == str(small_corpus) and rec["finished"]


@pytest.mark.timeout(60)                          # it hung for good before
def test_special_files_in_a_corpus_folder_are_skipped(tmp_path):
    """A FIFO named `b.py` in a corpus folder hung every command that read it, and a link to /dev/zero exhausted
    memory; only regular files are read now."""
    from workbench.corpus import load_directory

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.py").write_text("print('hello')\n" * 20)
    os.mkfifo(root / "b.py")
    os.symlink("/dev/zero", root / "c.py")
    assert [d.path for d in load_directory(root)] == ["a.py"]


@pytest.mark.parametrize("text", ["[1, 2]", "\udcff garbage"], ids=["list", "not-utf8"])
def test_a_damaged_teacher_record_is_one_line_naming_it(tmp_path, text, cli):
    """A `teacher.json` holding a list gave a 20-line AttributeError, one of garbage bytes an error naming no file."""
    t = tmp_path / "teacher"
    t.mkdir()
    (t / "teacher.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    one_line(cli("train", "deer", "--teacher", str(t), "--out_dir", str(tmp_path / "s1")), 2,
              f"{t / 'teacher.json'} is damaged")
    assert not (tmp_path / "s1").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_libraries_load_isone_line(tmp_path, sig):
    """A signal in the first second (torch and transformers still importing) printed a 27-line KeyboardInterrupt
    traceback (SIGINT) or nothing at all (SIGTERM). The handlers are in place from the command's first line."""
    import time

    proc = start_cli("train", "lm", *LM, "--out_dir", str(tmp_path / "run"), "--max_steps", "100000")
    time.sleep(1.0)
    rc, out, err = interrupt(proc, sig)
    lines = stderr_lines(err)
    assert rc == 128 + sig and len(lines) == 1 and "interrupted" in lines[0], err[-3000:]


def test_deer_teacher_has_one_writer(tmp_path, micro_checkpoint, cli):
    """Two `deer teacher` runs into one folder (other settings) both exited 0 with their chunks mixed; the folder's
    lock now refuses the second, naming the first."""
    from workbench.run_folder import locked_folder

    out = tmp_path / "teacher"
    with locked_folder(out, "deer teacher"):
        one_line(cli("deer", "teacher", "--target", str(micro_checkpoint), "--out_dir", str(out)), 2,
                  "in use by process", str(os.getpid()))
    assert [p.name for p in out.iterdir()] == [".lock"]


def test_a_typo_in_a_config_file_says_where_to_look(tmp_path, cli):
    bad = tmp_path / "typo.yaml"
    bad.write_text("seq_lenn: 64\n")
    one_line(cli("train", "lm", "--config", str(bad), "--out_dir", str(tmp_path / "run")), 2, "seq_lenn",
              "--config file", "workbench train lm --help")
    assert not (tmp_path / "run").exists()
