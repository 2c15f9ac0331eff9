"""Which database errors are faults of the database (a 503) and what the log says of each
(metalmend.db.faults): never the host, database, user or path PostgreSQL's own messages
carry; anything else (a constraint, a bug in a query) is not a fault."""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors
import pytest
from sqlalchemy import exc

from metalmend.db.faults import fault_of

SECRETS = ("10.1.2.3", "5432", "bob", "sitedb", "/var/lib/metalmend")


def wrapped(kind: type[exc.DBAPIError], cause: Exception) -> exc.DBAPIError:
    return kind("SELECT 1", {}, cause)


def pg(sqlstate: str, text: str) -> Exception:
    error: Exception = psycopg.errors.lookup(sqlstate)(text)
    return error


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (wrapped(exc.OperationalError, sqlite3.OperationalError("unable to open database file")),
         "its SQLite file cannot be opened"),
        (wrapped(exc.OperationalError,
                 sqlite3.OperationalError("attempt to write a readonly database")),
         "its SQLite file is read-only"),
        (wrapped(exc.OperationalError, sqlite3.OperationalError("database is locked")),
         "stayed locked past the busy timeout"),
        (wrapped(exc.OperationalError, sqlite3.OperationalError("no such table: drydock_tasks")),
         "holds no metalmend store"),
        (wrapped(exc.DatabaseError, sqlite3.DatabaseError("file is not a database")),
         "is not a SQLite database"),
        (wrapped(exc.OperationalError, psycopg.OperationalError(
            'connection failed: connection to server at "10.1.2.3", port 5432 failed:'
            " Connection refused")),
         "cannot connect to the PostgreSQL server"),
        (wrapped(exc.OperationalError,
                 pg("28P01", 'password authentication failed for user "bob"')),
         "refused serve's credentials"),
        (wrapped(exc.OperationalError, pg("3D000", 'database "sitedb" does not exist')),
         "database named in serve.database_url does not exist"),
        (wrapped(exc.OperationalError, pg("57P01", "terminating connection")),
         "shutting down, restarting"),
        (wrapped(exc.InternalError, pg("25006", "cannot execute INSERT in a read-only"
                                                " transaction")),
         "accepts no writes"),
        (wrapped(exc.ProgrammingError, pg("42P01", 'relation "drydock_tasks" does not exist')),
         "holds no metalmend store"),
        (exc.TimeoutError("QueuePool limit"), "no database connection was free"),
    ],
)  # fmt: skip
def test_a_fault_of_the_database_says_what_to_check_without_connection_details(
    error: exc.SQLAlchemyError, says: str
) -> None:
    found = fault_of(error)
    assert found is not None
    assert says in found
    assert not [s for s in SECRETS if s in found], found


@pytest.mark.parametrize(
    "error",
    [
        wrapped(exc.IntegrityError, sqlite3.IntegrityError("UNIQUE constraint failed: x.y")),
        wrapped(exc.IntegrityError, pg("23505", "duplicate key value")),
        wrapped(exc.ProgrammingError, pg("42601", "syntax error at or near")),
        wrapped(exc.DataError, pg("22001", "value too long")),
        exc.ArgumentError("not a column"),
    ],
)
def test_what_is_not_the_databases_fault_stays_what_it_is(error: exc.SQLAlchemyError) -> None:
    assert fault_of(error) is None
