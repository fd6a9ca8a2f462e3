"""A training run's exports belong to it (fault pass 3, finding 1: data lost). `deer eval`, `leaderboard` and `sol`
given a run's `adapter/`, `sampler/` or `stage2/drafter/` as --out_dir replaced the trained files with their results,
rc 0 and nothing on stderr: the exports carry `.workbench-run` but no `run.json`, and the folder around them was
never looked at. Now each is refused in one line naming the run, every file unchanged, and the run's own rerun still
re-exports."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from faultkit import one_line
from test_sampler import make_store

SAMPLER = ["--config", "workbench/configs/sampler_micro.yaml", "--progress_bar", "false", "--accelerator", "cpu",
           "--max_epochs", "1"]
LM = ["--config", "workbench/configs/micro.yaml", "--progress_bar", "false", "--accelerator", "cpu",
      "--precision", "32-true", "--max_steps", "4", "--stage1_steps", "2", "--val_every", "4",
      "--checkpoint_every", "4"]
#: Small result commands on the shipped tiny model: refused (if at all) before the model loads.
RESULT = {
    "deer eval": ["deer", "eval", "--target", "tiny", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8",
                  "--device", "cpu", "--progress_bar", "false"],
    "leaderboard": ["leaderboard", "--model", "tiny", "--n_prompts", "2", "--gen_len", "8", "--block_lengths", "[4]",
                    "--thresholds", "[0.5]", "--device", "cpu", "--progress_bar", "false"],
    "sol": ["sol", "--model", "tiny", "--n_prompts", "2", "--gen_len", "8", "--block_lengths", "[4]",
            "--device", "cpu", "--progress_bar", "false"],
    "evaluate": ["evaluate", "--model", "tiny", "--n_prompts", "2", "--gen_len", "8", "--block_lengths", "[4]",
                 "--thresholds", "[0.9]", "--device", "cpu", "--progress_bar", "false"],
}


def md5s(d: Path) -> dict:
    """``{relative path: md5}`` of every file under ``d`` (empty when ``d`` is absent)."""
    return {str(f.relative_to(d)): hashlib.md5(f.read_bytes()).hexdigest() for f in sorted(d.rglob("*"))
            if f.is_file()}



def _main(*argv: str) -> None:
    from workbench.cli import main

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        assert main(list(argv)) == 0
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, micro_checkpoint):
    """Finished training runs with their exports: `train sampler` (sampler/), `train lora` (adapter/), `train lm`
    (model/), and a `train deer` stage-2 run folder holding the shipped tiny DEER drafter as its drafter/ export."""
    root = tmp_path_factory.mktemp("owned")
    store = make_store(root / "s.zarr")
    _main("train", "sampler", *SAMPLER, "--store", str(store), "--out_dir", str(root / "sampler_run"))
    _main("train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from", str(micro_checkpoint),
          "--progress_bar", "false", "--max_steps", "2", "--val_every", "2", "--out_dir", str(root / "lora_run"))
    _main("train", "lm", *LM, "--out_dir", str(root / "lm_run"))
    from workbench.assets import builtin_model_path

    stage2 = root / "deer_run" / "stage2"
    shutil.copytree(Path(builtin_model_path("tiny")).parent / "tiny-deer-drafter", stage2 / "drafter")
    (stage2 / "drafter" / ".workbench-run").touch()
    (stage2 / "run.json").write_text(json.dumps({"kind": "train deer", "settings": {"stage": 2}, "finished": True}))
    return {"store": store, "sampler": root / "sampler_run", "lora": root / "lora_run", "lm": root / "lm_run",
            "deer": stage2}


#: (result command, run, its export): the three cases of the fault pass, and a `train lm` model export
CASES = [("deer eval", "lora", "adapter", "train lora"), ("leaderboard", "sampler", "sampler", "train sampler"),
         ("sol", "deer", "drafter", "train deer"), ("leaderboard", "lm", "model", "train lm"),
         ("evaluate", "lm", "model", "train lm")]


@pytest.mark.parametrize("command,run,export,kind", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_a_result_command_does_not_replace_a_runs_export(runs, cli, command, run, export, kind):
    out = runs[run] / export
    before = md5s(runs[run])
    assert before and any(k.startswith(f"{export}/") for k in before)
    line = one_line(cli(*RESULT[command], "--out_dir", out), 2, f"is an export of the `workbench {kind}` run",
                    str(runs[run]), "choose another --out_dir")
    assert "Traceback" not in line
    assert md5s(runs[run]) == before                      # nothing replaced, nothing added (no .lock, no .partial)
    assert not list(runs[run].glob(f"{export}.*"))


@pytest.mark.parametrize("command", ["leaderboard", "sol"])
def test_nothing_is_written_inside_an_export_or_a_run_folder(runs, cli, command):
    """A folder inside an export would be deleted by the run's next re-export; one beside the checkpoints would mix
    results with the run's files: both refused, naming the run."""
    before = md5s(runs["sampler"])
    for out in (runs["sampler"] / "sampler" / "lb", runs["sampler"] / "results"):
        one_line(cli(*RESULT[command], "--out_dir", out), 2, "lies inside the `workbench train sampler` run folder",
                 str(runs["sampler"]))
        assert not out.exists()
    assert md5s(runs["sampler"]) == before


