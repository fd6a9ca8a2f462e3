"""Faults of a sweep shared on a real PostgreSQL server, with several worker processes (marker ``team``: each test
starts workers that import torch and load the model, about a minute on two busy cores; ``.ci/run`` runs them after
the default suite):

* a 3-worker sweep (``--n_workers 3``) with one worker killed by SIGKILL mid-trial: the survivors' heartbeat check
  fails its trial and a retry with the same parameters runs, all N trials complete, none stays RUNNING and none is
  run twice;
* the server stopped during a sweep: each worker says so in one line, waits ``--reconnect_s`` and exits 1 with the
  study intact; a rerun after the server is back completes it;
* the server stopped and started again within ``--reconnect_s``: the workers reconnect and finish.
"""
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from conftest import REPO
from pg_fixtures import pg_server, pg_url  # noqa: F401

pytestmark = pytest.mark.team

TINY = ["--model", "tiny", "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8", "--block_lengths", "[4]",
        "--batch_size", "2", "--precision", "fp32", "--heartbeat_interval", "1"]


def _start(url, out, n, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", "sweep", *TINY, "--storage", url,
                             "--out_dir", str(out), "--n_trials", str(n), *map(str, extra)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_STORAGES = {}


def _trials(url, states=None):
    """The study's trials, read through one storage per URL (opening a storage creates an engine and checks the
    schema: too slow to poll with)."""
    if url not in _STORAGES:
        _STORAGES[url] = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})   # server restarts
    try:
        study = optuna.load_study(study_name="threshold-sweep", storage=_STORAGES[url])
    except KeyError:                                   # not created yet
        return []
    return study.get_trials(states=states)


