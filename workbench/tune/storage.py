"""Optuna storage and sampler choice shared by every study, and what happens to the trial of a killed worker.

No trial stays RUNNING for good:

* **RDB storage** (the default SQLite file, or any RDB URL): Optuna's heartbeat. A running trial records a
  heartbeat every ``heartbeat_interval`` seconds; one silent for ``grace_period`` seconds is stale. Stale trials
  are failed whenever a worker starts a trial (``optimize`` calls :func:`optuna.storages.fail_stale_trials`) and
  when a study is opened, and :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` enqueues a retry with the same
  parameters (at most ``MAX_RETRY`` times).
* **Any storage**: every trial records its worker (host and process id); when a study is opened, and when a
  ``--n_workers`` child died, a RUNNING trial of this host whose process is gone is failed at once and retried the
  same way. On a journal file (no heartbeat in Optuna 5) trials of other hosts are left to those hosts' next
  worker.

A database server (PostgreSQL, MySQL) can go away while workers run: a worker that loses its connection says so in
one line, polls the server for a bounded time (``reconnect_s``) and then either goes on (its trial in flight is
failed and retried) or ends with :class:`StorageLost`, one line and exit status 1, leaving the study intact in the
database for a rerun (:func:`wait_for_storage`). URLs are shown with their password hidden (:func:`shown_url`).
"""
from __future__ import annotations

import datetime
import os
import socket
import time
from pathlib import Path

import optuna

#: Retries of a trial whose worker died.
MAX_RETRY = 2

#: Reopenings of an RDB storage whose tables another process was creating at the same moment.
SCHEMA_RACE_RETRIES = 5

OPTUNA_SAMPLERS = ("tpe", "nsga2")


def make_storage(storage: str | None, out_dir: Path, heartbeat_interval: int = 30, grace_period: int | None = None):
    """``None`` → SQLite file ``out_dir/optuna.db``; an RDB URL (``sqlite:///``, ``postgresql://``, ...) →
    :class:`optuna.storages.RDBStorage` with the heartbeat (see the module docstring; ``grace_period`` defaults to
    three intervals); any other string is a journal file path (many workers on many machines sharing a file
    system) → :class:`optuna.storages.JournalStorage`.

    Raises ``ValueError`` (one line, the URL shown without its password) for a URL that cannot be opened: a missing
    database driver (naming the pip extra that installs it), a refused password, a database that does not exist,
    a server that does not answer."""
    if storage is None or "://" in storage:
        url = f"sqlite:///{(out_dir / 'optuna.db').resolve()}" if storage is None else storage
        for attempt in range(SCHEMA_RACE_RETRIES + 1):
            try:
                return _open_rdb(url, heartbeat_interval, grace_period or 3 * heartbeat_interval)
            except Exception as e:  # noqa: BLE001 - sqlalchemy's plugin / connection errors
                if attempt < SCHEMA_RACE_RETRIES and _lost_schema_race(e):
                    time.sleep(0.05 * (attempt + 1))     # another process is creating the tables: open them
                    continue
                raise ValueError(_open_error(url, e)) from None
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    _check_journal(Path(storage))
    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(storage)))


def _open_rdb(url: str, heartbeat_interval: int, grace_period: int):
    """:class:`_ServerTolerantRDBStorage` on ``url``; a database server's connections are checked before use
    (``pool_pre_ping``: a pool that outlived a server restart reconnects) and PostgreSQL's connection attempts
    time out after 10 s."""
    import warnings

    engine_kwargs = {}
    if not url.startswith("sqlite"):
        engine_kwargs["pool_pre_ping"] = True
    if url.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the heartbeat options are marked experimental
        return _ServerTolerantRDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval,
                                         grace_period=grace_period, heartbeat_stale_trial_callback=_retry())


