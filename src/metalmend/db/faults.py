"""Which database errors mean "the database cannot serve now" (a 503, worth retrying), and
what to tell the operator about each: one line naming what to check, never the host,
database, user, password or path (PostgreSQL's own messages carry them; SQLite's do not).

Anything else (a constraint violated, a bug in a query) is not a fault of the database and
stays what it is. Pure: the error in, a sentence or None out.
"""

from __future__ import annotations

from sqlalchemy import exc

# SQLite's messages (sqlite3.Error's text), first words -> what to check.
SQLITE = (
    ("unable to open database file", "its SQLite file cannot be opened (removed, or its"
     " directory not writable): check the file named in the log at start (\"database ready\")"),
    ("attempt to write a readonly database", "its SQLite file is read-only: check the file's"
     " permissions and that its volume is mounted read-write"),
    ("database is locked", "its SQLite file stayed locked past the busy timeout: another"
     " process is writing it"),
    ("database or disk is full", "the disk of its SQLite file is full"),
    ("disk i/o error", "reading or writing its SQLite file failed (disk I/O error): check"
     " the volume"),
    ("no such table", "its SQLite file holds no metalmend store (replaced or emptied while"
     " metalmend serve ran?)"),
    ("file is not a database", "its SQLite file is not a SQLite database (replaced or"
     " corrupted)"),
    ("database disk image is malformed", "its SQLite file is corrupted"),
)  # fmt: skip

# PostgreSQL's SQLSTATE (exact, then its two-character class) -> what to check.
POSTGRES = {
    "3D000": "the PostgreSQL database named in serve.database_url does not exist",
    "42P01": "the PostgreSQL database holds no metalmend store (dropped or emptied while"
    " metalmend serve ran?)",
    "25006": "the PostgreSQL server accepts no writes (a read-only standby, or"
    " default_transaction_read_only)",
    "08": "cannot connect to the PostgreSQL server: check that it runs and that serve reaches it",
    "28": "the PostgreSQL server refused serve's credentials: check the user and password"
    " of serve.database_url",
    "57": "the PostgreSQL server is shutting down, restarting or cancelled the query",
    "53": "the PostgreSQL server is out of resources (connections, disk or memory)",
    "58": "the PostgreSQL server failed to read or write its files",
}
NO_SQLSTATE = POSTGRES["08"]

FAULTS = (exc.OperationalError, exc.InterfaceError, exc.InternalError, exc.TimeoutError)


def fault_of(error: exc.SQLAlchemyError) -> str | None:
    """What to check when ``error`` says the database cannot serve; None otherwise."""
    cause = getattr(error, "orig", None)
    sqlstate = getattr(cause, "sqlstate", None)
    schema_gone = isinstance(error, exc.ProgrammingError) and sqlstate == "42P01"
    if not (isinstance(error, FAULTS) or type(error) is exc.DatabaseError or schema_gone):
        return None
    if isinstance(error, exc.TimeoutError):
        return "no database connection was free in time (the pool is exhausted)"
    if cause is not None and type(cause).__module__.startswith("sqlite3"):
        return _sqlite(str(cause))
    if cause is not None and type(cause).__module__.startswith("psycopg"):
        return _postgres(sqlstate)
    return f"the database failed ({type(cause or error).__name__})"


def _sqlite(text: str) -> str:
    first = text.strip().splitlines()[0].lower() if text.strip() else ""
    for start, what in SQLITE:
        if first.startswith(start):
            return what
    # SQLite's messages name tables and columns, never the file: safe to show.
    return f"its SQLite file failed: {first[:200]}"


def _postgres(sqlstate: str | None) -> str:
    if not sqlstate:
        return NO_SQLSTATE
    found = POSTGRES.get(sqlstate) or POSTGRES.get(sqlstate[:2])
    return found or f"the PostgreSQL server failed (SQLSTATE {sqlstate})"
