"""Sweeps shared by a team: a study on a real PostgreSQL server (identity, one-line connection errors), the study's
labels, the ``optuna-dashboard`` line and the dashboard's JSON API. The multi-process faults against the server
(a worker killed, the server stopped) are in ``tests/faults/test_postgres_faults.py`` (marker ``team``)."""
import json
import sys
import urllib.request

import optuna
import pytest

from pg_fixtures import pg_server, pg_url  # noqa: F401


def tiny_sweep(corpus, out, n, *extra):
    """A sweep of the shipped tiny model that takes about a second a trial on one core."""
    return ["sweep", "--model", "tiny", "--corpus", str(corpus), "--out_dir", str(out), "--n_trials", str(n),
            "--n_prompts", "2", "--prompt_len", "32", "--gen_len", "8", "--block_lengths", "[4]", "--batch_size", "2",
            "--precision", "fp32", *map(str, extra)]


def _one_line(p, code):
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code and len(lines) == 1, (p.returncode, p.stderr)
    return lines[0]


def test_a_sweep_on_postgres_keeps_the_identity_it_keeps_on_sqlite(cli, pg_url, tmp_path, small_corpus):
    """The study on a real PostgreSQL server: trials of two invocations (as two hosts would run) add up in one
    study, its identity and labels are those the same sweep records on SQLite, and a worker with other settings is
    refused by name before it writes anything."""
    p = cli(*tiny_sweep(small_corpus, tmp_path / "a", 3, "--storage", pg_url))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    shown = pg_url.replace(pg_url.split(":")[2].split("@")[0], "***")
    assert f"optuna-dashboard '{shown}'" in p.stdout and pg_url not in p.stdout     # no password on screen
    p = cli(*tiny_sweep(small_corpus, tmp_path / "b", 5, "--storage", pg_url, "--seed", "1"))     # another "host"
    assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name="threshold-sweep", storage=pg_url)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == len(study.trials) == 5 and [t.number for t in study.trials] == list(range(5))
    assert study.metric_names == ["tpf", "agree_serial"]
    labels = {k: study.user_attrs[k] for k in ("objectives", "decoder", "block_lengths", "model")}
    assert labels == {"objectives": ["tpf", "agree_serial"], "decoder": "confidence", "block_lengths": [4],
                      "model": "tiny"}

    p = cli(*tiny_sweep(small_corpus, tmp_path / "lite", 1))                          # the same sweep on SQLite
    assert p.returncode == 0, p.stderr
    lite = optuna.load_study(study_name="threshold-sweep", storage=f"sqlite:///{tmp_path / 'lite' / 'optuna.db'}")
    assert study.user_attrs["workbench_measurement"] == lite.user_attrs["workbench_measurement"]
    assert {k: lite.user_attrs[k] for k in labels} == labels

    line = _one_line(cli(*tiny_sweep(small_corpus, tmp_path / "c", 6, "--storage", pg_url, "--gen_len", "16")), 2)
    assert "threshold-sweep" in line and "gen_len 8 (now 16)" in line
    assert not (tmp_path / "c").exists()
    assert len(optuna.load_study(study_name="threshold-sweep", storage=pg_url).trials) == 5


def test_sweep_sampler_shares_a_study_on_postgres(cli, pg_url, tmp_path):
    """``sweep sampler`` on the server: two invocations add up to one study of val_auc trials, labelled for the
    dashboard; the best trial reported is the best over both."""
    from test_sampler import make_store

    store = make_store(tmp_path / "s.zarr")
    args = ["sweep", "sampler", "--store", store, "--block_length", "8", "--widths", "[16]", "--depth_high", "1",
            "--max_epochs", "1", "--val_every", "null", "--batch_size", "64", "--storage", pg_url]
    for out, n, seed in (("a", 2, 0), ("b", 3, 1)):
        p = cli(*args, "--out_dir", tmp_path / out, "--n_trials", n, "--seed", seed)
        assert p.returncode == 0, p.stderr
    study = optuna.load_study(study_name="sampler-hpo", storage=pg_url)
    finished = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED)]
    assert len(finished) == len(study.trials) == 3
    assert study.user_attrs["objectives"] == ["val_auc"] and study.user_attrs["block_length"] == 8
    best = json.loads((tmp_path / "b" / "best_params.json").read_text())
    assert best["val_auc"] == max(t.value for t in finished if t.state == optuna.trial.TrialState.COMPLETE)


