"""Optuna threshold sweep: Pareto export, resume after a SIGKILL continues the same study."""
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from functools import partial
from pathlib import Path

import optuna
import pandas as pd
import pytest

from conftest import REPO


def _args(ckpt, corpus, out, n):
    return ["sweep", "--model", str(ckpt), "--corpus", str(corpus), "--out_dir", str(out), "--n_trials", str(n),
            "--n_prompts", "3", "--gen_len", "16", "--prompt_len", "48", "--block_lengths", "[4,8]",
            "--tune_block_length", "true", "--precision", "fp32", "--threshold_low", "0.01", "--threshold_high", "0.2"]


def test_sweep_resumes_same_study_after_kill(cli, tmp_path, micro_checkpoint, small_corpus):
    out = tmp_path / "sweep"
    db = out / "optuna.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "killed_run.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "workbench.cli",
                                 *_args(micro_checkpoint, small_corpus, out, 200)],
                                cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)

    def completed():
        # read-only: opening the storage with Optuna here would create its tables while the sweep does
        try:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
                return con.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        except sqlite3.Error:
            return 0

    deadline = time.time() + 120
    while completed() < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, f"the sweep exited by itself (code {proc.returncode}): {log.read_text()[-3000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # the sweep is dead: open the study read-write now, which rolls back a journal the kill left mid-commit
    first = sum(t.state == optuna.trial.TrialState.COMPLETE
                for t in optuna.load_study(study_name="threshold-sweep", storage=f"sqlite:///{db}").trials)
    assert 2 <= first < 200
    p = cli(*_args(micro_checkpoint, small_corpus, out, first + 3))        # the rerun, in this process
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


def test_workers_opening_one_new_sqlite_storage_together_all_succeed(tmp_path):
    """Two workers opening a new SQLite study at once race on Optuna's CREATE TABLE ("table studies already
    exists"); the loser reopens the finished schema instead of failing. Without the retry every round fails."""
    from workbench.tune.storage import make_storage

    for i in range(5):
        out = tmp_path / str(i)
        out.mkdir()
        barrier, errors = threading.Barrier(2), []

        def open_it():
            barrier.wait()
            try:
                make_storage(None, out)
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=open_it) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert not errors, errors


def test_a_schema_race_is_retried_a_bounded_number_of_times(tmp_path, monkeypatch):
    import optuna.storages

    from workbench.tune import storage

    calls = []

    def always_racing(url, **kw):
        calls.append(url)
        try:
            raise RuntimeError("(sqlite3.OperationalError) table studies already exists")
        except RuntimeError as e:                       # as Optuna wraps it
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e

    monkeypatch.setattr(storage, "_ServerTolerantRDBStorage", always_racing)
    monkeypatch.setattr(storage.time, "sleep", lambda s: None)
    with pytest.raises(ValueError, match="cannot be opened as an RDB URL .*StorageInternalError"):
        storage.make_storage(None, tmp_path)
    assert len(calls) == storage.SCHEMA_RACE_RETRIES + 1


def test_a_storage_that_cannot_be_opened_is_not_retried(tmp_path, monkeypatch):
    from workbench.tune import storage
    from workbench.tune.storage import make_storage

    calls = []

    def broken(url, **kw):
        calls.append(url)
        raise RuntimeError("no such host")

    monkeypatch.setattr(storage, "_ServerTolerantRDBStorage", broken)
    with pytest.raises(ValueError, match="cannot be opened as an RDB URL .*no such host"):
        make_storage("postgresql://nowhere/db", tmp_path)
    assert len(calls) == 1


def test_confidence_threshold_range_validated():

    from workbench.tune.sweep import SweepConfig

    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SweepConfig(threshold_low=0.0, threshold_high=0.9).validate()
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        SweepConfig(threshold_low=0.5, threshold_high=1.5).validate()
    SweepConfig(threshold_low=0.3, threshold_high=1.0).validate()
    with pytest.raises(ValueError, match="valid: confidence, sampler"):
        SweepConfig(policy="sampler", sampler="s", sampler_fallback="x").validate()
    SweepConfig(policy="sampler", sampler="s", sampler_fallback="sampler").validate()


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


