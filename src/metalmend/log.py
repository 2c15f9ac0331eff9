"""Structured logs: ``log.info("reconciled", extra=fields(controller=c, key=k))`` prints
``... reconciled controller=c key=k``, one line per record, values quoted when needed."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


def fields(**values: Any) -> dict[str, Any]:
    return {"fields": values}


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
        extra: dict[str, Any] = getattr(record, "fields", {})
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
