"""``Database``: an engine per URL, tuned per dialect so concurrent writers are safe.

SQLite: WAL (readers never wait for the writer), foreign keys on, a busy timeout (a
writer waits for another instead of failing), and every ``begin()`` is ``BEGIN
IMMEDIATE``: a transaction takes the write lock before its first read, so two writers
that both read "the newest revision" cannot both commit one after it (a deferred
transaction would fail with SQLITE_BUSY on its first write instead of waiting).
``read()`` is a plain deferred transaction for readers.

PostgreSQL: writers that must be serialized say so themselves (``lock``), with a
transaction-level advisory lock, which readers never wait for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, MetaData, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

# Constraint names fixed by convention, so a migration can name the constraint it drops
# on every database (SQLite and PostgreSQL name unnamed ones differently).
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)

SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY = "metalmend_read_only"
SUPPORTED = ("sqlite", "postgresql")


class DatabaseError(Exception):
    """The database cannot be opened or upgraded; the message says which and why (never
    the password of the URL)."""


class Database:
    """An open database. ``Database.open(url)``, then ``upgrade()`` once at start."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def where(self) -> str:
        """The URL without its password: what logs and errors may show."""
        return self.engine.url.render_as_string(hide_password=True)

    @classmethod
    def open(cls, url: str) -> Database:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise DatabaseError(f"{url[:80]!r} is not a database URL") from None
        if parsed.get_backend_name() not in SUPPORTED:
            raise DatabaseError(
                f"database URL scheme {parsed.drivername!r} is not supported: use"
                " sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"
            )
        if parsed.get_backend_name() == "sqlite":
            return cls(_sqlite(parsed.database))
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")  # the driver we ship
        try:
            return cls(create_engine(parsed, pool_pre_ping=True))
        except (SQLAlchemyError, ImportError) as error:
            raise DatabaseError(f"cannot open {parsed.render_as_string()}: {error}") from None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction: committed when the block ends, rolled back if it raises."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction (on SQLite: deferred, so it never waits for a writer)."""
        with self.engine.connect() as conn:
            conn.execution_options(**{_READ_ONLY: True})
            with conn.begin():
                yield conn

    def lock(self, conn: Connection, name: str) -> None:
        """Serialize the writers of ``name`` until ``conn``'s transaction ends. SQLite
        already is (``BEGIN IMMEDIATE``); PostgreSQL takes an advisory lock."""
        if self.dialect == "postgresql":
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    def upgrade(self) -> None:
        """Bring the schema to the newest migration (Alembic, programmatically)."""
        from metalmend.db.migrate import upgrade

        try:
            upgrade(self)
        except SQLAlchemyError as error:
            raise DatabaseError(f"cannot upgrade {self.where}: {_first_line(error)}") from None
        except OSError as error:
            raise DatabaseError(f"cannot upgrade {self.where}: {error}") from None

    def dispose(self) -> None:
        self.engine.dispose()


def _first_line(error: SQLAlchemyError) -> str:
    cause = getattr(error, "orig", None) or error
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__


def _sqlite(database: str | None) -> Engine:
    if not database or database == ":memory:":
        # Each connection would see its own empty database: nothing would be kept.
        raise DatabaseError("a SQLite database must be a file: sqlite:///PATH")
    path = Path(database).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DatabaseError(f"cannot create the directory of {path}: {error}") from None
    # NullPool: a connection per transaction; SQLite connections are cheap and a pooled one
    # would keep WAL readers open across requests.
    engine = create_engine(
        f"sqlite:///{path}",
        poolclass=NullPool,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )
    event.listen(engine, "connect", _sqlite_connected)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_connected(dbapi_connection: Any, record: Any) -> None:
    # The driver's own transaction handling off: "begin" below says how each one starts.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    read_only = conn.get_execution_options().get(_READ_ONLY, False)
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
