"""Idle power polls spread over the interval (policy.hostpower.spread_poll): hosts created
or reconciled together must not read their BMCs in step (benchmarks/scale.py), and each
host still reads its BMC once per interval."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metalmend.api.power import PowerAction, PowerState
from metalmend.policy.hostpower import (
    POLL_EVERY_MAX,
    POLL_EVERY_MIN,
    POLL_GRID_MAX,
    POLL_SPREAD_MIN,
    Host,
    LastCommand,
    PowerSettings,
    PowerStatus,
    decide,
    poll_every,
    poll_grid,
    poll_phase,
    spread_poll,
)

INTERVAL = 20.0
# A whole number of intervals since the epoch: offsets in the interval read plainly.
EPOCH_SLOT = dt.datetime.fromtimestamp(1_800_000_000, dt.UTC)
SETTINGS = PowerSettings(poll_interval=INTERVAL, transition_poll=1.0)
IDLE = Host(
    online=True, provisioning_state="provisioned", externally_provisioned=False,
    annotations={}, power=PowerState.ON,
    status=PowerStatus(powered_on=True, last_powered_on=EPOCH_SLOT),
)  # fmt: skip


def at(seconds: float) -> dt.datetime:
    return EPOCH_SLOT + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("now", "phase", "wait"),
    [
        pytest.param(0.0, 0.5, 10.0, id="the host's slot this interval, far enough ahead"),
        pytest.param(0.0, 0.0, 20.0, id="on its slot now: the same slot one interval on"),
        pytest.param(8.0, 0.5, 22.0, id="its slot 2 s away is too soon: the next one"),
        pytest.param(5.0, 0.5, 5.0, id="exactly a quarter interval ahead is kept"),
        pytest.param(19.9, 0.0, 20.1, id="just before its slot: skipped, the one after"),
        pytest.param(10.05, 0.5, 19.95, id="read a little late: back on its slot"),
    ],
)
def test_next_idle_poll_is_the_hosts_own_slot(now: float, phase: float, wait: float) -> None:
    got = (spread_poll(at(now), INTERVAL, phase) - at(now)).total_seconds()
    assert got == pytest.approx(wait)


@pytest.mark.parametrize("grid", [0.0, 0.25], ids=["alone", "on a grid of 0.25 s"])
@pytest.mark.parametrize("phase", [0.0, 0.13, 0.5, 0.5124, 0.99])
def test_once_on_its_slot_a_host_polls_exactly_once_per_interval(phase: float, grid: float) -> None:
    polls = [spread_poll(at(3.7), INTERVAL, phase, grid)]
    for _ in range(5):
        polls.append(spread_poll(polls[-1], INTERVAL, phase, grid))
    gaps = {round((b - a).total_seconds(), 6) for a, b in itertools.pairwise(polls[1:])}
    assert gaps == {INTERVAL}


def test_the_wait_stays_within_a_quarter_and_one_and_a_quarter_intervals() -> None:
    for step in range(400):
        now = at(step * 0.37)
        for phase in (0.0, 0.21, 0.5, 0.77, 0.999):
            wait = (spread_poll(now, INTERVAL, phase) - now).total_seconds()
            assert POLL_SPREAD_MIN * INTERVAL <= wait < (1 + POLL_SPREAD_MIN) * INTERVAL + 1e-6


def test_five_thousand_hosts_reconciled_at_once_poll_evenly() -> None:
    """All reconciled in the same instant: their next polls fill every second of the
    interval about equally (without the spread: all 5,000 in one second)."""
    keys = [f"metalmend-lab/worker-{i}" for i in range(5000)]
    seconds = Counter(
        int((spread_poll(at(0.5), INTERVAL, poll_phase(k)) - at(0.5)).total_seconds()) % 20
        for k in keys
    )
    assert len(seconds) == 20
    assert max(seconds.values()) < 1.3 * 5000 / 20
    assert min(seconds.values()) > 0.7 * 5000 / 20


def test_a_hosts_phase_is_stable_and_in_range() -> None:
    assert poll_phase("ns/a") == poll_phase("ns/a")
    assert poll_phase("ns/a") != poll_phase("ns/b")
    assert all(0.0 <= poll_phase(f"ns/h{i}") < 1.0 for i in range(1000))


def test_decide_spreads_the_idle_poll_only() -> None:
    now = at(0.0)
    spread = decide(dataclasses.replace(IDLE, poll_phase=0.5), now, SETTINGS)
    assert spread.requeue_at == at(10.0)
    plain = decide(IDLE, now, SETTINGS)  # no phase: as before
    assert plain.requeue_at == at(INTERVAL)
    # A power-on sent and not yet seen: the transition poll, not the host's slot.
    landing = dataclasses.replace(
        IDLE, power=PowerState.OFF, poll_phase=0.5,
        status=PowerStatus(powered_on=False, last_powered_on=at(-100),
                           last_command=LastCommand(PowerAction.ON, at(-0.5))),
    )  # fmt: skip
    decision = decide(landing, now, SETTINGS)
    assert decision.requeue_at is not None
    assert (decision.requeue_at - now).total_seconds() <= SETTINGS.transition_poll


@pytest.mark.parametrize(
    ("interval", "budget", "hosts", "every"),
    [
        pytest.param(20.0, 150.0, 1, 20.0, id="one host: the interval"),
        pytest.param(20.0, 150.0, 3000, 20.0, id="exactly the budget: the interval"),
        pytest.param(20.0, 150.0, 3001, 21.0, id="one more: a whole second longer"),
        pytest.param(20.0, 150.0, 5000, 34.0, id="5,000 hosts: 33.3 s, rounded up"),
        pytest.param(20.0, 0.0, 5000, 20.0, id="no budget: the interval at any size"),
        pytest.param(60.0, 150.0, 5000, 60.0, id="a longer interval within the budget"),
        pytest.param(20.0, 0.1, 3, 30.0, id="a small budget"),
        # Below the settings' ranges (policy does not rely on them): never past an hour,
        # never an overflow (issue 36: 1e-300 raised OverflowError in every reconcile).
        pytest.param(20.0, 0.001, 3, 3000.0, id="0.001: 3,000 s (the loader refuses it)"),
        pytest.param(20.0, 0.001, 30, POLL_EVERY_MAX, id="0.001: an hour, not 30,000 s"),
        pytest.param(20.0, 1e-300, 3, POLL_EVERY_MAX, id="1e-300: an hour, no overflow"),
        pytest.param(20.0, 5e-324, 10**9, POLL_EVERY_MAX, id="the smallest float"),
        pytest.param(20.0, 1.0, 10**6, POLL_EVERY_MAX, id="a million hosts at 1 a second"),
        pytest.param(20.0, float("nan"), 5000, 20.0, id="nan budget: no limit"),
        pytest.param(20.0, float("inf"), 5000, 20.0, id="infinite budget: no limit"),
        pytest.param(20.0, -5.0, 5000, 20.0, id="negative budget: no limit"),
        pytest.param(1e300, 150.0, 5, POLL_EVERY_MAX, id="a huge interval: an hour"),
        pytest.param(float("nan"), 150.0, 5, POLL_EVERY_MAX, id="nan interval: an hour"),
        pytest.param(0.0, 150.0, 0, POLL_EVERY_MIN, id="zero interval: the shortest"),
    ],
)
def test_the_poll_budget_stretches_the_idle_interval(
    interval: float, budget: float, hosts: int, every: float
) -> None:
    settings = PowerSettings(poll_interval=interval, poll_budget=budget)
    assert poll_every(settings, hosts) == every


def test_five_thousand_hosts_within_the_budget_read_at_most_budget_bmcs_a_second() -> None:
    """The stretched interval keeps the spread: about 150 reads in every second of it,
    not 250 (the cost of a read is a TLS connection: docs/scale.md, fix 14)."""
    settings = PowerSettings(poll_interval=INTERVAL, poll_budget=150.0)
    keys = [f"metalmend-lab/worker-{i}" for i in range(5000)]
    every = poll_every(settings, len(keys))
    start = at(0.5)
    seconds = Counter(
        int((spread_poll(start, every, poll_phase(k)) - at(0)).total_seconds()) % int(every)
        for k in keys
    )
    assert len(seconds) == every
    assert max(seconds.values()) < 1.3 * 150
    assert sum(seconds.values()) / every <= 150


def test_decide_spreads_the_idle_poll_over_the_budgeted_interval() -> None:
    host = dataclasses.replace(IDLE, poll_phase=0.5, poll_every=34.0)
    slot = decide(host, at(0.0), SETTINGS).requeue_at
    assert slot == spread_poll(at(0.0), 34.0, 0.5)  # its slot of a 34 s interval
    assert slot != spread_poll(at(0.0), INTERVAL, 0.5)
    # A power change landing is read on its own schedule, budget or not.
    landing = dataclasses.replace(
        host, power=PowerState.OFF,
        status=PowerStatus(powered_on=False, last_powered_on=at(-100),
                           last_command=LastCommand(PowerAction.ON, at(-0.5))),
    )  # fmt: skip
    decision = decide(landing, at(0.0), SETTINGS)
    assert decision.requeue_at is not None
    assert (decision.requeue_at - at(0.0)).total_seconds() <= SETTINGS.transition_poll


# ---- extreme inputs: spread_poll and poll_every are total (issue 36) -------------------

EXTREME_FLOATS = [0.0, -0.0, 5e-324, 1e-300, 1e-9, 0.001, 1.0, 20.0, 3600.0, 3601.0, 1e9,
                  1e300, 1.7976931348623157e308, -1.0, -1e300, float("inf"), float("-inf"),
                  float("nan")]  # fmt: skip
FAR_MOMENTS = [
    dt.datetime.min.replace(tzinfo=dt.UTC),
    dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    EPOCH_SLOT,
    dt.datetime.max.replace(tzinfo=dt.UTC) - dt.timedelta(hours=2),
    dt.datetime.max.replace(tzinfo=dt.UTC),
]


def assert_a_sane_slot(
    now: dt.datetime, interval: float, phase: float, grid: float = 0.0, shift: float = 0.0
) -> None:
    slot = spread_poll(now, interval, phase, grid, shift)
    ahead = (slot - now).total_seconds()
    if slot == dt.datetime.max.replace(tzinfo=dt.UTC):  # no later moment to give
        assert 0 <= ahead <= (1 + POLL_SPREAD_MIN) * POLL_EVERY_MAX
        return
    bounded = (
        min(max(interval, POLL_EVERY_MIN), POLL_EVERY_MAX)
        if interval == interval
        else POLL_EVERY_MAX
    )
    # a microsecond of slack: a datetime holds whole microseconds
    assert POLL_SPREAD_MIN * bounded - 1e-6 <= ahead <= (1 + POLL_SPREAD_MIN) * bounded + 1e-6


@pytest.mark.parametrize("now", FAR_MOMENTS, ids=str)
@pytest.mark.parametrize("interval", EXTREME_FLOATS, ids=repr)
@pytest.mark.parametrize(
    "phase", [0.0, 0.5, 0.999999, 1.0, 7.25, -0.25, 1e300, float("nan"), float("inf")], ids=repr
)
def test_spread_poll_never_raises_and_stays_within_its_bounds(
    now: dt.datetime, interval: float, phase: float
) -> None:
    assert_a_sane_slot(now, interval, phase)


@given(
    now=st.datetimes(timezones=st.just(dt.UTC)),
    interval=st.floats(allow_nan=True, allow_infinity=True),
    phase=st.floats(allow_nan=True, allow_infinity=True),
)
def test_spread_poll_is_total(now: dt.datetime, interval: float, phase: float) -> None:
    assert_a_sane_slot(now, interval, phase)


@given(
    now=st.datetimes(timezones=st.just(dt.UTC)),
    interval=st.floats(allow_nan=True, allow_infinity=True),
    phase=st.floats(allow_nan=True, allow_infinity=True),
    grid=st.floats(allow_nan=True, allow_infinity=True),
    shift=st.floats(allow_nan=True, allow_infinity=True),
)
def test_spread_poll_on_a_grid_is_total(
    now: dt.datetime, interval: float, phase: float, grid: float, shift: float
) -> None:
    assert_a_sane_slot(now, interval, phase, grid, shift)


@given(
    interval=st.floats(allow_nan=True, allow_infinity=True),
    batch=st.floats(allow_nan=True, allow_infinity=True),
    hosts=st.integers(min_value=-5, max_value=10**12),
)
def test_poll_grid_is_total(interval: float, batch: float, hosts: int) -> None:
    grid = poll_grid(PowerSettings(poll_batch=batch), hosts, interval)
    assert 0.0 <= grid <= POLL_GRID_MAX
    bounded = (
        min(max(interval, POLL_EVERY_MIN), POLL_EVERY_MAX)
        if interval == interval
        else POLL_EVERY_MAX
    )
    assert grid == 0.0 or grid <= bounded / 16


@given(
    interval=st.floats(allow_nan=True, allow_infinity=True),
    budget=st.floats(allow_nan=True, allow_infinity=True),
    hosts=st.integers(min_value=0, max_value=10**12),
)
def test_poll_every_is_total(interval: float, budget: float, hosts: int) -> None:
    every = poll_every(PowerSettings(poll_interval=interval, poll_budget=budget), hosts)
    assert POLL_EVERY_MIN <= every <= POLL_EVERY_MAX


def test_decide_with_a_budget_of_1e_300_requeues_within_the_hour() -> None:
    """The probe's setting, past the loader: the reconcile still decides (no
    OverflowError) and reads the host again within POLL_EVERY_MAX."""
    settings = PowerSettings(poll_interval=INTERVAL, poll_budget=1e-300)
    host = dataclasses.replace(IDLE, poll_phase=0.5, poll_every=poll_every(settings, 3))
    decision = decide(host, at(0.0), settings)
    assert decision.requeue_at is not None
    assert (decision.requeue_at - at(0.0)).total_seconds() <= (1 + POLL_SPREAD_MIN) * POLL_EVERY_MAX


# ---- idle polls in batches (poll_grid): the same reads, fewer wake-ups ------------------


@pytest.mark.parametrize(
    ("batch", "hosts", "every", "grid"),
    [
        pytest.param(16.0, 5000, 20.0, 0.0625, id="5,000 hosts: 250 a second, 15.6 a batch"),
        pytest.param(16.0, 1250, 20.0, 0.25, id="1,250 hosts (one of 4 replicas): 0.25 s"),
        pytest.param(16.0, 1281, 20.0, 0.125, id="past 1,280: the next power of two down"),
        pytest.param(16.0, 625, 20.0, 0.5, id="625 hosts: 0.5 s"),
        pytest.param(16.0, 312, 20.0, POLL_GRID_MAX, id="fewer: never past a second"),
        pytest.param(16.0, 1, 20.0, POLL_GRID_MAX, id="one host: a second"),
        pytest.param(16.0, 0, 20.0, POLL_GRID_MAX, id="no host yet: as one"),
        pytest.param(16.0, 5000, 34.0, 0.0625, id="a stretched interval: 147 a second"),
        pytest.param(16.0, 20000, 20.0, 0.015625, id="20,000 hosts: 1/64 s"),
        pytest.param(16.0, 10, 4.0, 0.25, id="a short interval: at most 1/16 of it"),
        pytest.param(0.0, 5000, 20.0, 0.0, id="0: no batching"),
        pytest.param(float("nan"), 5000, 20.0, 0.0, id="nan: no batching"),
        pytest.param(float("inf"), 5000, 20.0, 0.0, id="infinite: no batching"),
        pytest.param(-3.0, 5000, 20.0, 0.0, id="negative: no batching"),
        pytest.param(1e-300, 5000, 20.0, 0.0, id="too small to be a grid: none"),
    ],
)
def test_the_poll_grid_holds_about_a_batch_of_reads(
    batch: float, hosts: int, every: float, grid: float
) -> None:
    assert poll_grid(PowerSettings(poll_batch=batch), hosts, every) == grid


@pytest.mark.parametrize(
    ("now", "phase", "wait"),
    [
        pytest.param(0.0, 0.5, 10.0, id="on the grid already: unchanged"),
        pytest.param(0.0, 0.5124, 10.0, id="10.248 s rounded down to 10.0 s"),
        pytest.param(0.0, 0.5125, 10.25, id="10.25 s is a step of its own"),
        pytest.param(19.9, 0.0124, 20.1, id="its rounded slot too soon: the one after"),
    ],
)
def test_on_a_grid_a_hosts_slot_is_rounded_down(now: float, phase: float, wait: float) -> None:
    got = (spread_poll(at(now), INTERVAL, phase, 0.25) - at(now)).total_seconds()
    assert got == pytest.approx(wait)


def test_five_thousand_hosts_on_the_grid_come_in_batches_of_about_sixteen() -> None:
    """The same 5,000 reads in the interval, each host at most one step of the grid before
    its own moment, but at 320 moments instead of 5,000: about 15.6 reads a batch."""
    keys = [f"metalmend-lab/worker-{i}" for i in range(5000)]
    grid = poll_grid(PowerSettings(), len(keys), INTERVAL)
    start = at(0.5)
    slots = {k: spread_poll(start, INTERVAL, poll_phase(k), grid) for k in keys}
    batches = Counter(slots.values())
    assert len(batches) == INTERVAL / grid == 320
    assert sum(batches.values()) == 5000
    assert max(batches.values()) < 2 * 16
    for key, slot in slots.items():
        alone = spread_poll(start, INTERVAL, poll_phase(key))
        early = (alone - slot).total_seconds() % INTERVAL
        assert 0 <= early < grid + 1e-6


@pytest.mark.parametrize(
    ("phase", "shift", "wait"),
    [
        pytest.param(0.5124, 0.5, 10.125, id="steps from 0.125 s: 10.248 s to 10.125 s"),
        pytest.param(0.5, 0.5, 9.875, id="10.0 s is in the step from 9.875 s"),
        pytest.param(0.5, 1.5, 9.875, id="a shift modulo 1"),
        pytest.param(0.5, float("nan"), 10.0, id="nan: no shift"),
    ],
)
def test_a_shifted_grid_starts_its_steps_later(phase: float, shift: float, wait: float) -> None:
    got = (spread_poll(at(0.0), INTERVAL, phase, 0.25, shift) - at(0.0)).total_seconds()
    assert got == pytest.approx(wait)


def test_two_processes_with_their_own_shifts_never_batch_at_the_same_moment() -> None:
    keys = [f"metalmend-lab/worker-{i}" for i in range(1250)]
    grid = poll_grid(PowerSettings(), len(keys), INTERVAL)
    one = {spread_poll(at(0.5), INTERVAL, poll_phase(k), grid, 0.1) for k in keys[::2]}
    two = {spread_poll(at(0.5), INTERVAL, poll_phase(k), grid, 0.6) for k in keys[1::2]}
    assert not one & two


def test_decide_puts_the_idle_poll_on_the_grid() -> None:
    host = dataclasses.replace(IDLE, poll_phase=0.5124, poll_grid=0.25)
    assert decide(host, at(0.0), SETTINGS).requeue_at == at(10.0)
    assert decide(dataclasses.replace(host, poll_grid=0.0), at(0.0), SETTINGS).requeue_at == (
        at(0.0) + dt.timedelta(seconds=0.5124 * INTERVAL)
    )
    shifted = dataclasses.replace(host, grid_shift=0.5)
    assert decide(shifted, at(0.0), SETTINGS).requeue_at == at(10.125)
