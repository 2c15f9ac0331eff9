"""When a candidate for a Lease tries again (kube/leader.py, ``next_try``): after its
retry period, or just past the held Lease's expiry on its own clock when that is sooner,
so that a dead holder's Lease is taken as soon as it may be, not up to a period later."""

from __future__ import annotations

import pytest

from metalmend.kube.leader import EXPIRY_SLACK, next_try


@pytest.mark.parametrize(
    ("period", "expires_in", "wait", "why"),
    [
        (2.0, None, 2.0, "the try failed otherwise (an API error): the period"),
        (2.0, 14.0, 2.0, "the Lease is renewed long after: the period (a renewal resets it)"),
        (2.0, 2.0, 2.0, "expiry at the period's end: the period"),
        (2.0, 0.7, 0.7 + EXPIRY_SLACK, "expiry within the period: just past it"),
        (2.4, 0.0, EXPIRY_SLACK, "expiring now: just past it"),
        (2.0, -0.3, EXPIRY_SLACK, "already expired (the try took a while): at once"),
    ],
)
def test_a_candidate_tries_again_after_its_period_or_just_past_the_expiry(
    period: float, expires_in: float | None, wait: float, why: str
) -> None:
    assert next_try(period, expires_in) == pytest.approx(wait), why


def test_never_later_than_the_period() -> None:
    for tenths in range(-10, 40):
        assert 0 < next_try(2.0, tenths / 10) <= 2.0