class _ServerTolerantRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose heartbeat thread survives a lost database connection: a heartbeat that cannot
    be written is skipped (the worker's own loop reports the loss once, :func:`wait_for_storage`), where Optuna's
    thread would die with a traceback and never beat again."""

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except Exception as e:  # noqa: BLE001 - filtered just below
            if not connection_lost(e):
                raise


#: Extras of ``pip install 'workbench[...]'`` that install a database driver, by SQLAlchemy dialect.
DRIVER_EXTRAS = {"postgresql": "postgres"}


def shown_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs); other text is returned as it is."""
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        return u.render_as_string(hide_password=True) if u.password else url
    except Exception:  # noqa: BLE001 - not a URL: nothing to hide
        return url


def _reason(e: BaseException) -> str:
    """The database's own words for error ``e``: the driver's message (without SQLAlchemy's background link and
    statement), whitespace collapsed, else the error's text."""
    import sqlalchemy.exc as sa

    text, inner = f"{type(e).__name__}: {e}", e
    for _ in range(10):                          # the first database (DBAPI) error of the chain, if any
        if isinstance(inner, sa.DBAPIError) and inner.orig is not None:
            text = str(inner.orig)
            break
        inner = inner.__cause__ or inner.__context__
        if inner is None:
            break
    text = " ".join(text.split("(Background on this error at")[0].split())
    return text.removeprefix("connection failed: ").replace("FATAL: ", "")


def _open_error(url: str, e: BaseException) -> str:
    """The one-line message of an RDB URL that could not be opened (the password hidden, also from the reason)."""
    from sqlalchemy.engine import make_url

    shown = shown_url(url)
    chain, x = [], e
    while x is not None and len(chain) < 10:
        chain.append(x)
        x = x.__cause__ or x.__context__
    missing = next((c for c in chain if isinstance(c, ImportError)), None)
    try:
        u = make_url(url)
        dialect, password = u.get_backend_name(), u.password
    except Exception:  # noqa: BLE001 - not even a URL
        dialect, password = None, None
    if missing is not None and dialect not in (None, "sqlite"):
        name = getattr(missing, "name", None) or str(missing)
        fix = (f"pip install 'workbench[{DRIVER_EXTRAS[dialect]}]'" if dialect in DRIVER_EXTRAS
               else f"install the Python driver of the URL's dialect (pip install {name})")
        return f"--storage {shown} needs a {dialect} database driver that is not installed ({name}): {fix}"
    reason = _reason(e)
    if password and len(str(password)) >= 4:     # a driver that quoted the password back: hidden too
        reason = reason.replace(str(password), "***")
    if dialect in (None, "sqlite") or not connection_lost(e):
        return (f"--storage {shown} cannot be opened as an RDB URL ({reason}); give sqlite:///path.db, "
                "postgresql://user:password@host:port/database, mysql://... or a journal file path")
    return (f"--storage {shown}: the database server refused or did not answer ({reason}); check the host, "
            "port, user, password and database name of the URL")


def connection_lost(e: BaseException) -> bool:
    """True when ``e``, or an error it was raised from, is a failed database connection (SQLAlchemy's
    ``OperationalError``, ``InterfaceError`` or an invalidated connection): a server stopped, restarted or
    unreachable. Optuna and Python wrap such errors (``StorageInternalError``; an error raised while handling
    another), so the whole chain is searched."""
    import sqlalchemy.exc as sa

    for _ in range(12):
        if e is None:
            return False
        if isinstance(e, (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError)):
            return True
        if isinstance(e, sa.DBAPIError) and e.connection_invalidated:
            return True
        e = e.__cause__ or e.__context__
    return False


class StorageLost(RuntimeError):
    """A worker's database server stopped answering for longer than it waits (:func:`wait_for_storage`). The
    study is intact in the database; a rerun continues it. ``command``: the command that ran the worker (its
    messages' prefix); :attr:`exit_code` 1 (an environment failure, as a full disk)."""

    exit_code = 1

    def __init__(self, command: str, message: str):
        self.command = command
        super().__init__(message)

    def report(self) -> int:
        """Print the one-line error on stderr; returns :attr:`exit_code`."""
        import sys

        print(f"{self.command}: error: {self}", file=sys.stderr, flush=True)
        return self.exit_code


def rdb_backend(study: optuna.Study):
    """The :class:`optuna.storages.RDBStorage` under ``study``'s storage (Optuna wraps it in a cache), or None
    for a journal storage."""
    storage = study._storage
    storage = getattr(storage, "_backend", storage)
    return storage if isinstance(storage, optuna.storages.RDBStorage) else None


def on_server(study: optuna.Study) -> bool:
    """True when ``study`` lives on a database server (not an SQLite file nor a journal): the storages that can
    go away and come back."""
    rdb = rdb_backend(study)
    return rdb is not None and rdb.engine.name != "sqlite"


def wait_for_storage(study: optuna.Study, error: BaseException, seconds: float, command: str = "workbench") -> None:
    """After ``error`` (a lost connection, :func:`connection_lost`): print one line, then try the study's
    database server every second for up to ``seconds``. Returns once it answers (printing one line), after
    failing this process's RUNNING trials with their retries enqueued (their heartbeat stopped with the
    connection: they would wait out the grace period otherwise). Raises :class:`StorageLost` when it does not
    answer in time."""
    import sys

    lost_at = datetime.datetime.now()
    rdb = rdb_backend(study)
    url, who = shown_url(str(rdb.url)), f"worker {worker_id()}"
    print(f"{command}: {who} lost the connection to {url} ({_reason(error)}); retrying for up to {seconds:g} s",
          file=sys.stderr, flush=True)
    t0 = time.monotonic()
    while True:
        try:
            with rdb.engine.connect() as con:
                con.exec_driver_sql("SELECT 1")
            break
        except Exception as e:  # noqa: BLE001 - filtered just below
            if not connection_lost(e):
                raise
        if time.monotonic() - t0 >= seconds:
            raise StorageLost(command, f"{who} gave up on {url} after {seconds:g} s without an answer; the study "
                                       "is intact in the database: rerun the same command once the server is back")
        time.sleep(min(1.0, max(0.05, seconds - (time.monotonic() - t0))))
    rdb.scoped_session.remove()                  # a database session of the lost connection must not be reused
    fail_own_trials(study, unmarked_before=lost_at)
    print(f"{command}: {who} reconnected to {url} after {time.monotonic() - t0:.0f} s; its trial in flight is "
          "failed and retried", file=sys.stderr, flush=True)


def fail_own_trials(study: optuna.Study, unmarked_before: datetime.datetime | None = None) -> list[int]:
    """Fail the RUNNING trials this process (:func:`worker_id`) left behind (it is not running any now) and enqueue
    their retries; returns their numbers. With ``unmarked_before`` (when a connection was lost), also the RUNNING
    trials that no worker marked (:func:`mark_worker`) and that started before it: a worker marks its trial first
    thing, so such a trial was created as the connection went, and its worker never learnt of it."""
    from optuna.trial import TrialState

    me, failed, retry = worker_id(), [], _retry()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        orphan = (unmarked_before is not None and "worker" not in t.user_attrs and t.datetime_start is not None
                  and t.datetime_start <= unmarked_before)
        if t.user_attrs.get("worker") == me or orphan:
            try:
                if study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
                    retry(study, study._storage.get_trial(t._trial_id))
                    failed.append(t.number)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass                                # another worker's heartbeat check failed it first
    return failed


def _lost_schema_race(e: Exception) -> bool:
    """True when opening an RDB storage failed because another process created its tables (or stamped its schema
    version) between Optuna's check and its ``CREATE TABLE``: two processes opening one new SQLite file together
    fail this way (``table studies already exists``, ``UNIQUE constraint failed: alembic_version``, or SQLite's
    ``database is locked``; PostgreSQL's ``duplicate key value``, MySQL's ``Duplicate entry``), also where Optuna
    wrapped the database's error. Reopening then finds the finished schema."""
    msgs = []
    while e is not None and len(msgs) < 8:       # Optuna wraps some SQLAlchemy errors (StorageInternalError)
        msgs.append(str(e).lower())
        e = e.__cause__ or e.__context__
    return any(s in msg for msg in msgs for s in ("already exists", "unique constraint failed: alembic_version",
                                                   "database is locked", "duplicate key value", "duplicate entry"))


def _check_journal(path: Path) -> None:
    """A journal path must be absent, empty, or an Optuna journal (JSON lines with an ``op_code``): Optuna
    would append to any other file. Raises ``ValueError``."""
    import json

    if path.is_dir():
        raise ValueError(f"--storage {path} is a directory; give a journal file path or an RDB URL")
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        first = f.readline()
    try:
        ok = "op_code" in json.loads(first)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"--storage {path} exists and is not an Optuna journal, so it is left untouched; give a "
                         "new file path, an existing journal, or an RDB URL such as sqlite:///study.db")


