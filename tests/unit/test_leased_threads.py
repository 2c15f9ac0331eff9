"""A leased worker's thread calls (metalmend.db.leased): cancelling a job stops its waiting
at once, but ``stop()`` returns only once its calls still running in threads have ended,
so that none writes or logs after serve closed the database or a test its logging (CI saw
"--- Logging error ---" from a call that ended after its test)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

from metalmend.db.leased import LeasedWorker, in_thread


class BlockedLeases:
    """Leases whose look for work blocks in its thread until released."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.ended = False

    def runnable(self, now: dt.datetime) -> list[str]:
        self.entered.set()
        self.release.wait(30)
        self.ended = True
        return []

    def take(self, *args: Any) -> bool:
        return False

    def renew(self, *args: Any) -> bool:
        return True


async def test_stop_returns_after_the_scan_running_in_a_thread_ended() -> None:
    leases = BlockedLeases()
    worker = LeasedWorker("test", leases, lambda job: asyncio.sleep(0), 6.0)  # type: ignore[arg-type]
    worker.start()
    assert await asyncio.to_thread(leases.entered.wait, 30)

    async def stop() -> bool:
        await worker.stop()
        return leases.ended  # was the thread's call over when stop() returned?

    stopping = asyncio.create_task(stop())
    await asyncio.wait({stopping}, timeout=0.5)  # before: stop() returned here at once
    leases.release.set()
    assert await stopping, "stop() returned while the scan's thread call still ran"


async def test_a_job_cancelled_mid_call_is_waited_for_by_stop() -> None:
    entered, release = threading.Event(), threading.Event()
    ended: list[bool] = []

    def write() -> None:
        entered.set()
        release.wait(30)
        ended.append(True)

    class OneJob(BlockedLeases):
        def runnable(self, now: dt.datetime) -> list[str]:
            return ["job"]

        def take(self, *args: Any) -> bool:
            return True

    async def run(job: str) -> None:
        await in_thread(write)

    worker = LeasedWorker("test", OneJob(), run, 6.0)  # type: ignore[arg-type]
    worker.start()
    assert await asyncio.to_thread(entered.wait, 30)
    assert worker.running == {"job"}

    async def stop() -> bool:
        await worker.stop()
        return bool(ended)

    stopping = asyncio.create_task(stop())
    await asyncio.wait({stopping}, timeout=0.5)
    release.set()
    assert await stopping, "stop() returned while the job's thread call still ran"


async def test_outside_a_worker_it_is_to_thread() -> None:
    assert await in_thread(sum, [1, 2]) == 3