def test_a_wrong_password_or_database_is_one_line_without_the_password(cli, pg_server, tmp_path, small_corpus):
    for url, why in ((pg_server.url("postgres", password="not-the-password"), "password authentication failed"),
                     (pg_server.url("no_such_database"), 'database "no_such_database" does not exist')):
        line = _one_line(cli(*tiny_sweep(small_corpus, tmp_path / "sw", 1, "--storage", url)), 2)
        assert why in line and url.replace(url.split(":")[2].split("@")[0], "***") in line, line
        assert pg_server.password not in line and "not-the-password" not in line
        assert not (tmp_path / "sw").exists()


def test_a_missing_database_driver_names_the_pip_extra(tmp_path, monkeypatch):
    from workbench.tune.storage import make_storage

    monkeypatch.setitem(sys.modules, "psycopg", None)          # import psycopg now raises ImportError
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(ValueError, match=r"needs a postgresql database driver .*pip install 'workbench\[postgres\]'"):
        make_storage("postgresql+psycopg://u:secret@127.0.0.1:1/db", tmp_path)
    with pytest.raises(ValueError) as e:
        make_storage("postgresql+psycopg://u:secret@127.0.0.1:1/db", tmp_path)
    assert "secret" not in str(e.value) and "u:***@127.0.0.1:1/db" in str(e.value)


def test_shown_url_hides_only_the_password():
    from workbench.tune.storage import shown_url

    assert shown_url("postgresql://me:p%40ss@db.lab:5432/studies") == "postgresql://me:***@db.lab:5432/studies"
    assert shown_url("postgresql://me@db.lab/studies") == "postgresql://me@db.lab/studies"
    assert shown_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert shown_url("runs/study.journal") == "runs/study.journal"


def test_a_lost_connection_is_told_from_other_errors():
    import sqlalchemy.exc as sa

    from workbench.tune.storage import connection_lost

    lost = sa.OperationalError("SELECT 1", {}, ConnectionRefusedError("connection refused"))
    assert connection_lost(lost)
    try:                                                       # wrapped as Optuna and Python wrap it
        try:
            raise lost
        except sa.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from e
    except optuna.exceptions.StorageInternalError as wrapped:
        assert connection_lost(wrapped)
    assert not connection_lost(sa.IntegrityError("INSERT", {}, ValueError("duplicate key")))
    assert not connection_lost(ValueError("bad threshold"))


# ------------------------------------------------------------------------------------------------- dashboard
def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def test_the_dashboard_serves_a_finished_study_and_its_trials(cli, tmp_path, small_corpus):
    """``serve_dashboard`` (what ``sweep --dashboard`` runs) on a finished study, at a free loopback port: the
    JSON API lists the study, and its detail holds every trial, the objective names and the study's labels."""
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install "
                                                   "'workbench[dashboard]')")
    from workbench.tune.team import serve_dashboard

    out = tmp_path / "sw"
    p = cli(*tiny_sweep(small_corpus, out, 3, "--dashboard", "0"))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "dashboard at http://127.0.0.1:" in p.stdout                    # served while the workers ran
    storage = f"sqlite:///{out / 'optuna.db'}"
    study = optuna.load_study(study_name="threshold-sweep", storage=storage)
    with serve_dashboard(storage, port=0) as address:
        host = address.removesuffix("/dashboard")
        assert host.startswith("http://127.0.0.1:")
        listed = _get(f"{host}/api/studies")["study_summaries"]
        assert [s["study_name"] for s in listed] == ["threshold-sweep"]
        detail = _get(f"{host}/api/studies/{listed[0]['study_id']}")
    assert detail["name"] == "threshold-sweep"
    assert [t["number"] for t in detail["trials"]] == [t.number for t in study.trials]
    assert [[v for v in t["values"]] for t in detail["trials"]] == [t.values for t in study.trials]
    assert detail["objective_names"] == ["tpf", "agree_serial"]                # Optuna's metric names
    attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert json.loads(attrs["objectives"]) == ["tpf", "agree_serial"] and attrs["decoder"] == "confidence"
    assert json.loads(attrs["block_lengths"]) == [4] and attrs["model"] == "tiny"


