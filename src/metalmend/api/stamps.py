"""Time stamps at the API edge: timezone-aware UTC datetimes inside, RFC 3339 strings in
the objects (status fields, annotations). One format for every controller, so that what
one writes another reads back exactly."""

from __future__ import annotations

import datetime as dt


def stamp(moment: dt.datetime) -> str:
    """RFC 3339 with microseconds, UTC: how times are written to status and annotations.
    (Microseconds, not the seconds of ``metav1.Time``: two steps within one second stay
    ordered.)"""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_stamp(text: str | None) -> dt.datetime | None:
    """A stamp read back (any RFC 3339 form Python parses, ``Z`` or an offset), in UTC;
    None for an absent or empty value."""
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(dt.UTC)
