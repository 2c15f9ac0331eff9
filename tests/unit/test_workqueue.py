"""The work queue's guarantees, on an event loop and nothing else."""

from __future__ import annotations

import asyncio

import pytest

from metalmend.kube.workqueue import Backoff, WorkQueue


async def next_key(queue: WorkQueue, within: float = 1.0) -> str | None:
    return await asyncio.wait_for(queue.get(), within)


async def test_a_key_added_twice_before_it_runs_is_handed_out_once() -> None:
    queue = WorkQueue()
    queue.add("ns/a")
    queue.add("ns/a")
    assert len(queue) == 1
    assert await next_key(queue) == "ns/a"
    assert len(queue) == 0


async def test_a_key_readded_while_running_runs_again_after_done() -> None:
    queue = WorkQueue()
    queue.add("ns/a")
    key = await next_key(queue)
    queue.add("ns/a")
    assert len(queue) == 0, "not handed out while a worker holds it"
    with pytest.raises(TimeoutError):
        await next_key(queue, within=0.05)
    queue.done(key or "")
    assert await next_key(queue) == "ns/a"


async def test_two_workers_never_hold_the_same_key() -> None:
    queue = WorkQueue()
    holding: set[str] = set()
    overlaps = 0
    runs = 0

    async def worker() -> None:
        nonlocal overlaps, runs
        while (key := await queue.get()) is not None:
            overlaps += key in holding
            holding.add(key)
            await asyncio.sleep(0.001)
            runs += 1
            holding.discard(key)
            queue.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    for i in range(200):
        queue.add(f"ns/{i % 3}")
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    queue.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == 0
    assert runs >= 3


async def test_add_after_hands_the_key_out_no_sooner_than_its_deadline() -> None:
    queue = WorkQueue()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.05
    queue.add_at("ns/a", deadline)
    assert await next_key(queue) == "ns/a"
    assert loop.time() >= deadline


async def test_the_earliest_schedule_of_a_key_wins() -> None:
    queue = WorkQueue()
    queue.add_after("ns/a", 30)
    queue.add_after("ns/a", 0.01)
    queue.add_after("ns/a", 60)
    assert queue.scheduled == 1
    assert await next_key(queue) == "ns/a"
    assert queue.scheduled == 0


async def test_rate_limited_delays_double_and_forget_resets() -> None:
    queue = WorkQueue(Backoff(base=0.005, cap=1.0))
    delays = [queue.add_rate_limited("ns/a") for _ in range(10)]
    assert delays[:4] == [0.005, 0.01, 0.02, 0.04]
    assert delays[-1] == 1.0
    queue.forget("ns/a")
    assert queue.add_rate_limited("ns/a") == 0.005
    queue.shutdown()


def test_backoff_grows_from_milliseconds_to_minutes() -> None:
    backoff = Backoff()
    assert backoff.delay(1) == 0.005
    assert backoff.delay(30) == 300.0


async def test_shutdown_releases_waiting_workers() -> None:
    queue = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.shutdown()
    assert await asyncio.wait_for(waiter, 1) is None
    queue.add("ns/a")
    assert len(queue) == 0


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    queue = WorkQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.add("ns/a")
    first.cancel()
    await asyncio.sleep(0)
    assert await asyncio.wait_for(second, 1) == "ns/a"
