"""The controller runtime's ``TerminalError``: a permanently bad spec is said once and not
retried with backoff; the key runs again (and recovers) when its object changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from metalmend.kube import metrics
from metalmend.kube.controller import DONE, Controller, Result, TerminalError
from metalmend.kube.workqueue import Backoff
from tests.support import until

KEY = "ns/bad-spec"


class Object:
    """What the reconcile reads (the informer's copy in a real controller)."""

    def __init__(self) -> None:
        self.spec = "nonsense"
        self.calls = 0

    async def reconcile(self, key: str) -> Result:
        self.calls += 1
        if self.spec == "nonsense":
            raise TerminalError(f"{key}: spec.selector is not a label selector")
        return DONE


@pytest.fixture
async def running() -> AsyncIterator[tuple[Controller, Object]]:
    obj = Object()
    controller = Controller("terminal-test", obj.reconcile, backoff=Backoff(0.001, 0.01))
    task = asyncio.create_task(controller.run())
    yield controller, obj
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def outcomes(outcome: str) -> float:
    return float(metrics.RECONCILE_TOTAL.labels("terminal-test", outcome)._value.get())


async def test_a_terminal_error_is_not_retried_and_is_logged_once(
    running: tuple[Controller, Object], caplog: pytest.LogCaptureFixture
) -> None:
    controller, obj = running
    terminal_before = outcomes("terminal")
    errors_before = metrics.RECONCILE_ERRORS.labels("terminal-test")._value.get()
    with caplog.at_level(logging.WARNING, logger="metalmend.kube.controller"):
        controller.queue.add(KEY)
        await until(lambda: obj.calls == 1 and len(controller.queue) == 0)
        await asyncio.sleep(0.3)  # a backoff of 1..10 ms would have retried dozens of times
        assert obj.calls == 1
        assert controller.queue.failures(KEY) == 0
        assert controller.queue.scheduled == 0

        # Something changed that leaves the spec as wrong (a status write, a relist): the
        # key runs again, fails the same way, and the log does not say it twice.
        controller.queue.add(KEY)
        await until(lambda: obj.calls == 2)
        await asyncio.sleep(0.05)
    said = [r for r in caplog.records if "cannot reconcile until the object changes" in r.message]
    assert len(said) == 1
    assert "spec.selector is not a label selector" in said[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback for a bad spec
    assert outcomes("terminal") == terminal_before + 2
    assert metrics.RECONCILE_ERRORS.labels("terminal-test")._value.get() == errors_before


async def test_the_key_recovers_when_its_object_is_fixed(
    running: tuple[Controller, Object], caplog: pytest.LogCaptureFixture
) -> None:
    controller, obj = running
    controller.queue.add(KEY)
    await until(lambda: obj.calls == 1)
    success_before = outcomes("success")
    obj.spec = "app=web"  # the operator fixes the spec: the watch enqueues the key
    controller.queue.add(KEY)
    await until(lambda: outcomes("success") == success_before + 1)
    assert obj.calls == 2

    # Broken again later: said again (it is news once more).
    obj.spec = "nonsense"
    with caplog.at_level(logging.WARNING, logger="metalmend.kube.controller"):
        controller.queue.add(KEY)
        await until(lambda: obj.calls == 3)
        await asyncio.sleep(0.05)
    assert [r for r in caplog.records if "cannot reconcile until" in r.message]
