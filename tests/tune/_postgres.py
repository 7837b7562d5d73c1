"""A throw-away PostgreSQL server for the tests: `postgres_server` (one per module) and `postgres_url`
(a new, empty database on it for each test).

The server lives in a temporary folder: initdb there, listening on a unix socket in that folder
only (``listen_addresses=''``: no TCP), trust authentication, no fsync. initdb refuses to run as
root, so as root the server runs as the ``postgres`` system user (``runuser``). It is stopped
(``pg_ctl stop -m immediate``) and its folder removed at the end. The tests are skipped, with
the reason, where the PostgreSQL 15 binaries, the ``postgres`` user or psycopg are missing.
"""
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from typing import Iterator, List, NamedTuple, Optional

import pytest

#: where Debian's postgresql-15 package puts its programs (else they are looked up on PATH)
PG_BIN_DIRS = ("/usr/lib/postgresql/15/bin",)
_database_numbers = itertools.count()


class PostgresServer(NamedTuple):
    """A running server: its socket folder and port (the socket is ``<folder>/.s.PGSQL.<port>``)."""

    socket_dir: str
    port: int

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server (psycopg 3, unix socket)."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}&port={self.port}"


def find_pg_bin() -> Optional[str]:
    """The folder holding initdb and pg_ctl, or None."""
    for folder in PG_BIN_DIRS:
        if all(os.access(os.path.join(folder, p), os.X_OK) for p in ("initdb", "pg_ctl")):
            return folder
    initdb = shutil.which("initdb")
    if initdb:
        folder = os.path.dirname(os.path.realpath(initdb))
        if os.access(os.path.join(folder, "pg_ctl"), os.X_OK):
            return folder
    return None


def _as_server_user() -> List[str]:
    """The command prefix that runs a program as the server's user: ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root, and no runuser to start PostgreSQL as the postgres user")
    return [runuser, "-u", "postgres", "--"]


def _free_port() -> int:
    """A port number nobody listens on (it only names the socket file; the server opens no TCP port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _skip_reason() -> Optional[str]:
    try:
        import psycopg  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError:
        return "psycopg 3 and SQLAlchemy are needed for the PostgreSQL tests (pip install 'reid_engine[tune]')"
    if find_pg_bin() is None:
        return f"no PostgreSQL binaries (initdb, pg_ctl) in {', '.join(PG_BIN_DIRS)} or on PATH"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    return None


def start_postgres(folder: str) -> PostgresServer:
    """Create a cluster in `folder` and start its server (socket in `folder`); the caller stops it."""
    bin_dir = find_pg_bin()
    prefix = _as_server_user()
    if prefix:  # the server's user must own its folders
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    data = os.path.join(folder, "data")

    def run(*cmd: str) -> None:
        result = subprocess.run(prefix + list(cmd), capture_output=True, text=True, timeout=120, cwd=folder)
        if result.returncode != 0:
            log = os.path.join(folder, "server.log")
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n{tail}")

    run(os.path.join(bin_dir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync",
        "--no-instructions")
    port = _free_port()
    options = (f"-c listen_addresses='' -k {folder} -p {port} -c fsync=off -c synchronous_commit=off "
               "-c full_page_writes=off -c shared_buffers=16MB -c max_connections=60")
    run(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-o", options, "-l", os.path.join(folder, "server.log"),
        "-w", "-t", "60", "start")
    return PostgresServer(folder, port)


def stop_postgres(folder: str) -> None:
    """Stop the server of `folder` at once (its data is thrown away)."""
    subprocess.run(_as_server_user() + [os.path.join(find_pg_bin(), "pg_ctl"), "-D", os.path.join(folder, "data"),
                                        "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL 15 server for the tests of a module (skipped where it cannot run)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    folder = tempfile.mkdtemp(prefix="reid-pg-")  # under /tmp: the postgres user can reach it
    os.chmod(folder, 0o700)
    try:
        server = start_postgres(folder)
        try:
            yield server
        finally:
            stop_postgres(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL of a new, empty database on the module's server."""
    import psycopg

    database = f"test_{os.getpid()}_{next(_database_numbers)}"
    with psycopg.connect(host=postgres_server.socket_dir, port=postgres_server.port, user="postgres",
                         dbname="postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    return postgres_server.url(database)