def test_a_run_folder_itself_is_refused_by_kind(runs, cli):
    before = md5s(runs["lora"])
    one_line(cli(*RESULT["sol"], "--out_dir", runs["lora"]), 2, "holds the results of `workbench train lora`")
    assert md5s(runs["lora"]) == before


def test_a_folder_holding_a_run_is_not_replaced(runs, cli, tmp_path):
    """An old result folder with a training run copied into it: replacing it would delete the run."""
    lb = tmp_path / "lb"
    lb.mkdir()
    (lb / ".workbench-run").touch()
    (lb / "run.json").write_text(json.dumps({"kind": "leaderboard", "settings": {}, "finished": True}))
    shutil.copytree(runs["sampler"], lb / "sampler_run")
    before = md5s(lb)
    one_line(cli(*RESULT["leaderboard"], "--out_dir", lb), 2, "holds the `workbench train sampler` run folder",
             str(lb / "sampler_run"))
    assert md5s(lb) == before


def test_an_export_copied_out_of_its_run_is_not_replaced_by_results(runs, cli, tmp_path):
    """A sampler copied on its own (marker, no run.json around it) is still an export, not results."""
    mine = Path(shutil.copytree(runs["sampler"] / "sampler", tmp_path / "my_sampler"))
    before = md5s(mine)
    one_line(cli(*RESULT["leaderboard"], "--out_dir", mine), 2, "holds files that a workbench command exported",
             "not the results of `workbench leaderboard`")
    assert md5s(mine) == before


def test_a_training_run_is_not_started_inside_another_runs_export(runs, cli):
    before = md5s(runs["lm"])
    one_line(cli("train", "sampler", *SAMPLER, "--store", str(runs["store"]), "--out_dir", runs["lm"] / "model"), 2,
             "is an export of the `workbench train lm` run", str(runs["lm"]))
    one_line(cli("train", "sampler", *SAMPLER, "--store", str(runs["store"]),
                 "--out_dir", runs["lm"] / "model" / "sub"), 2, "lies inside", "replaces it whole, with everything inside")
    assert md5s(runs["lm"]) == before


def test_a_store_is_not_collected_inside_an_export(runs, cli):
    before = md5s(runs["sampler"])
    out = runs["sampler"] / "sampler" / "s.zarr"
    one_line(cli("collect", "--out", out, "--n_prompts", "2", "--block_lengths", "[4]", "--accelerator", "cpu"), 2,
             "--out", "lies inside", "an export of the `workbench train sampler` run")
    assert md5s(runs["sampler"]) == before


def test_a_deer_teacher_folder_is_named_as_such(cli, tmp_path):
    """`leaderboard --out_dir <deer teacher folder>` said the folder was not written by a workbench command."""
    t = tmp_path / "teacher"
    t.mkdir()
    (t / "teacher.json").write_text(json.dumps({"settings": {}, "n_answers": 0, "complete": True, "chunks": []}))
    before = md5s(t)
    one_line(cli(*RESULT["leaderboard"], "--out_dir", t), 2, "holds the data of `workbench deer teacher` (teacher.json)")
    assert md5s(t) == before


@pytest.mark.parametrize("run,export,args", [
    ("sampler", "sampler", lambda r: ["train", "sampler", *SAMPLER, "--store", str(r["store"])]),
    ("lm", "model", lambda r: ["train", "lm", *LM])], ids=["train sampler", "train lm"])
def test_the_owning_runs_rerun_still_re_exports(runs, cli, run, export, args):
    """The run that made an export replaces it: a rerun of the finished run writes it again (a stray file in the
    old export goes with it), with the same weights."""
    out = runs[run] / export
    weights = {k: v for k, v in md5s(out).items() if k.endswith((".pt", ".safetensors"))}
    assert weights
    (out / "stray.txt").write_text("left by hand")
    p = cli(*args(runs), "--out_dir", runs[run])
    assert p.returncode == 0, p.stderr[-3000:]
    assert not (out / "stray.txt").exists() and not (out / ".lock").exists()
    assert {k: v for k, v in md5s(out).items() if k in weights} == weights
