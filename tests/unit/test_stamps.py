"""Time stamps at the API edge (api/stamps.py): what one controller writes, another reads
back as the same instant."""

from __future__ import annotations

import datetime as dt

import pytest

from metalmend.api.stamps import parse_stamp, stamp


def test_a_stamp_is_utc_with_microseconds() -> None:
    moment = dt.datetime(2026, 11, 23, 16, 5, 7, 42, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert stamp(moment) == "2026-11-23T14:05:07.000042Z"


def test_a_stamp_reads_back_as_the_same_instant() -> None:
    moment = dt.datetime(2026, 11, 23, 14, 5, 7, 42, tzinfo=dt.UTC)
    assert parse_stamp(stamp(moment)) == moment


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param("", None, id="empty"),
        pytest.param(
            "2026-11-23T14:05:07Z",
            dt.datetime(2026, 11, 23, 14, 5, 7, tzinfo=dt.UTC),
            id="seconds Z",
        ),
        pytest.param(
            "2026-11-23T16:05:07+02:00",
            dt.datetime(2026, 11, 23, 14, 5, 7, tzinfo=dt.UTC),
            id="an offset is converted to UTC",
        ),
    ],
)
def test_parse_stamp(text: str | None, expected: dt.datetime | None) -> None:
    parsed = parse_stamp(text)
    assert parsed == expected
    assert parsed is None or parsed.tzinfo is dt.UTC
