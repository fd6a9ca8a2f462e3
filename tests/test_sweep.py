"""Optuna threshold sweep: Pareto export, resume after a SIGKILL continues the same study."""
import os
import signal
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest

from conftest import REPO


def _args(ckpt, corpus, out, n):
    return ["sweep", "--model", str(ckpt), "--corpus", str(corpus), "--out_dir", str(out), "--n_trials", str(n),
            "--n_prompts", "3", "--gen_len", "16", "--prompt_len", "48", "--block_lengths", "[4,8]",
            "--tune_block_length", "true", "--precision", "fp32", "--threshold_low", "0.01", "--threshold_high", "0.2"]


def test_sweep_resumes_same_study_after_kill(tmp_path, micro_checkpoint, small_corpus):
    out = tmp_path / "sweep"
    db = out / "optuna.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", *_args(micro_checkpoint, small_corpus, out, 200)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def completed():
        try:
            s = optuna.load_study(study_name="threshold-sweep", storage=f"sqlite:///{db}")
            return sum(t.state == optuna.trial.TrialState.COMPLETE for t in s.trials)
        except Exception:
            return 0

    deadline = time.time() + 120
    while completed() < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    first = completed()
    assert 2 <= first < 200
    p = subprocess.run([sys.executable, "-m", "workbench.cli", *_args(micro_checkpoint, small_corpus, out, first + 3)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    s = optuna.load_study(study_name="threshold-sweep", storage=f"sqlite:///{db}")
    done = [t for t in s.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == first + 3                      # the same study continued, not a new one
    assert max(t.number for t in done) >= first + 2    # trial numbers continue after the killed run's
    pareto = pd.read_parquet(out / "pareto.parquet")
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == first + 3 and pareto["pareto"].all() and (out / "pareto.png").exists()
    # every non-Pareto trial is dominated by some Pareto trial
    for _, r in trials[~trials["pareto"]].iterrows():
        assert ((pareto["tpf"] >= r["tpf"]) & (pareto["agree_serial"] >= r["agree_serial"])).any()


def test_confidence_threshold_range_validated():

    from workbench.tune.sweep import SweepConfig

    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SweepConfig(threshold_low=0.0, threshold_high=0.9).validate()
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SweepConfig(threshold_low=0.5, threshold_high=1.5).validate()
    SweepConfig(threshold_low=0.3, threshold_high=1.0).validate()


def test_resumed_study_does_not_redraw_the_first_trials(tmp_path):
    """A study resumed with the same seed must not propose the killed run's parameters again."""
    from workbench.tune.storage import open_study

    def run(n):
        study = open_study("s", None, tmp_path, "tpe", 0, directions=["maximize", "maximize"])
        study.optimize(lambda t: (t.suggest_float("threshold", 0.3, 1.0), 0.0), n_trials=n)
        return [t.params["threshold"] for t in study.trials]

    first = run(4)
    both = run(4)
    assert both[:4] == first and len(both) == 8
    assert not set(both[4:]) & set(first)
    # same seed, fresh storage: the first trials are reproducible
    (tmp_path / "other").mkdir()
    again = open_study("s", None, tmp_path / "other", "tpe", 0, directions=["maximize", "maximize"])
    again.optimize(lambda t: (t.suggest_float("threshold", 0.3, 1.0), 0.0), n_trials=4)
    assert [t.params["threshold"] for t in again.trials] == first
