"""The one clock. Decisions receive ``now`` from it; nothing else reads the time of day."""

from __future__ import annotations

import datetime as dt
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime:
        """The current time, timezone-aware UTC."""
        ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


SYSTEM_CLOCK = SystemClock()
