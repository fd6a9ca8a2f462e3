"""What a study shares with the people watching it: the options every ``sweep`` command takes for a shared database
server and the dashboard, the study's labels, the ``optuna-dashboard`` line printed at the start of every sweep,
and the dashboard served on the loopback interface while a sweep runs (``--dashboard``).

The dashboard is `optuna-dashboard <https://optuna-dashboard.readthedocs.io>`_ (``pip install
'workbench[dashboard]'``), a WSGI application over the study's storage: it reads the same database the workers
write, so it shows the live study. The study's user attributes (:func:`label_study`) tell it what the trials
measure: the decoder, the block length(s), the model and the objective names.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import optuna

from .storage import shown_url

#: The pip extra that installs optuna-dashboard.
DASHBOARD_EXTRA = "dashboard"


@dataclass
class TeamOptions:
    """Options of every ``sweep`` command for a study shared by a team (a mixin of the sweep configs)."""

    reconnect_s: int = 60
    """Seconds a worker waits for a lost database server (PostgreSQL, MySQL) before it gives up with exit status 1;
    the study stays intact in the database for a rerun."""
    dashboard: int | None = None
    """Serve optuna-dashboard at http://127.0.0.1:<this port>/dashboard while the sweep runs (0: a free port; pip
    install 'workbench[dashboard]'). None: only print the optuna-dashboard command that serves the study."""

    def validate_team(self) -> None:
        """Raise ``ValueError`` (one line) for a bad option, or ``--dashboard`` without optuna-dashboard."""
        if self.reconnect_s < 0:
            raise ValueError(f"--reconnect_s must be ≥ 0, got {self.reconnect_s}")
        if self.dashboard is not None:
            if not 0 <= self.dashboard <= 65535:
                raise ValueError(f"--dashboard takes a port in 0…65535 (0: a free one), got {self.dashboard}")
            require_dashboard()


#: Settings of :class:`TeamOptions` a rerun may change (none changes what a trial measures).
TEAM_MAY_CHANGE = ("reconnect_s", "dashboard")


def require_dashboard() -> None:
    """Raise ``ValueError`` naming the pip extra when optuna-dashboard is not installed."""
    import importlib.util

    if importlib.util.find_spec("optuna_dashboard") is None:
        raise ValueError(f"--dashboard needs optuna-dashboard, which is not installed: pip install "
                         f"'workbench[{DASHBOARD_EXTRA}]' (or pip install optuna-dashboard)")


def label_study(study: optuna.Study, objectives: list[str], **labels) -> None:
    """Record what the study's trials measure as its user attributes, where the dashboard shows them:
    ``objectives`` (the metric names, also set as Optuna's metric names) and ``labels`` (decoder, block length,
    model, ...; JSON values)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # set_metric_names is marked experimental
        study.set_metric_names(list(objectives))
    for key, value in {"objectives": list(objectives), **labels}.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def dashboard_line(study_name: str, storage_url: str) -> str:
    """The line a sweep prints at its start: the ``optuna-dashboard`` command that serves the live study (the
    URL's password hidden as ``***``: type it back in)."""
    shown = shown_url(storage_url)
    quoted = f"'{shown}'" if any(c in shown for c in "*?&$ ") else shown
    return f"study {study_name}: watch it live with  optuna-dashboard {quoted}"


@contextmanager
def serve_dashboard(storage, port: int = 8080, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve optuna-dashboard on ``storage`` (a URL or an opened Optuna storage) at ``host:port`` from a background
    thread for the duration of the block; yields the dashboard's address (``http://host:port/dashboard``).
    ``port`` 0 takes a free port. Raises ``ValueError`` (one line) when optuna-dashboard is missing or the port is
    taken."""
    require_dashboard()
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from optuna_dashboard import wsgi

    class _Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class _QuietHandler(WSGIRequestHandler):
        def log_message(self, *args) -> None:        # no access log on the sweep's stderr
            pass

    try:
        httpd = make_server(host, port, wsgi(storage), server_class=_Server, handler_class=_QuietHandler)
    except OSError as e:
        raise ValueError(f"--dashboard {port}: cannot listen on {host}:{port} ({e.strerror}); give another "
                         "port, or 0 for a free one") from None
    thread = threading.Thread(target=httpd.serve_forever, name="optuna-dashboard", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{httpd.server_port}/dashboard"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@contextmanager
def watch_study(name: str, storage: str | None, out_dir, port: int | None = None) -> Iterator[None]:
    """What every sweep does around its workers: print the ``optuna-dashboard`` line of study ``name`` (``storage``
    as the sweep's ``--storage``: None is ``out_dir/optuna.db``) and, with a ``port``, serve the dashboard on
    ``127.0.0.1:port`` for the block (0: a free port)."""
    from pathlib import Path

    from .storage import make_storage

    url = storage or f"sqlite:///{(Path(out_dir) / 'optuna.db').resolve()}"
    print(dashboard_line(name, url), flush=True)
    if port is None:
        yield
        return
    with serve_dashboard(make_storage(storage, Path(out_dir)), port) as address:
        print(f"study {name}: dashboard at {address} while the workers run", flush=True)
        yield


__all__ = ["TeamOptions", "watch_study", "TEAM_MAY_CHANGE", "label_study", "dashboard_line", "serve_dashboard", "require_dashboard"]
