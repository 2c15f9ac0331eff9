"""A controller whose reconciles all raise makes /readyz say so (issue 36: every host-power
reconcile raised OverflowError for 90 s while /readyz said ok), without one error, or a
burst a retry absorbs, flapping readiness. The rule (``FailureStreak``) is pure and
table-driven here; the controller's and the manager's wiring below it, without I/O; the
real API server and a real ``metalmend run`` in tests/integration/test_run_cli.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence

import httpx2
import pytest
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import Status

from metalmend.kube.controller import (
    DONE,
    FAILING_AFTER,
    FAILING_COUNT,
    Controller,
    FailureStreak,
    Result,
)
from metalmend.kube.manager import Manager
from metalmend.kube.workqueue import Backoff
from tests.support import until

T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
BOOM = OverflowError("date value out of range")

# (seconds after T0, "raise" | "ok"), in order
Steps = Sequence[tuple[float, str]]


def streak_after(steps: Steps) -> FailureStreak:
    streak = FailureStreak()
    for at, what in steps:
        if what == "raise":
            streak.failed(T0 + dt.timedelta(seconds=at), BOOM)
        else:
            streak.ended()
    return streak


def raising(every: float, until_: float, start: float = 0.0) -> list[tuple[float, str]]:
    steps, at = [], start
    while at <= until_:
        steps.append((at, "raise"))
        at += every
    return steps


@pytest.mark.parametrize(
    ("steps", "now", "failing"),
    [
        pytest.param([], 100.0, False, id="nothing happened"),
        pytest.param([(0.0, "raise")], 3600.0, False, id="one error, an hour ago: never"),
        pytest.param([(0.0, "raise"), (0.01, "ok")], 3600.0, False, id="an error a retry absorbed"),
        pytest.param(raising(1.0, 4.0), 4.0, False, id="5 in a row within 4 s: too soon"),
        pytest.param(raising(1.0, 4.0), FAILING_AFTER, True, id="5 in a row, 30 s on"),
        pytest.param(raising(10.0, 30.0), 3600.0, False, id="4 in a row over 30 s: too few"),
        pytest.param(raising(10.0, 40.0), 40.0, True, id="5 in a row over 40 s"),
        pytest.param([*raising(1.0, 60.0), (60.5, "ok")], 61.0, False,
                     id="a minute of errors, then one reconcile ends otherwise: ready again"),
        pytest.param([*raising(1.0, 60.0), (60.5, "ok"), *raising(1.0, 70.0, 61.0)], 70.0, False,
                     id="raising again after a success: a new streak, counted from it"),
        pytest.param([*raising(1.0, 60.0), (60.5, "ok"), *raising(1.0, 95.0, 61.0)], 95.0, True,
                     id="... which shows once it is long enough itself"),
        pytest.param([(float(i), "raise" if i % 2 else "ok") for i in range(600)], 600.0, False,
                     id="every other reconcile raises for ten minutes: working, not failing"),
    ],
)  # fmt: skip
def test_readiness_says_a_controller_fails_only_once_every_reconcile_has_raised_for_a_while(
    steps: Steps, now: float, failing: bool
) -> None:
    problem = streak_after(steps).problem("host-power", T0 + dt.timedelta(seconds=now))
    assert (problem is not None) == failing, problem


def test_the_line_names_the_controller_the_error_type_and_since_when() -> None:
    problem = streak_after(raising(1.0, 41.0)).problem("host-power", T0 + dt.timedelta(seconds=42))
    assert problem == (
        "controller host-power: every reconcile has raised since 2030-01-01T12:00:00Z"
        " (42 in a row over 42s); the last: OverflowError: date value out of range"
        " (its log has each one with its object and traceback)"
    )


def test_a_long_or_multi_line_message_stays_one_short_line() -> None:
    streak = FailureStreak()
    for _ in range(FAILING_COUNT):
        streak.failed(T0, ValueError("first line\nsecond line " + "x" * 1000))
    problem = streak.problem("c", T0 + dt.timedelta(seconds=FAILING_AFTER))
    assert problem is not None
    assert "\n" not in problem
    assert "ValueError: first line second line xxx" in problem
    assert len(problem) < 400


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def now(self) -> dt.datetime:
        return self.at


class Broken:
    """A reconcile that raises while ``broken`` (a bug), or a passing API problem."""

    def __init__(self) -> None:
        self.broken: BaseException | None = BOOM
        self.calls = 0

    async def reconcile(self, key: str) -> Result:
        self.calls += 1
        if self.broken is not None:
            raise self.broken
        return DONE


NOWHERE = KubeConfig.from_dict(
    {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "never-sent"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
)


async def test_the_manager_is_not_ready_while_a_controllers_reconciles_all_raise() -> None:
    client = AsyncClient(NOWHERE)
    clock, broken = Clock(), Broken()
    controller = Controller("breaking", broken.reconcile, clock=clock, backoff=Backoff(0.001, 0.01))
    manager = Manager(client)
    manager.add(controller)
    manager.controllers_running = True
    task = asyncio.create_task(controller.run())
    try:
        controller.queue.add("ns/a")
        await until(lambda: broken.calls >= FAILING_COUNT)
        assert manager.not_ready() == []  # not yet: within FAILING_AFTER of the first
        clock.at = T0 + dt.timedelta(seconds=FAILING_AFTER)
        (why,) = manager.not_ready()
        assert why.startswith("controller breaking: every reconcile has raised since 2030-")
        assert "OverflowError: date value out of range" in why
        assert manager.not_live() == []  # a restart would not fix a bug
        broken.broken = None  # fixed: the next retry succeeds
        await until(lambda: manager.not_ready() == [])
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


@pytest.mark.parametrize(
    "weather",
    [
        ApiError(status=Status(code=503, message="etcdserver: leader changed")),
        httpx2.ConnectError("connection refused"),
    ],
    ids=["5xx", "transport"],
)
async def test_passing_api_server_problems_do_not_count(weather: BaseException) -> None:
    """The informers and the API probe say those themselves; counted here they would
    name a controller for the API server's weather."""
    clock, broken = Clock(), Broken()
    broken.broken = weather
    controller = Controller("weather", broken.reconcile, clock=clock, backoff=Backoff(0.001, 0.01))
    task = asyncio.create_task(controller.run())
    try:
        controller.queue.add("ns/a")
        await until(lambda: broken.calls >= 2 * FAILING_COUNT)
        clock.at = T0 + dt.timedelta(hours=1)
        assert controller.failing() is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
