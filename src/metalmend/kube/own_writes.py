"""Reading one's own writes before the cache has them.

A controller that writes an object and evaluates it again before its watch has brought
that write back reads the version its write replaced, and its next write, conditional on
that version, is refused as a conflict: one more evaluation for nothing. This happens
whenever evaluations follow each other closely and each holds the event loop long enough
that the watch event waits (a health check over thousands of Machines). ``OwnWrites``
remembers, per key, the object as last written and the version that write replaced, and
answers with it for as long as the cache still holds exactly that replaced version; once
the cache has anything else (our write, or a later change by anyone), the cache knows
best and the memory is dropped. No resourceVersion is ever compared for order (they are
opaque), only for equality.
"""

from __future__ import annotations

from typing import Any


class OwnWrites:
    def __init__(self) -> None:
        self._written: dict[str, tuple[str | None, Any]] = {}

    def __len__(self) -> int:
        """Keys remembered (0: every read is the cache's)."""
        return len(self._written)

    def wrote(self, key: str, replaced: Any, written: Any) -> None:
        """``written`` (the server's answer) replaced the object ``replaced`` under ``key``."""
        self._written[key] = (replaced.metadata.resourceVersion, written)

    def latest(self, key: str, cached: Any | None) -> Any | None:
        """What to read for ``key``: the object as we last wrote it while the cache
        (``cached``; None: gone) still holds the version that write replaced; else
        ``cached``."""
        replaced, written = self._written.pop(key, (None, None))
        if cached is None or written is None or cached.metadata.resourceVersion != replaced:
            return cached
        self._written[key] = (replaced, written)
        return written

    def retain(self, keys: set[str]) -> None:
        """Forget every key but ``keys`` (the objects still in the cache): an object
        deleted before its write came back is never asked for again."""
        for key in [k for k in self._written if k not in keys]:
            del self._written[key]
