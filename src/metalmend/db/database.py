"""``Database``: an engine per URL, tuned per dialect so concurrent writers are safe.

SQLite: WAL (readers never wait for the writer), foreign keys on, a busy timeout (a
writer waits for another instead of failing), and every ``begin()`` is ``BEGIN
IMMEDIATE``: a transaction takes the write lock before its first read, so two writers
that both read "the newest revision" cannot both commit one after it (a deferred
transaction would fail with SQLITE_BUSY on its first write instead of waiting).
``read()`` is a plain deferred transaction for readers.

PostgreSQL: writers that must be serialized say so themselves (``lock``), with a
transaction-level advisory lock, which readers never wait for.

Faults: every transaction goes through ``begin()`` or ``read()``, which turn what says the
database cannot serve (down, unreachable, read-only, its file gone, locked past the busy
timeout, its tables gone) into ``DatabaseUnavailable``, whose message callers may see (no
host, database, user or path in it). The cause is logged once per outage, at warning
level without connection details, and the end of the outage once. Once the store this
process serves is known (``expect``), each transaction checks now and then that the
database still holds it (``metalmend.db.identity``), and refuses with ``StoreReplaced``
when it holds another.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from metalmend.db import faults, metrics
from metalmend.db.identity import read_identity
from metalmend.db.migrate import upgrade
from metalmend.db.schema import NAMING as NAMING
from metalmend.db.schema import metadata as metadata

log = logging.getLogger(__name__)


SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY = "metalmend_read_only"
SUPPORTED = ("sqlite", "postgresql")


# How often a transaction checks that the database still holds the store this process
# serves (one primary-key read): a file swapped under a running service is seen within it.
IDENTITY_CHECK_SECONDS = 10.0
SQLITE_FILE_MODE = 0o600  # the store holds who did what to which server: its owner's only
UNAVAILABLE = (
    "the service's database is unavailable; try again later (metalmend serve's log says"
    " why: the database server down or unreachable, or its file removed or read-only)"
)


class DatabaseError(Exception):
    """The database cannot be opened or upgraded; the message says which and why (never
    the password of the URL)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot serve now. ``message`` is what a caller may see: one line,
    without the database's host, name, user or path (those are in the log at start)."""

    def __init__(self, message: str = UNAVAILABLE) -> None:
        super().__init__(message)
        self.message = message


class StoreReplaced(DatabaseUnavailable):
    """The database holds another store than the one this process started with (a file
    removed and created again, another database behind the URL): nothing is read or
    written until an operator restarts the service and confirms (docs/design-store.md)."""


class Database:
    """An open database. ``Database.open(url)``, then ``upgrade()`` once at start."""

    def __init__(self, engine: Engine, where: str | None = None) -> None:
        self.engine = engine
        self._where = where
        self._outage: str | None = None  # why the database is unavailable, logged once
        self._outage_lock = threading.Lock()
        self._outage_of_writes = False  # seen by a write: only a write ends it
        self._expected: str | None = None  # the store served (``expect``)
        self._replaced: str | None = None  # why it is not the one served any more
        self._next_check = 0.0
        self.created: Path | None = None  # the SQLite file this open created (it was missing)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def where(self) -> str:
        """The URL without its password: what the log at start and the command line's
        errors may show (never a caller: docs/security.md)."""
        return self._where or self.engine.url.render_as_string(hide_password=True)

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
            engine, created = _sqlite(parsed.database)
            database = cls(engine, f"sqlite:///{parsed.database}")
            database.created = created
            return database
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")  # the driver we ship
        try:
            return cls(create_engine(parsed, pool_pre_ping=True))
        except (SQLAlchemyError, ImportError) as error:
            raise DatabaseError(f"cannot open {parsed.render_as_string()}: {error}") from None

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A write transaction: committed when the block ends, rolled back if it raises.
        DatabaseUnavailable when the database cannot serve (``faults``)."""
        with self._guarded(writing=True), self.engine.begin() as conn:
            self._check_store(conn)
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction (on SQLite: deferred, so it never waits for a writer)."""
        with self._guarded(writing=False), self.engine.connect() as conn:
            conn.execution_options(**{_READ_ONLY: True})
            with conn.begin():
                self._check_store(conn)
                yield conn

    # ---- faults and the store's identity --------------------------------------------------

    def expect(self, store_id: str) -> None:
        """From now on, refuse to work on any other store than ``store_id``."""
        self._expected, self._replaced, self._next_check = store_id, None, 0.0

    @property
    def outage(self) -> str | None:
        """Why the database is unavailable now (None: it answered last time)."""
        return self._replaced or self._outage

    def _check_store(self, conn: Connection) -> None:
        if self._expected is None or time.monotonic() < self._next_check:
            if self._replaced:
                raise StoreReplaced(self._replaced)
            return
        found = read_identity(conn)
        self._next_check = time.monotonic() + IDENTITY_CHECK_SECONDS
        if found is not None and found.id == self._expected:
            if self._replaced is not None:
                log.warning("the service's database holds store %s again", self._expected)
            self._replaced = None
            return
        held = f"store {found.id}" if found is not None else "no metalmend store"
        first = self._replaced is None
        self._replaced = (
            f"the service's database now holds {held}, not store {self._expected} it"
            " served: it was replaced while metalmend serve ran; nothing is read or written"
            " until an operator restarts metalmend serve and confirms which store it serves"
            ' (docs/design-store.md, "When the store is replaced")'
        )
        if first:
            log.error("%s", self._replaced)
        raise StoreReplaced(self._replaced)

    @contextmanager
    def _guarded(self, writing: bool) -> Iterator[None]:
        try:
            with metrics.transaction(writing):
                yield
        except SQLAlchemyError as error:
            why = faults.fault_of(error)
            if why is None:
                raise
            self._down(why, writing)
            raise DatabaseUnavailable() from None
        else:
            # A read that worked does not end an outage seen by a write (a read-only file
            # is still read): only a write does.
            if writing or not self._outage_of_writes:
                self._up()

    def _down(self, why: str, writing: bool) -> None:
        with self._outage_lock:
            first = self._outage is None
            self._outage = why
            if first:
                self._outage_of_writes = writing
        if first:
            log.warning("the service's database is unavailable: %s", why)
        else:
            log.debug("the service's database is still unavailable: %s", why)

    def _up(self) -> None:
        if self._outage is None:
            return
        with self._outage_lock:
            was, self._outage = self._outage, None
        if was is not None:
            log.info("the service's database is available again")

    def lock(self, conn: Connection, name: str) -> None:
        """Serialize the writers of ``name`` until ``conn``'s transaction ends. SQLite
        already is (``BEGIN IMMEDIATE``); PostgreSQL takes an advisory lock."""
        if self.dialect == "postgresql":
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    def upgrade(self) -> None:
        """Bring the schema to the newest migration (Alembic, programmatically)."""
        try:
            upgrade(self)
        except DatabaseUnavailable:
            raise DatabaseError(f"cannot upgrade {self.where}: {self.outage}") from None
        except SQLAlchemyError as error:
            raise DatabaseError(f"cannot upgrade {self.where}: {_first_line(error)}") from None
        except OSError as error:
            raise DatabaseError(f"cannot upgrade {self.where}: {error}") from None

    def dispose(self) -> None:
        self.engine.dispose()

    def discard(self) -> None:
        """Closed, and the SQLite file removed if this open created it (with its WAL
        files): a start that refuses leaves no new empty store behind."""
        self.dispose()
        if self.created is not None:
            for suffix in ("", "-wal", "-shm", "-journal"):
                self.created.with_name(self.created.name + suffix).unlink(missing_ok=True)