def test_dashboard_options_are_checked_before_anything_is_written(cli, tmp_path, monkeypatch):
    line = _one_line(cli("sweep", "--dashboard", "70000", "--out_dir", tmp_path / "sw"), 2)
    assert "--dashboard takes a port in 0…65535" in line
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna_dashboard"
                        else real(name, *a))
    line = _one_line(cli("sweep", "--dashboard", "8080", "--out_dir", tmp_path / "sw"), 2)
    assert "pip install 'workbench[dashboard]'" in line and not (tmp_path / "sw").exists()


@pytest.mark.slow
def test_the_dashboard_page_shows_the_study_in_headless_chromium(cli, tmp_path, small_corpus):
    """The dashboard's page of a finished study, rendered by headless Chromium (Debian's ``chromium``), names the
    study; a screenshot of it is written (``WORKBENCH_DASHBOARD_SHOT=<path>`` keeps a copy, as the one in
    docs/guides/team-sweeps-dashboard.png)."""
    import os
    import shutil
    import subprocess

    pytest.importorskip("optuna_dashboard", reason="pip install 'workbench[dashboard]'")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no headless Chromium here (apt-get install chromium)")
    from workbench.tune.team import serve_dashboard

    out = tmp_path / "sw"
    p = cli(*tiny_sweep(small_corpus, out, 12, "--study", "team-sweep-shot", "--block_lengths", "[4,8]",
                        "--tune_block_length", "true", "--threshold_low", "0.05"))
    assert p.returncode == 0, p.stderr
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--virtual-time-budget=20000"]
    with serve_dashboard(f"sqlite:///{out / 'optuna.db'}", port=0) as address:
        page = f"{address}/studies/1"
        dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True, timeout=180).stdout
        shot = tmp_path / "dashboard.png"
        subprocess.run([*browser, "--window-size=1400,1000", f"--screenshot={shot}", page], capture_output=True,
                       timeout=180)
    assert "team-sweep-shot" in dom and "agree_serial" in dom          # the study's name and objective, rendered
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000          # a page, not a blank image
    if os.environ.get("WORKBENCH_DASHBOARD_SHOT"):
        shutil.copy(shot, os.environ["WORKBENCH_DASHBOARD_SHOT"])


def test_a_trial_created_as_the_connection_went_is_failed_and_retried(tmp_path):
    """A RUNNING trial that no worker marked and that started before the connection was lost (its worker never
    learnt of it) is failed and retried on reconnecting; another worker's marked trial, and an unmarked one started
    afterwards (a live worker about to mark it), are left alone."""
    import datetime

    import optuna

    from workbench.tune.storage import fail_own_trials

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    orphan = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    other = study.ask()
    other.set_user_attr("worker", "elsewhere:1")
    lost_at = datetime.datetime.now()
    later = study.ask()
    assert fail_own_trials(study, unmarked_before=lost_at) == [orphan.number]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[orphan.number] == optuna.trial.TrialState.FAIL
    assert states[other.number] == states[later.number] == optuna.trial.TrialState.RUNNING
    retry = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert [t.params for t in retry] == [orphan.params]
    assert fail_own_trials(study) == []                          # without the loss time: only this worker's own
