"""A throwaway PostgreSQL for tests and benchmarks: one cluster on 127.0.0.1, started once
per test session from Debian's binaries (/usr/lib/postgresql/*/bin), a fresh database per
test, everything removed at the end.

The server refuses to run as root: as root the cluster belongs to the ``postgres`` system
user of Debian's package (created, as ``metalmend-pg``, when there is none) and its
commands run through ``runuser``; as anyone else, as that user. The cluster listens on
loopback only (no Unix socket) and asks a random password.

``make test`` installs Debian's ``postgresql`` where it is missing (Makefile ``tools``);
where that was impossible the PostgreSQL cases are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from metalmend_lab.controlplane import free_port

SUPERUSER = "metalmend"
SYSTEM_USER = "postgres"  # Debian's package creates it
FALLBACK_USER = "metalmend-pg"
# Test settings: a test database is thrown away, so durability only costs time. The
# benchmark starts the cluster with durable=True and measures what operators would get.
FAST = ("-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, or they cannot be run: the reason."""


def binaries() -> Path:
    """The newest /usr/lib/postgresql/N/bin holding initdb and pg_ctl."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found or not (found[-1] / "pg_ctl").exists():
        raise PostgresUnavailable(
            "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin"
            " (apt-get install postgresql, or `make tools` as root)"
        )
    return found[-1]


def _server_user() -> str | None:
    """Who runs the server: None for the current user, a system user when we are root."""
    if os.geteuid() != 0:
        return None
    for name in (SYSTEM_USER, FALLBACK_USER):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    try:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                FALLBACK_USER,
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        raise PostgresUnavailable(
            f"cannot create the system user {FALLBACK_USER}: {error}"
        ) from None
    return FALLBACK_USER


@dataclass
class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary directory; ``start()``, ``stop()``."""

    durable: bool = False
    port: int = field(default_factory=free_port)  # kept from the kernel's picks
    password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="metalmend-pg-")))
    user: str | None = field(default_factory=_server_user)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _run(self, argv: list[str]) -> None:
        command = argv if self.user is None else ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise PostgresUnavailable(f"{Path(argv[0]).name} failed: {' | '.join(detail)}")

    def start(self) -> None:
        bin_dir = binaries()
        # mkdtemp's 0700 directory: the server user must be able to enter it.
        os.chmod(self.root, 0o700)
        if self.user is not None:
            shutil.chown(self.root, self.user, self.user)
        secret = self.root / "pwfile"
        secret.write_text(self.password + "\n")
        secret.chmod(0o600)
        if self.user is not None:
            shutil.chown(secret, self.user, self.user)
        self._run([
            str(bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
            "--pwfile", str(secret), "--auth=scram-sha-256", "--encoding=UTF8",
            "--locale=C", "--no-sync",
        ])  # fmt: skip
        secret.unlink()
        self.resume()

    def resume(self) -> None:
        """Start the server (again, after ``pause``), on the same port and data."""
        options = [
            "-c listen_addresses=127.0.0.1", f"-p {self.port}", "-c unix_socket_directories=''",
            "-c max_connections=200", *(() if self.durable else FAST),
        ]  # fmt: skip
        self._run([
            str(binaries() / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", " ".join(options), "-w", "-t", "60", "start",
        ])  # fmt: skip

    def pause(self) -> None:
        """Stop the server, keeping its data (a database outage; ``resume`` ends it)."""
        self._run([str(binaries() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def stop(self) -> None:
        with contextlib.suppress(PostgresUnavailable, FileNotFoundError):
            self._run(
                [str(binaries() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            )
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A new empty database; its SQLAlchemy URL."""
        with psycopg.connect(self._dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a name we made: not caller input
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self._dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def database_size(self, name: str) -> int:
        with psycopg.connect(self._dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
        assert row is not None
        return int(row[0])

    def _dsn(self) -> str:
        return (
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} password={self.password}"
            " dbname=postgres"
        )


@contextlib.contextmanager
def running(durable: bool = False) -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres(durable=durable)
    try:
        server.start()
        yield server
    finally:
        server.stop()


# --- pytest fixtures (registered in tests/conftest.py) ---------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[ThrowawayPostgres | str]:
    """The session's cluster, or the reason there is none (its tests are skipped)."""
    try:
        server = ThrowawayPostgres()
    except PostgresUnavailable as error:
        yield str(error)
        return
    try:
        server.start()
    except (PostgresUnavailable, OSError) as error:
        server.stop()
        yield str(error)
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'metalmend.sqlite'}"
        return
    server = request.getfixturevalue("postgres_server")
    if isinstance(server, str):
        pytest.skip(f"PostgreSQL unavailable: {server}")
    name = f"test_{secrets.token_hex(6)}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)
