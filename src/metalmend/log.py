"""Structured logs: ``log.info("reconciled", extra=fields(controller=c, key=k))`` prints
``... reconciled controller=c key=k``, one line per record, values quoted when needed."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

# Fields every record logged in the current context carries (``bound``): e.g. the
# X-Context-Marker of the request ``metalmend serve`` is answering, on every line logged
# for it, whichever module logs it.
_bound: ContextVar[dict[str, Any] | None] = ContextVar("metalmend_log_bound", default=None)


def fields(**values: Any) -> dict[str, Any]:
    return {"fields": values}


@contextlib.contextmanager
def bound(**values: Any) -> Iterator[None]:
    """Every record logged inside the block (this task and the tasks it starts) carries
    ``values`` too, read when the record is made."""
    token = _bound.set({**(_bound.get() or {}), **values})
    try:
        yield
    finally:
        _bound.reset(token)


def _record_with_bound(factory: Any) -> Any:
    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record: logging.LogRecord = factory(*args, **kwargs)
        if (values := _bound.get()) is not None:
            record.bound_fields = values
        return record

    make.metalmend_bound = True  # type: ignore[attr-defined]
    return make


if not getattr(logging.getLogRecordFactory(), "metalmend_bound", False):
    logging.setLogRecordFactory(_record_with_bound(logging.getLogRecordFactory()))


def _value(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return json.dumps(text)
    return text


class FieldsFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}.{int(record.msecs):03d}"
            f" {record.levelname} {record.name}: {record.getMessage()}"
        )
        extra: dict[str, Any] = getattr(record, "bound_fields", {})
        extra = {**extra, **getattr(record, "fields", {})}
        if extra:
            line += " " + " ".join(f"{k}={_value(v)}" for k, v in extra.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FieldsFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO; that is noise for an operator.
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
