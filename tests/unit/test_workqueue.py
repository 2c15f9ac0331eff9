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


async def due(queue: WorkQueue, *keys: str) -> None:
    """Schedule ``keys`` in the background now-ish and let their timers fire, in order."""
    for key in keys:
        queue.add_after(key, 0.001, background=True)
    await asyncio.sleep(0.05)


async def test_background_keys_go_after_every_other_key() -> None:
    """benchmarks/scale.py: a reboot request, and the polls watching its power change land,
    waited behind 250 idle power polls a second."""
    queue = WorkQueue()
    await due(queue, "ns/poll-1", "ns/poll-2")
    queue.add("ns/reboot")
    queue.add_after("ns/landing", 0.001)  # a follow-up schedule: not background
    await asyncio.sleep(0.05)
    assert len(queue) == 4
    handed = [await next_key(queue) for _ in range(4)]
    assert handed == ["ns/reboot", "ns/landing", "ns/poll-1", "ns/poll-2"]
    assert len(queue) == 0


async def test_a_due_key_asked_for_now_moves_ahead_and_is_handed_out_once() -> None:
    queue = WorkQueue()
    await due(queue, "ns/a", "ns/b", "ns/c")
    queue.add("ns/c")
    assert len(queue) == 3
    handed = [await next_key(queue) for _ in range(3)]
    assert handed == ["ns/c", "ns/a", "ns/b"]
    with pytest.raises(TimeoutError):
        await next_key(queue, within=0.05)


async def test_a_key_asked_for_while_processing_runs_next_after_done() -> None:
    queue = WorkQueue()
    queue.add("ns/a")
    assert await next_key(queue) == "ns/a"
    await due(queue, "ns/poll")
    queue.add("ns/a")  # changed again while a worker holds it
    queue.done("ns/a")
    assert [await next_key(queue), await next_key(queue)] == ["ns/a", "ns/poll"]


async def test_the_queue_says_which_keys_it_handed_out_as_background() -> None:
    """For a reconcile that did nothing (a busy BMC): its key keeps its priority."""
    queue = WorkQueue()
    await due(queue, "ns/poll")
    queue.add("ns/change")
    first, second = await next_key(queue), await next_key(queue)
    assert (first, second) == ("ns/change", "ns/poll")
    assert not queue.handed_out_in_background("ns/change")
    assert queue.handed_out_in_background("ns/poll")
    queue.done("ns/poll")
    assert not queue.handed_out_in_background("ns/poll")


async def test_background_keys_take_at_most_max_background_workers() -> None:
    """host-power's polls wait in line for a BMC slot while they hold a worker; the
    workers beyond ``max_background`` stay free for every other key."""
    queue = WorkQueue(max_background=2)
    for key in ("ns/p1", "ns/p2", "ns/p3"):
        queue.add_after(key, 0, background=True)
    first = [await next_key(queue), await next_key(queue)]
    assert first == ["ns/p1", "ns/p2"]
    with pytest.raises(TimeoutError):  # a third poll would take a third worker
        await next_key(queue, within=0.05)
    queue.add("ns/reboot")
    assert await next_key(queue) == "ns/reboot", "a change still finds a worker"
    waiting = asyncio.create_task(next_key(queue))
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.done("ns/p1")  # a background place frees: the waiting worker takes the poll
    assert await waiting == "ns/p3"
    assert queue.handed_out_in_background("ns/p3")


async def test_the_wait_of_a_background_key_from_due_to_a_worker_is_told() -> None:
    """For /metrics (metalmend_workqueue_background_wait_seconds): a routine poll that
    waits long for a worker says the process lacks CPU or BMC slots."""
    queue = WorkQueue(max_background=1)
    waits: list[float] = []
    queue.on_background_wait = waits.append
    queue.add_after("ns/p1", 0, background=True)
    queue.add_after("ns/p2", 0, background=True)
    assert await next_key(queue) == "ns/p1"
    await asyncio.sleep(0.05)  # p2 waits behind p1 for the one background place
    queue.done("ns/p1")
    assert await next_key(queue) == "ns/p2"
    assert len(waits) == 2
    assert waits[1] >= 0.049, "p2 waited at least the 50 ms p1 held the place"
    queue.add_after("ns/p3", 0, background=True)
    queue.add("ns/p3")  # asked for meanwhile: handed out as a change, no background wait
    queue.done("ns/p2")
    assert await next_key(queue) == "ns/p3"
    assert len(waits) == 2