# ------------------------------------------------------------------------------ several workers on one study
def test_two_workers_on_one_journal_study(tmp_path, micro_checkpoint, small_corpus):
    """``--n_workers 2`` on a journal file: both processes run trials of the one study, trial numbers are
    unique and dense, no parameters are proposed twice, and the exported Pareto front is the non-dominated set
    of all trials of both workers."""
    out, journal = tmp_path / "sweep", tmp_path / "shared" / "study.journal"
    p = subprocess.run([sys.executable, "-m", "workbench.cli", *_args(micro_checkpoint, small_corpus, out, 10),
                        "--n_workers", "2", "--storage", str(journal), "--tune_block_length", "false"],
                       cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    s = optuna.load_study(study_name="threshold-sweep", storage=JournalStorage(JournalFileBackend(str(journal))))
    trials = s.trials
    assert [t.number for t in trials] == list(range(len(trials)))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert 10 <= len(trials) <= 11                    # MaxTrialsCallback: at most n_workers - 1 extra
    workers = {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2, workers                  # both processes ran trials
    thresholds = [t.params["threshold"] for t in trials]
    assert len(set(thresholds)) == len(thresholds)     # distinct seeds: no proposal repeated
    front = pd.read_parquet(out / "pareto.parquet")
    values = [(t.values[0], t.values[1]) for t in trials]
    nondominated = {t.number for t, v in zip(trials, values)
                    if not any(w[0] >= v[0] and w[1] >= v[1] and w != v for w in values)}
    assert set(front["number"]) == nondominated


def _toy_worker(journal: str, n_trials: int, index: int, ready) -> None:
    """A worker of a toy study: worker 1's first trial hangs (it is to be killed); worker 0 first waits for
    that trial to run and kills its process, then works normally."""
    from workbench.tune.storage import mark_worker, open_study
    from workbench.tune.workers import optimize_until, worker_seed

    study = open_study("toy", journal, Path(journal).parent, "tpe", worker_seed(0, index), direction="minimize")
    ready()
    killed = any(t.user_attrs.get("slept") and t.state != optuna.trial.TrialState.RUNNING for t in study.trials)
    if index == 0 and not killed:                  # not once more after the kill, when run_workers finishes the study
        deadline = time.time() + 60
        while time.time() < deadline:
            # worker 1 inside its hanging trial (its "slept" mark is set), not between mark_worker and the sleep
            other = [t for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
                     if t.user_attrs.get("slept")
                     and t.user_attrs.get("worker", "").rpartition(":")[2] not in ("", str(os.getpid()))]
            if other:
                os.kill(int(other[0].user_attrs["worker"].rpartition(":")[2]), signal.SIGKILL)
                break
            time.sleep(0.05)

    def objective(trial):
        mark_worker(trial)
        x = trial.suggest_float("x", -10, 10)
        if index == 1 and not trial.user_attrs.get("slept"):
            trial.set_user_attr("slept", True)
            time.sleep(120)
        return (x - 2) ** 2

    optimize_until(study, objective, n_trials, (optuna.trial.TrialState.COMPLETE,))


def test_worker_killed_mid_trial_leaves_the_study_usable(tmp_path):
    """A worker SIGKILLed inside a trial: its trial is failed, Optuna's retry callback enqueues the same
    parameters, the parent runs it, the study reaches its trials, and the best value is the best over them."""
    from workbench.tune.storage import open_study
    from workbench.tune.workers import run_workers

    journal = str(tmp_path / "toy.journal")
    study = open_study("toy", journal, tmp_path, "tpe", 0, direction="minimize")
    exits = run_workers(partial(_toy_worker, journal, 6), 2, study)
    assert exits == [-signal.SIGKILL]
    trials = study.trials
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1 and failed[0].user_attrs.get("slept")
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].state == optuna.trial.TrialState.COMPLETE
    assert retried[0].params == failed[0].params
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 6 and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert study.best_value == min(t.value for t in done)
    study.optimize(lambda t: t.suggest_float("x", -10, 10) ** 2, n_trials=1)    # still usable
