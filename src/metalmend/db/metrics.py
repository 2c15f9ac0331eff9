"""The service database's metrics (docs/observability.md): transactions by operation
and outcome."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import Histogram
from sqlalchemy.exc import SQLAlchemyError

DATABASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

DATABASE_SECONDS = Histogram(
    "metalmend_serve_database_duration_seconds",
    "Database transactions of serve's stores, by operation (read, write) and outcome (ok;"
    " error: the database failed or could not be reached; aborted: our own code ended the"
    " transaction with an error, rolled back).",
    ["operation", "outcome"],
    buckets=DATABASE_BUCKETS,
)

# What alerts watch (docs/runbooks.md) exists from the start at 0: increase() sees the first.
for _operation in ("read", "write"):
    DATABASE_SECONDS.labels(_operation, "error")


@contextlib.contextmanager
def transaction(writing: bool) -> Iterator[None]:
    """Time one database transaction by its outcome."""
    started = time.monotonic()
    outcome = "ok"
    try:
        yield
    except SQLAlchemyError:
        outcome = "error"
        raise
    except BaseException:
        outcome = "aborted"
        raise
    finally:
        operation = "write" if writing else "read"
        DATABASE_SECONDS.labels(operation, outcome).observe(time.monotonic() - started)
