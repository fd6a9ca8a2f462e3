"""Experiment trackers of the ``train`` commands (``workbench.trackers``): every tracker records the metrics of
``metrics.csv``, read back by its own reader (``trackers_readback``), and a resumed run continues the same tracker
run. TensorBoard (a core dependency) runs in the default suite; MLflow and W&B, whose imports and stores take tens
of seconds, run with the ``team`` marker (``make test-team``, which ``.ci/run`` runs)."""
import json
import shutil

import pytest
import torch

from conftest import stop_lightning_at
from trackers_readback import (assert_same_metrics, csv_metrics, mlflow_metrics, tensorboard_metrics,
                               wandb_metrics)

LM = ["train", "lm", "--config", "workbench/configs/micro.yaml", "--progress_bar", "false", "--max_steps", "6",
      "--stage1_steps", "3", "--val_every", "3", "--checkpoint_every", "3", "--precision", "32-true",
      "--log_every_n_steps", "1", "--accelerator", "cpu", "--val_windows", "4"]
ALL = "csv,tensorboard,mlflow,wandb"


def _one_line(p, code=2):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1, (p.returncode, p.stderr)
    return lines[0]


def _wandb_logger_as_in_a_fresh_process():
    """Detach from W&B's ``wandb`` logger the capture handlers pytest attaches to non-propagating loggers when a
    test's call starts (from W&B's second run in this process on, they print W&B's debug-log lines on stderr,
    which a ``workbench`` process never does). Call first in the test body."""
    import logging

    lg = logging.getLogger("wandb")
    for h in [h for h in lg.handlers if type(h).__module__.startswith("_pytest")]:
        lg.removeHandler(h)


