"""A throw-away PostgreSQL server on the loopback interface: what the tests and the sweep benchmark run studies on,
and a way to try a PostgreSQL sweep on one machine.

The server binaries come from the ``pgserver`` package (``pip install 'workbench[postgres-server]'``, part of the
``team`` extra), a wheel that bundles PostgreSQL 16 for Linux and macOS and needs no system package; where it is
missing, Debian's ``postgresql`` binaries (``/usr/lib/postgresql/<version>/bin``) or a ``pg_ctl`` on ``PATH`` are used.
``pgserver``'s own server object is not used: it trusts every local connection (no password, so a wrong password
could not be tested) and listens on a Unix socket only. :class:`LocalPostgres` runs ``initdb`` with a generated
password (SCRAM), listens on ``127.0.0.1`` at a free port, and can be stopped and started again on the same port
and data (the server-restart fault).

PostgreSQL refuses to run as root. Run as root (CI, containers), the server runs as the unprivileged ``nobody``
user: its data folder is handed to that user, and ``pgserver``'s binaries, which sit inside the virtual
environment where ``nobody`` may not reach them, are first copied to a world-readable folder under the temporary
directory (once per PostgreSQL version).
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server can be started here (no binaries, or the server failed to start): the reason, one
    line. Tests skip with it."""


def find_binaries() -> Path:
    """The folder holding ``initdb``, ``pg_ctl`` and ``postgres``: ``pgserver``'s bundle first, then Debian's
    newest ``/usr/lib/postgresql/<version>/bin``, then the folder of a ``pg_ctl`` on ``PATH``. Raises
    :class:`PostgresUnavailable` naming the pip extra when there is none."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")             # its folder only: importing it starts its machinery
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        if (bundled / "pg_ctl").exists():
            return bundled
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: _version_key(p.parent.parent.name))
    if debian:
        return debian[-1].parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresUnavailable("no PostgreSQL server binaries here: pip install 'workbench[postgres-server]' "
                              "(the pgserver wheel), or apt-get install postgresql")


def _version_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in name.split("."))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalPostgres:
    """A PostgreSQL server of its own data folder, on ``127.0.0.1:port`` with user ``workbench`` and a generated
    password. ``start()`` runs ``initdb`` the first time; ``stop()`` and ``start()`` again keep the data and
    the port. Use as a context manager (stopped and deleted at exit) or call :meth:`close`.

    ``fsync`` is off: a test server trades crash safety for speed (a crashed test server is thrown away)."""

    USER = "workbench"

    def __init__(self, root: str | Path | None = None, port: int | None = None):
        self.bin = find_binaries()
        self.password = secrets.token_hex(8)
        self.port = port or free_port()
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="workbench-pg-")) if root is None else Path(root)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._uid = self._gid = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:          # PostgreSQL refuses to run as root
            import pwd

            entry = pwd.getpwnam("nobody")
            self._uid, self._gid = entry.pw_uid, entry.pw_gid
            self.bin = _world_readable_copy(self.bin)
            os.chown(self.root, self._uid, self._gid)
            self.root.chmod(0o700)

    # ------------------------------------------------------------------------------------------ processes
    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        def demote():                                       # in the child, before exec: drop root
            os.setgid(self._gid)
            os.setuid(self._uid)

        return subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                              preexec_fn=demote if self._uid is not None else None, cwd=self.root,
                              env={**os.environ, "LC_ALL": "C"})

    def start(self) -> "LocalPostgres":
        """Start the server (``initdb`` first on a new data folder) and wait until it accepts connections.
        Raises :class:`PostgresUnavailable` with the server's last log line when it does not start."""
        if not (self.data / "PG_VERSION").exists():
            pw = self.root / "pwfile"
            pw.write_text(self.password + "\n")
            if self._uid is not None:
                os.chown(pw, self._uid, self._gid)
            r = self._run("initdb", "-D", str(self.data), "-U", self.USER, f"--pwfile={pw}", "--auth=scram-sha-256",
                          "-E", "UTF8", "--no-sync", "--no-instructions")
            pw.unlink()
            if r.returncode:
                raise PostgresUnavailable(f"initdb failed: {_last_line(r.stderr or r.stdout)}")
        opts = (f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB")
        r = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", opts, "start",
                      timeout=90)
        if r.returncode:
            log = self.log.read_text() if self.log.exists() else ""
            raise PostgresUnavailable(f"the PostgreSQL server did not start: {_last_line(log or r.stderr or r.stdout)}")
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode``: 'fast' disconnects clients, 'immediate' is a crash)."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def close(self) -> None:
        """Stop the server and delete its folder (one this object created)."""
        self.stop("immediate")
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ databases
    def url(self, database: str = "postgres", password: str | None = None) -> str:
        """The SQLAlchemy URL of ``database`` (``postgresql://workbench:<password>@127.0.0.1:<port>/<database>``)."""
        return f"postgresql://{self.USER}:{self.password if password is None else password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (letters, digits, underscores) and return its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: use letters, digits and underscores")
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as con:
                con.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def _world_readable_copy(bin_dir: Path) -> Path:
    """The installation of ``bin_dir`` copied once to a folder every user may read, under the temporary directory,
    so that an unprivileged user can run it; a system folder such as Debian's ``/usr/lib/postgresql/<version>/bin``
    is used where it is. ``pgserver``'s bundle (``pgserver/pginstall``) finds its shared libraries in the wheel's
    ``pgserver.libs`` folder by a relative path, so both are copied side by side."""
    if str(bin_dir).startswith("/usr/"):
        return bin_dir
    import hashlib

    install = bin_dir.parent
    if install.name == "pginstall" and install.parent.name == "pgserver":
        site = install.parent.parent
        parts = {Path("pgserver/pginstall"): install, Path("pgserver.libs"): site / "pgserver.libs"}
        rel_bin = Path("pgserver/pginstall/bin")
    else:
        parts, rel_bin = {Path("inst"): install}, Path("inst/bin")
    key = hashlib.sha256(str(install.resolve()).encode()).hexdigest()[:12]
    dest = Path(tempfile.gettempdir()) / f"workbench-pgbin-{key}"
    if not (dest / rel_bin / "pg_ctl").exists():
        tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
        for rel, src in parts.items():
            if src.is_dir():
                shutil.copytree(src, tmp / "copy" / rel, symlinks=True)
        for d, _, files in os.walk(tmp):
            os.chmod(d, 0o755)
            for f in files:
                p = os.path.join(d, f)
                if not os.path.islink(p):
                    mode = os.stat(p).st_mode
                    os.chmod(p, mode | 0o444 | (0o111 if mode & 0o100 else 0))
        try:
            os.rename(tmp / "copy", dest)                   # atomic: another process may be copying too
        except OSError:
            pass                                            # it won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / rel_bin


__all__ = ["LocalPostgres", "PostgresUnavailable", "find_binaries", "free_port"]