def _wait(cond, what, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _check_study(url, n):
    """All ``n`` trials complete (at most two more: workers that started their last trials together), none
    RUNNING or WAITING, trial numbers dense, and no parameters drawn twice except a failed trial's retry (which
    runs the failed trial's parameters)."""
    trials = _trials(url)
    states = [t.state for t in trials]
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert n <= len(done) <= n + 2, len(done)
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.WAITING not in states
    assert [t.number for t in trials] == list(range(len(trials)))
    failed = {t.number: t for t in trials if t.state == optuna.trial.TrialState.FAIL}
    retries = {t.number: t.system_attrs["failed_trial"] for t in trials if "failed_trial" in t.system_attrs}
    for number, of in retries.items():        # a trial failed before it drew its parameters is retried with new ones
        assert of in failed and (trials[number].params == failed[of].params or not failed[of].params)
    firsts = [t.params["threshold"] for t in trials if t.number not in retries and t.params]
    assert len(set(firsts)) == len(firsts)             # every other trial drew its own parameters
    return trials, failed, retries


def test_a_worker_killed_mid_trial_is_failed_by_the_heartbeat_and_all_trials_complete(pg_url, tmp_path):
    n = 16
    # trials of about a second (16 prompts), so that the kill lands inside the trial it was aimed at
    sweep = _start(pg_url, tmp_path / "sw", n, "--n_workers", "3", "--n_prompts", "16", "--gen_len", "16")
    killed = set()
    try:
        # a child worker (not the parent process) inside a trial, after the first finished trial
        def victim():
            ts = _trials(pg_url)
            if sum(t.state == optuna.trial.TrialState.COMPLETE for t in ts) < 1:
                return None
            run = [t for t in ts if t.state == optuna.trial.TrialState.RUNNING and t.params
                   and t.user_attrs.get("worker", "").rpartition(":")[2] not in ("", str(sweep.pid), *killed)]
            return run[0] if run else None

        orphans = []
        while not orphans and len(killed) < 2:     # a kill that lands between two trials leaves none: the other child
            worker = _wait(victim, "a child worker inside a trial").user_attrs["worker"]
            killed.add(worker.rpartition(":")[2])
            os.kill(int(worker.rpartition(":")[2]), signal.SIGKILL)
            killed_at = time.time()
            # the trial its process was running when the kill landed (the one seen running, or the next)
            orphans = [t for t in _trials(pg_url, (optuna.trial.TrialState.RUNNING,))
                       if t.user_attrs.get("worker") == worker]
        assert len(orphans) == 1, f"{len(orphans)} running trials of the killed workers"
        out, err = sweep.communicate(timeout=600)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    trials, failed, retries = _check_study(pg_url, n)
    killed = trials[orphans[0].number]
    assert killed.state == optuna.trial.TrialState.FAIL
    assert list(retries.values()).count(killed.number) == 1
    retry = trials[next(k for k, v in retries.items() if v == killed.number)]
    assert retry.state == optuna.trial.TrialState.COMPLETE and (retry.params == killed.params or not killed.params)
    # the heartbeat, not the parent's after-the-fact recovery: it was failed while the survivors still ran trials
    assert killed.datetime_complete.timestamp() >= killed_at + 1 - 1e-3
    later = [t for t in trials if t.number not in retries and t.datetime_complete > killed.datetime_complete]
    assert later, "the killed trial was failed only after the survivors had finished"
    assert len({t.user_attrs["worker"] for t in trials if t.state == optuna.trial.TrialState.COMPLETE}) >= 2


def _lines(err):
    return [ln for ln in err.splitlines() if ln.strip()]


def test_a_stopped_server_is_waited_for_then_given_up_with_the_study_intact(pg_server, pg_url, tmp_path, cli):
    sweep = _start(pg_url, tmp_path / "sw", 400, "--n_workers", "2", "--reconnect_s", "4")
    try:
        _wait(lambda: sum(t.state == optuna.trial.TrialState.COMPLETE for t in _trials(pg_url)) >= 3,
              "three finished trials")
        pg_server.stop("fast")
        out, err = sweep.communicate(timeout=240)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        pg_server.start()
    assert sweep.returncode == 1, err[-3000:]
    lines = _lines(err)
    lost = [ln for ln in lines if "lost the connection to postgresql://workbench:***@" in ln]
    gave_up = [ln for ln in lines if ": error: worker " in ln and "gave up on postgresql://workbench:***@" in ln]
    assert len(lost) == 2 and len(gave_up) == 2, err               # each worker, in one line each
    assert len(lines) == 4 and "Traceback" not in err and pg_server.password not in err, err
    assert all(ln.startswith("workbench sweep: ") for ln in lines) and "retrying for up to 4 s" in lost[0]
    assert len({ln.split(" worker ")[1].split()[0] for ln in gave_up}) == 2       # two distinct workers
    # the study is intact: the rerun (in this process) fails the trials in flight and completes the study
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in _trials(pg_url))
    assert done >= 3
    p = cli("sweep", *TINY, "--storage", pg_url, "--out_dir", tmp_path / "sw", "--n_trials", done + 2)
    assert p.returncode == 0, p.stderr
    _check_study(pg_url, done + 2)


def test_a_server_back_within_the_wait_lets_the_workers_finish(pg_server, pg_url, tmp_path):
    n = 25
    sweep = _start(pg_url, tmp_path / "sw", n, "--n_workers", "2", "--reconnect_s", "120")
    try:
        _wait(lambda: sum(t.state == optuna.trial.TrialState.COMPLETE for t in _trials(pg_url)) >= 3,
              "three finished trials")
        pg_server.stop("fast")
        time.sleep(3)
        pg_server.start()
        out, err = sweep.communicate(timeout=400)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert sweep.returncode == 0, err[-3000:]
    lines = _lines(err)
    assert lines and "Traceback" not in err, err
    assert all("lost the connection to postgresql://workbench:***@" in ln or " reconnected to " in ln
               for ln in lines), err
    lost = [ln for ln in lines if "lost the connection" in ln]
    assert 1 <= len(lost) <= 2 and len([ln for ln in lines if "reconnected" in ln]) == len(lost)
    _check_study(pg_url, n)