def make_sampler(name: str, seed: int | None):
    """Optuna sampler by name (Optuna 5's multi-objective default is TPE; NSGA-II on request)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    raise ValueError(f"unknown Optuna sampler {name!r}; valid: {', '.join(OPTUNA_SAMPLERS)}")


def _retry():
    """Optuna's retry of a trial whose worker died: the same parameters, at most :data:`MAX_RETRY` times."""
    import warnings

    from optuna.storages import RetryHeartbeatStaleTrialCallback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def worker_id() -> str:
    """``host:pid`` of this process, recorded on every trial it runs (:func:`mark_worker`)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def mark_worker(trial: optuna.Trial) -> None:
    """Record the worker running ``trial`` (call first in every objective)."""
    trial.set_user_attr("worker", worker_id())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_stale_trials(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials of dead workers and enqueue their retries (see the module docstring); returns the
    numbers of the trials failed. Any storage: a trial of this host whose process is gone, at once; RDB storage
    also: Optuna's heartbeat check (trials of other hosts silent for the grace period)."""
    from optuna.storages._heartbeat import BaseHeartbeat
    from optuna.trial import TrialState

    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    host = socket.gethostname()
    retry = _retry()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        w = str(t.user_attrs.get("worker", ""))
        h, _, pid = w.rpartition(":")
        if h == host and pid.isdigit() and not _alive(int(pid)):
            if study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
                retry(study, study._storage.get_trial(t._trial_id))
    if isinstance(study._storage, BaseHeartbeat):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")         # marked experimental
            optuna.storages.fail_stale_trials(study)
    still = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    return sorted(running - still)