def _interrupted_then_resumed(cli, args, step):
    """``args`` run stopped at ``step`` (its checkpoint and log kept), then the same command resumed to the end."""
    with stop_lightning_at(step):
        p = cli(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    p = cli(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    return p


def test_train_lm_logs_the_csv_metrics_to_tensorboard_across_a_resume(cli, tmp_path, small_corpus):
    out = tmp_path / "lm"
    p = _interrupted_then_resumed(cli, [*LM, "--corpus", small_corpus, "--out_dir", out], 3)
    assert p.stderr == "", p.stderr
    csv = csv_metrics(out)
    assert {"train/loss", "lr", "train/tokens_per_s", "val/tau_tf"} <= set(csv)
    assert max(csv["train/loss"]) >= 5 and all(v > 0 for v in csv["train/tokens_per_s"].values())
    assert_same_metrics(csv, tensorboard_metrics(out), "tensorboard")
    assert len(list((out / "tb" / "version_0").glob("events.out.tfevents.*"))) == 2     # one run dir, two starts
    assert not (out / "trackers.json").exists() and not (out / "mlflow.db").exists()


TRAIN_KINDS = {"lm": ["train", "lm"], "sampler": ["train", "sampler"], "lora": ["train", "lora"],
               "deer": ["train", "deer", "--stage", "1"]}


@pytest.mark.parametrize("kind", TRAIN_KINDS)
def test_every_train_command_refuses_an_unknown_or_missing_tracker_in_one_line(cli, tmp_path, kind, monkeypatch):
    out = tmp_path / "run"
    line = _one_line(cli(*TRAIN_KINDS[kind], "--logger", "csv,tensorbord", "--out_dir", out))
    assert "unknown --logger 'tensorbord'; valid: csv, tensorboard, mlflow, wandb" in line
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("mlflow", "wandb")
                        else real(name, *a))
    for tracker in ("mlflow", "wandb"):
        line = _one_line(cli(*TRAIN_KINDS[kind], "--logger", f"tensorboard,{tracker}", "--out_dir", out))
        assert f"--logger {tracker} needs the {tracker} package" in line and f"pip install 'workbench[{tracker}]'" in line
    assert not out.exists()


def test_tracker_names_and_the_tokens_of_each_commands_batches():
    from workbench.trackers import batch_tokens, check_trackers

    assert check_trackers("csv") == ["csv"] and check_trackers(None) == ["csv"]
    assert check_trackers("tensorboard") == ["csv", "tensorboard"]          # csv is always on
    assert check_trackers(["TensorBoard", "csv,tensorboard"]) == ["csv", "tensorboard"]
    windows = torch.zeros(4, 64, dtype=torch.long)
    assert batch_tokens((windows, torch.arange(4))) == 256                   # train lm: (windows, stream indices)
    assert batch_tokens({"ids": torch.zeros(3, 10, dtype=torch.long), "lo": 2, "hi": 5}) == 30     # train lora
    assert batch_tokens({"features": torch.zeros(8, 32, 144), "masked": None}) == 256             # train sampler
    assert batch_tokens({"prompt": [[1, 2, 3], [4]], "answer": [[5, 6], [7, 8, 9]]}) == 9          # train deer
    assert batch_tokens("nothing") == 0


def test_wandb_runs_offline_unless_configured(monkeypatch, tmp_path):
    from workbench.trackers import wandb_mode

    monkeypatch.setenv("HOME", str(tmp_path))                                 # no ~/.netrc
    for var in ("WANDB_MODE", "WANDB_API_KEY", "NETRC"):
        monkeypatch.delenv(var, raising=False)
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode() == "offline"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode() == "online"                                          # wandb login


# --------------------------------------------------------------------------- all four trackers (marker team)
def _check_all_four(out, config_key, config_value, resumed=False):
    """TensorBoard, MLflow and W&B hold exactly the metrics of metrics.csv; the config reached MLflow and W&B as
    hyper-parameters; one MLflow run and one W&B run id, also after a resume."""
    csv = csv_metrics(out)
    assert {"lr", "train/tokens_per_s", "epoch"} <= set(csv)
    assert_same_metrics(csv, tensorboard_metrics(out), "tensorboard")
    ml, params = mlflow_metrics(out)
    assert_same_metrics(csv, ml, "mlflow")
    wb, ids, config = wandb_metrics(out)
    assert_same_metrics(csv, wb, "wandb")
    rec = json.loads((out / "trackers.json").read_text())
    assert ids == {rec["wandb"]["id"]} and rec["wandb"]["mode"] == "offline"
    assert params[config_key] == str(config_value) and config[config_key] == config_value
    from mlflow.tracking import MlflowClient

    client = MlflowClient(rec["mlflow"]["tracking_uri"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [rec["mlflow"]["run_id"]]             # a resume opened no second run
    assert runs[0].info.status == "FINISHED"
    n_files = len(list((out / "wandb").glob(f"offline-run-*-{rec['wandb']['id']}")))
    assert n_files == (2 if resumed else 1)                                         # one W&B run, one dir a start
    return csv


@pytest.mark.team
def test_all_four_trackers_record_the_csv_metrics_of_a_resumed_train_lm(cli, tmp_path, small_corpus, monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'workbench[mlflow]'")
    pytest.importorskip("wandb", reason="pip install 'workbench[wandb]'")
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    _wandb_logger_as_in_a_fresh_process()
    out = tmp_path / "lm"
    p = _interrupted_then_resumed(cli, [*LM, "--corpus", small_corpus, "--out_dir", out, "--logger", ALL], 3)
    assert p.stderr == "", p.stderr
    csv = _check_all_four(out, "seq_len", 64, resumed=True)
    steps = sorted(csv["train/loss"])
    assert steps[0] == 0 and steps[-1] >= 5                                      # both legs are there


@pytest.mark.team
def test_all_four_trackers_on_train_sampler_lora_and_deer(cli, tmp_path, small_corpus, micro_checkpoint,
                                                           monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'workbench[mlflow]'")
    pytest.importorskip("wandb", reason="pip install 'workbench[wandb]'")
    for var in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    _wandb_logger_as_in_a_fresh_process()
    from test_sampler import make_store

    from workbench.deer.teacher import TeacherConfig, generate_teacher
    from workbench.model.io import load_checkpoint

    store = make_store(tmp_path / "s.zarr")
    p = cli("train", "sampler", "--store", store, "--block_length", "8", "--preset", "micro", "--max_steps", "10",
            "--val_every", "5", "--batch_size", "64", "--progress_bar", "false", "--accelerator", "cpu",
            "--out_dir", tmp_path / "sampler", "--logger", ALL)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "val/auc" in _check_all_four(tmp_path / "sampler", "batch_size", 64)

    p = cli("train", "lora", "--config", "workbench/configs/lora_micro.yaml", "--init_from", micro_checkpoint,
            "--corpus", small_corpus, "--max_steps", "2", "--val_every", "2", "--progress_bar", "false",
            "--accelerator", "cpu", "--out_dir", tmp_path / "lora", "--logger", ALL)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    _check_all_four(tmp_path / "lora", "max_steps", 2)

    teacher = tmp_path / "teacher"
    generate_teacher(TeacherConfig(target=str(micro_checkpoint), corpus=str(small_corpus), n_answers=12,
                                   prompt_len=24, gen_len=12, batch_size=4, chunk_size=8, out_dir=str(teacher)),
                     *load_checkpoint(micro_checkpoint)[:2])
    p = cli("train", "deer", "--stage", "1", "--drafter_preset", "micro", "--teacher", teacher, "--batch_size", "4",
            "--max_steps", "10", "--val_every", "5", "--val_percent", "30", "--warmup_steps", "1",
            "--progress_bar", "false", "--accelerator", "cpu", "--out_dir", tmp_path / "deer", "--logger", ALL)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "val/tau" in _check_all_four(tmp_path / "deer", "stage", 1)
    shutil.rmtree(teacher)
