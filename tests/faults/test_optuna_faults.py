"""A sweep worker killed mid-trial (issue 27 §4): its trial is failed and retried, never left RUNNING."""
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest

from conftest import REPO


def _study(out, journal):
    import optuna

    if journal:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(journal)))
    else:
        storage = f"sqlite:///{out / 'optuna.db'}"
    return optuna.load_study(study_name="threshold-sweep", storage=storage)


@pytest.mark.parametrize("journal", [False, True], ids=["sqlite_heartbeat", "journal_dead_pid"])
def test_killed_worker_trial_is_failed_and_retried(cli, micro_checkpoint, small_corpus, tmp_path, journal):
    """A sweep killed (SIGKILL) mid-trial left that trial RUNNING for good (issue 27 §4). Reopening the study fails
    it and a retry with the same parameters runs: SQLite by Optuna's heartbeat, a journal by the dead process id."""
    out = tmp_path / "sw"
    jpath = tmp_path / "study.journal" if journal else None
    args = ["sweep", "--model", str(micro_checkpoint), "--corpus", str(small_corpus), "--n_prompts", "16",
            "--prompt_len", "48", "--gen_len", "64", "--block_lengths", "[8]", "--out_dir", str(out),
            "--heartbeat_interval", "1", "--precision", "fp32", "--n_trials", "400"] + \
        (["--storage", str(jpath)] if journal else [])
    killed = None
    for _ in range(5):                                   # catch the worker inside a trial
        p = subprocess.Popen([sys.executable, "-m", "workbench.cli", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            time.sleep(0.05)
            try:
                st = _study(out, jpath)
            except Exception:                            # noqa: BLE001 - the study is not created yet
                continue
            done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
            # inside a trial: running, with its parameters drawn (a kill between Optuna's ask and the first
            # suggest leaves a trial without parameters, whose retry draws new ones)
            running = [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING and t.params]
            if len(done) >= 2 and running:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                st = _study(out, jpath)
                # with its parameters: the trial seen running may have finished before the kill landed, and
                # the next one may not have drawn its parameters yet (then catch another)
                stuck = [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING and t.params]
                killed = stuck[0] if stuck else None
                break
        if killed is not None:
            break
        p.kill()
        p.wait()
    assert killed is not None, "no trial was running when the worker was killed"
    time.sleep(3.5)                                      # the grace period: 3 heartbeat intervals
    n = len([t for t in _study(out, jpath).trials if t.state == optuna.trial.TrialState.COMPLETE]) + 2
    r = cli(*[a if a != "400" else str(n) for a in args])          # the rerun, in this process
    assert r.returncode == 0, r.stderr[-2000:]
    st = _study(out, jpath)
    states = {t.number: t.state for t in st.trials}
    assert states[killed.number] == optuna.trial.TrialState.FAIL
    assert optuna.trial.TrialState.RUNNING not in states.values()
    retries = [t for t in st.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == killed.params