#: The study user attribute that records what its trials measure (:func:`check_study_identity`).
IDENTITY_ATTR = "workbench_measurement"


def check_study_identity(study: optuna.Study, ident: dict, record: bool = True) -> None:
    """Record ``ident`` (the settings and fingerprints that change what a trial measures) in a new study; refuse
    (one-line ``ValueError`` naming each setting that differs, with the study's value) to add trials to a study
    that measured something else, in the out_dir's own storage and in a shared ``--storage`` alike. A study with no
    finished (complete or pruned) trial yet takes this identity; one from before identities were recorded that has
    finished trials is refused. ``record=False``: check only, write nothing."""
    old = study.user_attrs.get(IDENTITY_ATTR)
    finished = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED))
    if old is None or not finished:             # nothing measured yet (only failed trials): this run's identity
        if old is None and finished:
            raise ValueError(f"study {study.study_name!r} holds {len(finished)} trials that do not record what "
                             "they measured (an older workbench): resume it with the workbench that started it, or "
                             "give a new --study name")
        if record:
            study.set_user_attr(IDENTITY_ATTR, ident)
        return
    diff = [k for k in sorted(set(old) | set(ident)) if old.get(k) != ident.get(k)]
    if diff:
        was = ", ".join(f"{k} {old.get(k)!r} (now {ident.get(k)!r})" for k in diff)
        raise ValueError(f"study {study.study_name!r} measured with {was}; its trials would mix with this run's: "
                         "rerun with the study's settings, or give a new --study name (or --out_dir)")


def check_existing_study(name: str, storage, ident: dict) -> None:
    """:func:`check_study_identity` on study ``name`` of ``storage`` (an opened storage) if it exists there;
    nothing is created or written."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:                            # no such study yet
        return
    check_study_identity(study, ident, record=False)


def open_study(name: str, storage: str | None, out_dir: Path, sampler: str = "tpe", seed: int | None = 0,
               heartbeat_interval: int = 30, grace_period: int | None = None, **kwargs) -> optuna.Study:
    """Create the study ``name`` in ``make_storage(storage, out_dir)`` or resume it (``load_if_exists``).

    The sampler's seed is ``seed + n``, where n is the number of trials already in the study. With a fixed
    seed alone, a resumed study would redraw the first trials' parameters (TPE's start-up trials are random
    draws from that seed) and add duplicate points to the front. ``seed = None`` draws from the OS. Workers
    started together on one storage should each get their own seed (or ``None``): they see the same ``n``.
    ``kwargs`` go to :func:`optuna.create_study` (``directions``, ``direction``, ``pruner``). A dead worker's
    RUNNING trial is failed and retried when the study is opened (:func:`recover_stale_trials`)."""
    study = optuna.create_study(study_name=name, storage=make_storage(storage, out_dir, heartbeat_interval, grace_period),
                                load_if_exists=True, **kwargs)
    recover_stale_trials(study)
    study.sampler = make_sampler(sampler, None if seed is None else seed + len(study.trials))
    return study
