"""A real PostgreSQL server for the tests (``workbench.tune.pg_local``), started once per test process on the loopback
interface, with a fresh database per test. Import the fixtures into a test module:
``from pg_fixtures import pg_server, pg_url  # noqa: F401``.

A machine where no server can start (no ``pgserver`` wheel nor Debian package, no PostgreSQL driver, the server
fails) skips these tests with the reason. ``WORKBENCH_REQUIRE_POSTGRES=1`` (set by ``.ci/run``) turns that skip
into a failure, so that CI never reports them passed by skipping them."""
import itertools
import os

import pytest

_counter = itertools.count()


def _unavailable(reason: str):
    if os.environ.get("WORKBENCH_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"WORKBENCH_REQUIRE_POSTGRES=1 but no PostgreSQL server here: {reason}")
    pytest.skip(f"no PostgreSQL server here: {reason}")


@pytest.fixture(scope="session")
def pg_server():
    """The session's :class:`~workbench.tune.pg_local.LocalPostgres` (started; stopped and deleted at the end)."""
    import importlib.util

    if importlib.util.find_spec("psycopg") is None:
        _unavailable("the psycopg driver is not installed (pip install 'workbench[postgres]')")
    from workbench.tune.pg_local import LocalPostgres, PostgresUnavailable

    try:
        server = LocalPostgres().start()
    except PostgresUnavailable as e:
        _unavailable(str(e))
    yield server
    server.close()


@pytest.fixture
def pg_url(pg_server, request) -> str:
    """The URL of a new, empty database of :func:`pg_server` for this test."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40]
    return pg_server.create_database(f"t{os.getpid()}_{next(_counter)}_{name}")