def _first_line(error: SQLAlchemyError) -> str:
    cause = getattr(error, "orig", None) or error
    return str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__


def _sqlite(database: str | None) -> tuple[Engine, Path | None]:
    """The engine, and the file's path when this call created it."""
    if not database or database == ":memory:":
        # Each connection would see its own empty database: nothing would be kept.
        raise DatabaseError("a SQLite database must be a file: sqlite:///PATH")
    path = Path(database).expanduser().absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DatabaseError(f"cannot create the directory of {path}: {error}") from None
    created = None if path.exists() else path
    create_private(path)
    # The file is created here and only here: every connection opens it read-write, never
    # creating it, so a file removed while serve runs is a fault (503), not a new empty
    # store written as if nothing had happened.
    where = urllib.parse.quote(str(path))
    # NullPool: a connection per transaction; SQLite connections are cheap and a pooled one
    # would keep WAL readers open across requests.
    engine = create_engine(
        f"sqlite:///file:{where}?mode=rw&uri=true",
        poolclass=NullPool,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )
    event.listen(engine, "connect", _sqlite_connected)
    event.listen(engine, "begin", _sqlite_begin)
    return engine, created


def create_private(path: Path) -> None:
    """The SQLite file, created if missing; it and its WAL files readable by their owner
    only (SQLite gives the -wal and -shm files the mode of the database file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, SQLITE_FILE_MODE)
    except OSError as error:
        raise DatabaseError(f"cannot create or open {path}: {error.strerror}") from None
    try:
        os.fchmod(fd, SQLITE_FILE_MODE)
    except OSError as error:
        raise DatabaseError(f"cannot make {path} private (0600): {error.strerror}") from None
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        companion = path.with_name(path.name + suffix)
        try:
            companion.chmod(SQLITE_FILE_MODE)
        except FileNotFoundError:
            continue
        except OSError as error:
            raise DatabaseError(f"cannot make {companion} private: {error.strerror}") from None


def _sqlite_connected(dbapi_connection: Any, record: Any) -> None:
    # The driver's own transaction handling off: "begin" below says how each one starts.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _into_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _into_wal(cursor: Any) -> None:
    """Switch the file to WAL (once set, it stays: later connections only read it).

    Replicas opening a new file together all find it in rollback mode and all try the
    switch, which needs the exclusive lock: SQLite answers "database is locked" at once to
    all but one, without waiting on the busy timeout (waiting would deadlock two readers
    that both want to write). The losers try again, for as long as the busy timeout, and
    then find the file in WAL already."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    pause = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _sqlite_begin(conn: Connection) -> None:
    read_only = conn.get_execution_options().get(_READ_ONLY, False)
    conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")
