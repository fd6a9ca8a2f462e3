"""Training runs killed at a checkpoint and resumed give the uninterrupted run's losses, log and weights
(issue 27 §3): train lm (killed twice), train sampler (end-of-epoch and mid-epoch checkpoints), DEER (train lora:
tests/test_lora_drafter.py)."""
import json

import pytest
import torch

from conftest import stop_lightning_at
from test_deer import TeacherConfig, generate_teacher
from test_sampler import store  # noqa: F401,F811  (a fixture of that module)
from test_training import _cfg
from workbench.train.lm import train_lm


def test_log_survives_two_interruptions(tmp_path, small_corpus):
    """Killed after step 8 and again after step 16, then resumed to 24: the training log holds every row of the
    uninterrupted run (it used to keep only the rows after the last resume point)."""
    import pandas as pd

    kw = dict(max_steps=24, stage1_steps=4, val_every=4, checkpoint_every=8, precision="32-true")
    a = train_lm(_cfg(tmp_path / "a", small_corpus, **kw))
    cfg_b = _cfg(tmp_path / "b", small_corpus, **kw)
    for stop in (8, 16):
        with stop_lightning_at(stop):
            train_lm(cfg_b)
    b = train_lm(cfg_b)
    log_a, log_b = pd.read_csv(a / "training_log.csv"), pd.read_csv(b / "training_log.csv")
    assert log_b["step"].tolist() == log_a["step"].tolist()
    assert log_b["step"].min() < 8 and not (tmp_path / "b" / "run" / "logs" / "version_0" / "history.csv").exists()
    pd.testing.assert_series_equal(log_b["val/ar_loss"], log_a["val/ar_loss"], rtol=1e-4)


@pytest.mark.parametrize("val_every", [None, 7], ids=["end_of_epoch", "mid_epoch"])
def test_resume_equals_uninterrupted(store, tmp_path, monkeypatch, val_every):
    """Killed at a checkpoint and resumed, training gives the uninterrupted run's losses and final weights (it
    diverged: dropout's random state was not restored; a mid-epoch resume replayed the epoch's first batches);
    the log holds each step once."""
    import pandas as pd

    from conftest import REPO, stop_lightning_at
    from workbench.sampler.train import main

    monkeypatch.chdir(REPO)
    base = ["--config", "workbench/configs/sampler_micro.yaml", "--store", str(store), "--progress_bar", "false",
            "--max_epochs", "3", "--patience", "99"] + (["--val_every", str(val_every)] if val_every else [])
    assert main(base + ["--out_dir", str(tmp_path / "a")]) == 0
    b = base + ["--out_dir", str(tmp_path / "b")]
    if val_every:
        stop = 7                                               # a mid-epoch checkpoint (after a validation)
    else:                                                      # the end of epoch 1
        assert main(base[:-2] + ["--patience", "99", "--max_epochs", "1", "--out_dir", str(tmp_path / "one")]) == 0
        stop = json.loads((tmp_path / "one" / "metrics.json").read_text())["global_step"]
    with stop_lightning_at(stop):
        main(b)
    assert main(b) == 0
    la = pd.read_csv(tmp_path / "a" / "logs/version_0/metrics.csv")
    lb = pd.read_csv(tmp_path / "b" / "logs/version_0/metrics.csv")
    assert la["step"].tolist() == lb["step"].tolist()
    pd.testing.assert_series_equal(la["train/bce"], lb["train/bce"], rtol=1e-5)
    wa = torch.load(tmp_path / "a" / "checkpoints/last.ckpt", weights_only=False)["state_dict"]
    wb = torch.load(tmp_path / "b" / "checkpoints/last.ckpt", weights_only=False)["state_dict"]
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5, msg=k)


def test_train_deer_resume_equals_uninterrupted(tmp_path, small_corpus, micro_checkpoint):
    """Killed at a checkpoint and resumed, DEER training gives the uninterrupted run's weights and log (issue 27 §3)."""
    import pandas as pd

    from conftest import stop_lightning_at
    from workbench.deer.train import DeerTrainConfig, train_deer
    from workbench.model.io import load_checkpoint

    cfg = TeacherConfig(target=str(micro_checkpoint), corpus=str(small_corpus), n_answers=24, prompt_len=24,
                        gen_len=12, batch_size=4, chunk_size=8, out_dir=str(tmp_path / "teacher"))
    generate_teacher(cfg, *load_checkpoint(micro_checkpoint)[:2])
    common = dict(teacher=str(tmp_path / "teacher"), batch_size=4, val_every=2, val_percent=30, warmup_steps=1,
                  checkpoint_every=2, progress_bar=False, accelerator="cpu", stage=1, drafter_preset="micro",
                  max_steps=6)
    a = train_deer(DeerTrainConfig(out_dir=str(tmp_path / "a"), **common))
    with stop_lightning_at(4):
        train_deer(DeerTrainConfig(out_dir=str(tmp_path / "b"), **common))
    b = train_deer(DeerTrainConfig(out_dir=str(tmp_path / "b"), **common))
    wa, wb = load_checkpoint(a)[0].state_dict(), load_checkpoint(b)[0].state_dict()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5, msg=k)
    la = pd.read_csv(tmp_path / "a" / "logs/version_0/metrics.csv")
    lb = pd.read_csv(tmp_path / "b" / "logs/version_0/metrics.csv")
    assert la["step"].tolist() == lb["step"].tolist()
