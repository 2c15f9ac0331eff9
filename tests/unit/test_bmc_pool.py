"""BmcPool's limits and routing, with fake async drivers (pure asyncio, no BMC, no I/O)."""

from __future__ import annotations

import asyncio
import re
from collections import deque
from dataclasses import replace

import pytest

from metalmend.bmc import BmcPool, BmcTarget, Credentials, PowerState, TimedOut, parse
from metalmend.bmc import pool as pool_module
from metalmend.bmc.driver import PowerAction, PowerDriver
from metalmend.bmc.errors import BmcError, Busy, Refused, cap
from metalmend.bmc.settings import BmcSettings


class FakeDriver:
    """Counts what it is asked; a call waits for ``gate`` (open by default)."""

    def __init__(self, target: BmcTarget) -> None:
        self.target = target
        self.gate = asyncio.Event()
        self.gate.set()
        self.started = asyncio.Event()
        self.actions: list[PowerAction] = []
        self.reads = 0
        self.cancelled = 0
        self.closed = False
        self.hung_up = 0
        self.fail_with: BmcError | None = None

    async def _enter(self) -> None:
        self.started.set()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_with is not None:
            raise self.fail_with

    async def power_state(self) -> PowerState:
        await self._enter()
        self.reads += 1
        return PowerState.ON

    async def act(self, action: PowerAction) -> None:
        await self._enter()
        self.actions.append(action)

    async def close(self) -> None:
        self.closed = True

    def hang_up(self) -> None:
        self.hung_up += 1


class Drivers:
    """The pool's driver factory: remembers every driver it made, per target."""

    def __init__(self) -> None:
        self.made: list[FakeDriver] = []
        self.stuck: set[str] = set()  # addresses whose drivers start with a closed gate
        self.new = asyncio.Event()  # set whenever a driver is made

    def __call__(self, target: BmcTarget, vetted_ip: str | None) -> PowerDriver:
        driver = FakeDriver(target)
        if str(target.address) in self.stuck:
            driver.gate.clear()
        self.made.append(driver)
        self.new.set()
        return driver

    def of(self, target: BmcTarget) -> list[FakeDriver]:
        return [d for d in self.made if d.target == target]


def ipmi(port: int, namespace: str = "tenant-a", user: str = "u") -> BmcTarget:
    return BmcTarget(parse(f"ipmi://127.0.0.1:{port}"), Credentials(user, "p"), namespace=namespace)


def redfish(system: str, namespace: str = "tenant-a") -> BmcTarget:
    address = parse(f"redfish+https://127.0.0.1:8443/redfish/v1/Systems/{system}")
    return BmcTarget(address, Credentials("u", "p"), namespace=namespace)


def pool_with(drivers: Drivers, **settings: float) -> BmcPool:
    # (a CA bundle: Redfish targets need something to check certificates against)
    chosen = {"ca_bundle": "/etc/bmc-ca.crt", **settings}
    return BmcPool(BmcSettings(**chosen), driver_factory=drivers)  # type: ignore[arg-type]


async def started(pool: BmcPool, drivers: Drivers, target: BmcTarget) -> asyncio.Task[PowerState]:
    """A power read for ``target`` that is stuck inside its driver."""
    drivers.stuck.add(str(target.address))
    task = asyncio.create_task(pool.power_state(target))
    while not drivers.of(target):
        drivers.new.clear()
        await drivers.new.wait()
    await drivers.of(target)[-1].started.wait()
    return task


async def test_a_busy_bmc_answers_busy_at_once_and_other_bmcs_go_ahead() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    stuck = await started(pool, drivers, ipmi(1))
    with pytest.raises(Busy, match="waiting for BMC endpoint") as busy:
        await pool.power_off(ipmi(1), hard=True)  # same BMC: not queued behind the stuck call
    assert busy.value.retry_after > 0
    assert await pool.power_state(ipmi(2)) == PowerState.ON  # another BMC is served
    assert drivers.of(ipmi(1))[0].actions == [], "never two calls in flight on one BMC"
    drivers.of(ipmi(1))[0].gate.set()
    assert await stuck == PowerState.ON
    await pool.close()


async def test_calls_to_one_bmc_in_quick_succession_all_go_through() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    states = await asyncio.gather(*(pool.power_state(ipmi(1)) for _ in range(3)))
    assert states == [PowerState.ON] * 3
    assert sum(d.reads for d in drivers.of(ipmi(1))) == 3
    await pool.close()


async def test_one_tenant_gets_its_share_of_slots_and_no_more() -> None:
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight_per_namespace=2, max_in_flight=16)
    held = [await started(pool, drivers, ipmi(port, "greedy")) for port in (1, 2)]
    with pytest.raises(Busy, match="namespace 'greedy' already has 2 BMC calls in flight"):
        await pool.power_state(ipmi(3, "greedy"))
    assert await pool.power_state(ipmi(4, "quiet")) == PowerState.ON
    for driver in drivers.made:
        driver.gate.set()
    await asyncio.gather(*held)
    assert await pool.power_state(ipmi(3, "greedy")) == PowerState.ON
    await pool.close()


async def test_global_limit() -> None:
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight=2, max_in_flight_per_namespace=8)
    held = [await started(pool, drivers, ipmi(port, f"ns{port}")) for port in (1, 2)]
    with pytest.raises(Busy, match="all 2 BMC call slots are in use"):
        await pool.power_state(ipmi(3, "ns3"))
    for driver in drivers.made:
        driver.gate.set()
    await asyncio.gather(*held)
    await pool.close()


async def test_a_call_past_its_deadline_is_ended_and_frees_its_bmc_at_once() -> None:
    drivers = Drivers()
    drivers.stuck.add(str(ipmi(1).address))
    pool = pool_with(drivers, timeout=0.2)
    with pytest.raises(TimedOut, match=r"did not answer within 0\.2s; the call was ended"):
        await pool.power_state(ipmi(1))
    first = drivers.of(ipmi(1))[0]
    assert first.cancelled == 1, "the driver's work was cancelled, not left running"
    assert first.closed, "and the driver dropped"
    drivers.stuck.clear()
    assert await pool.power_state(ipmi(1)) == PowerState.ON  # no "busy" left behind
    assert len(drivers.of(ipmi(1))) == 2, "a fresh driver"
    await pool.close()


async def test_a_cancelled_caller_ends_the_call_and_leaves_no_slot_taken() -> None:
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight=1)
    task = await started(pool, drivers, ipmi(1))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert drivers.of(ipmi(1))[0].cancelled == 1
    drivers.stuck.clear()
    assert await pool.power_state(ipmi(2)) == PowerState.ON  # the only slot is free again
    await pool.close()
    assert drivers.of(ipmi(1))[0].closed


async def test_hosts_sharing_an_endpoint_each_drive_their_own_system() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    await pool.power_off(redfish("A"), hard=True)
    await pool.power_on(redfish("B"))
    assert await pool.power_state(redfish("B")) == PowerState.ON
    (a,), (b,) = drivers.of(redfish("A")), drivers.of(redfish("B"))
    assert a is not b
    assert a.target.address.system_path.endswith("/A")
    assert (a.actions, a.reads) == ([PowerAction.HARD_OFF], 0)
    assert (b.actions, b.reads) == ([PowerAction.ON], 1)
    await pool.close()


async def test_hosts_sharing_an_endpoint_still_take_turns_on_it() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    stuck = await started(pool, drivers, redfish("A"))
    with pytest.raises(Busy):
        await pool.power_state(redfish("B"))
    drivers.of(redfish("A"))[0].gate.set()
    await stuck
    await pool.close()


async def test_other_credentials_get_another_driver() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    await pool.power_state(ipmi(1, user="alice"))
    await pool.power_state(ipmi(1, user="alice"))
    await pool.power_state(ipmi(1, user="bob"))
    assert len(drivers.made) == 2
    await pool.close()


async def test_a_refused_address_never_gets_a_driver() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    cleartext = BmcTarget(
        parse("redfish+http://127.0.0.1:8000/redfish/v1/Systems/1"), Credentials("u", "p")
    )
    with pytest.raises(Refused):
        await pool.power_state(cleartext)
    assert drivers.made == []
    await pool.close()


@pytest.mark.parametrize(
    ("case", "target", "says"),
    [
        (
            "'*' without allowed networks",
            BmcTarget(parse("ipmi://127.0.0.1:623"), Credentials("u", "p", every_host=True)),
            "none are set",
        ),
        (
            "'*' asking for no certificate check",
            BmcTarget(
                parse("redfish+https://127.0.0.1:8443/redfish/v1/Systems/1"),
                Credentials("u", "p", every_host=True),
                verify_certificates=False,
            ),
            "never honoured",
        ),
        (
            "by name, asking for no certificate check (not allowed by default)",
            BmcTarget(
                parse("redfish+https://127.0.0.1:8443/redfish/v1/Systems/1"),
                Credentials("u", "p"),
                verify_certificates=False,
            ),
            "--bmc-allow-disable-certificate-verification",
        ),
    ],
)
async def test_what_a_binding_does_not_trust_never_gets_a_driver(
    case: str, target: BmcTarget, says: str
) -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    with pytest.raises(Refused, match=re.escape(says)):
        await pool.power_state(target)
    assert drivers.made == [], case
    await pool.close()


async def test_a_failed_call_drops_its_driver() -> None:
    drivers = Drivers()
    pool = pool_with(drivers)
    await pool.power_state(ipmi(1))
    drivers.of(ipmi(1))[0].fail_with = BmcError("ipmi://127.0.0.1:1: no")
    with pytest.raises(BmcError, match="no"):
        await pool.power_state(ipmi(1))
    assert drivers.of(ipmi(1))[0].closed
    await pool.power_state(ipmi(1))
    assert len(drivers.of(ipmi(1))) == 2
    await pool.close()


async def test_a_short_password_does_not_mangle_messages() -> None:
    """The old scrubber replaced every 'p' with *** ("htt***://"): no scrubbing now, the
    drivers never put a secret into a text."""
    drivers = Drivers()
    pool = pool_with(drivers)
    message = "http://127.0.0.1:8443/redfish/v1/Systems/A: the BMC reported an internal problem"
    await pool.power_state(ipmi(1))
    drivers.of(ipmi(1))[0].fail_with = BmcError(message)
    with pytest.raises(BmcError) as caught:
        await pool.power_state(ipmi(1))
    assert str(caught.value) == message
    await pool.close()


async def test_a_3_mb_bmc_message_is_capped_to_its_start() -> None:
    drivers = Drivers()
    pool = pool_with(drivers, max_message_chars=500)
    await pool.power_state(ipmi(1))
    drivers.of(ipmi(1))[0].fail_with = BmcError("BMC says: " + "x" * 3_000_000)
    with pytest.raises(BmcError) as caught:
        await pool.power_state(ipmi(1))
    text = str(caught.value)
    assert len(text) <= 500
    assert text.startswith("BMC says: xxx")
    assert "[cut: " in text
    await pool.close()


@pytest.mark.parametrize("limit", [10, 60, 500])
def test_cap_keeps_the_start_and_says_how_much_was_cut(limit: int) -> None:
    text = "Connection refused by 10.0.0.9 " + "detail " * 1000
    capped = cap(text, limit)
    assert len(capped) <= limit
    assert capped.startswith(text[: max(limit - 40, 0)])
    assert capped.endswith(("more characters]", "…"))
    assert cap("short", limit) == "short"


async def test_a_driver_left_unused_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts come and go: the driver of a deleted host must not keep its connection."""
    monkeypatch.setattr(pool_module, "DRIVER_IDLE", -1.0)  # everything not in use is idle
    drivers = Drivers()
    pool = pool_with(drivers)
    await pool.power_state(ipmi(1))
    await pool.power_state(ipmi(2))
    await asyncio.sleep(0)  # the closing runs on its own
    assert drivers.of(ipmi(1))[0].closed
    assert not drivers.of(ipmi(2))[0].closed, "the driver in use is kept"
    await pool.close()


async def test_only_drivers_unused_for_the_idle_time_are_closed_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool keeps its drivers in order of last use and stops looking at the first one
    used recently (no walk over every driver per call: benchmarks/scale.py); a driver used
    again moves to the end, and is kept."""
    clock = [1000.0]
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: clock[0])
    drivers = Drivers()
    pool = pool_with(drivers)
    for port in (1, 2, 3):
        await pool.power_state(ipmi(port))
        clock[0] += 1.0
    clock[0] += pool_module.DRIVER_IDLE - 2.5  # 1 and 2 about to be idle too long, 3 not
    await pool.power_state(ipmi(1))  # used again: kept, and now the newest
    clock[0] += 1.0
    await pool.power_state(ipmi(4))
    await asyncio.sleep(0)  # the closing runs on its own
    assert [d.closed for d in drivers.made] == [False, True, False, False]
    assert list(pool._last_used) == [ipmi_key(pool, 3), ipmi_key(pool, 1), ipmi_key(pool, 4)]
    await pool.close()


def ipmi_key(pool: BmcPool, port: int) -> tuple[str, ...]:
    return pool_module._driver_key(ipmi(port))


async def test_background_polls_leave_a_slot_to_calls_for_changes() -> None:
    """benchmarks/scale.py: at 5,000 hosts in one namespace the routine polls took every
    slot, and a reboot's call was turned away as busy for seconds."""
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight_per_namespace=3, max_in_flight=16)
    held = [await started(pool, drivers, ipmi(port)) for port in (1, 2)]
    poll = asyncio.create_task(pool.power_state(ipmi(3), background=True))
    await until_in_line(pool, 1)  # the last slot is not for polls: it waits in line
    assert await pool.power_state(ipmi(4)) == PowerState.ON  # a change's call gets it
    assert not poll.done()
    for driver in drivers.made:
        driver.gate.set()
    await asyncio.gather(*held)
    assert await poll == PowerState.ON  # handed a slot as one freed
    await pool.close()


async def until_in_line(pool: BmcPool, count: int) -> None:
    """Until ``count`` background calls wait in line for a slot (a few loop turns)."""
    for _ in range(1000):
        if len(pool._line) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"waited for {count} calls in line; {len(pool._line)} are")


async def test_background_polls_wait_in_line_and_take_freed_slots_first_come() -> None:
    """A poll that finds every slot of its share taken waits in line (it is not turned
    away to be requeued and handed out again and again: at 5,000 hosts that loop kept 13
    workers busy and the event loop lagging), and is handed a slot as one frees, in the
    order the polls came."""
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight_per_namespace=2, max_in_flight=16)
    held = await started(pool, drivers, ipmi(1))  # the share less the reserve: 1 slot
    done: list[int] = []

    async def poll(port: int) -> None:
        await pool.power_state(ipmi(port), background=True)
        done.append(port)

    polls = []
    for port in (2, 3, 4):
        drivers.stuck.add(str(ipmi(port).address))
        polls.append(asyncio.create_task(poll(port)))
        await until_in_line(pool, len(polls))
    drivers.of(ipmi(1))[0].gate.set()
    await held
    for port in (2, 3, 4):  # each freed slot goes to the first in line, one at a time
        while not drivers.of(ipmi(port)):
            drivers.new.clear()
            await drivers.new.wait()
        assert [p for p in (2, 3, 4) if drivers.of(ipmi(p))] == list(range(2, port + 1))
        drivers.of(ipmi(port))[0].gate.set()
    await asyncio.gather(*polls)
    assert done == [2, 3, 4]
    assert pool._line == deque()
    await pool.close()


async def test_a_poll_in_line_too_long_is_busy_and_holds_no_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "BACKGROUND_SLOT_WAIT", 0.05)
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight_per_namespace=2, max_in_flight=16)
    held = await started(pool, drivers, ipmi(1))
    with pytest.raises(Busy, match="already has 1 BMC calls in flight") as busy:
        await pool.power_state(ipmi(2), background=True)
    assert busy.value.retry_after > 0
    assert pool._line == deque()
    drivers.of(ipmi(1))[0].gate.set()
    await held
    assert pool._calls == [], "no slot left taken"
    await pool.close()


async def test_a_poll_cancelled_in_line_or_as_it_is_handed_a_slot_holds_no_slot() -> None:
    drivers = Drivers()
    pool = pool_with(drivers, max_in_flight_per_namespace=2, max_in_flight=16)
    held = await started(pool, drivers, ipmi(1))
    waiting = asyncio.create_task(pool.power_state(ipmi(2), background=True))
    await until_in_line(pool, 1)
    waiting.cancel()  # in line
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pool._line == deque()
    handed = asyncio.create_task(pool.power_state(ipmi(3), background=True))
    await until_in_line(pool, 1)
    drivers.of(ipmi(1))[0].gate.set()
    await held  # its slot is handed to the poll in line ...
    handed.cancel()  # ... which is cancelled before it runs again: the slot goes back
    with pytest.raises(asyncio.CancelledError):
        await handed
    assert pool._calls == []
    assert pool._line == deque()
    assert drivers.of(ipmi(3)) == [], "nothing was sent for the cancelled poll"
    await pool.close()


async def test_a_background_poll_hangs_up_and_a_call_for_a_change_keeps_the_line() -> None:
    """BmcPool._call: a routine poll's connection is closed at once (its objects die young);
    the calls of a change keep it for the calls that follow."""
    drivers = Drivers()
    pool = pool_with(drivers)
    await pool.power_state(ipmi(1), background=True)
    [driver] = drivers.of(ipmi(1))
    assert driver.hung_up == 1
    await pool.power_state(ipmi(1))
    await pool.act(ipmi(1), PowerAction.HARD_OFF)
    assert driver.hung_up == 1, "a change keeps its connection"
    driver.fail_with = BmcError("no answer")
    with pytest.raises(BmcError):
        await pool.power_state(ipmi(1), background=True)
    assert driver.hung_up == 1, "a failed poll drops the driver instead"
    await pool.close()


async def test_a_host_waits_behind_one_call_of_another_namespace_not_all_of_them() -> None:
    """Twelve hosts of namespace t2 name worker-1's endpoint: once the t2 call under way
    ends, worker-1 (woken at once) has the endpoint, and a t2 host asking first is turned
    away; the message says what worker-1 waited for."""
    drivers = Drivers()
    pool = pool_with(drivers)
    woken: list[str] = []
    pool.wake = woken.append
    running = await started(pool, drivers, replace(ipmi(1, "t2"), waiter="t2/h0"))
    for i in range(1, 13):
        with pytest.raises(Busy):
            await pool.power_state(replace(ipmi(1, "t2"), waiter=f"t2/h{i}"))
    worker_1 = replace(ipmi(1, "default"), waiter="default/worker-1")
    with pytest.raises(Busy, match="busy with 1 call of other namespaces") as busy:
        await pool.power_off(worker_1, hard=True)
    assert busy.value.others == 1
    assert pool.waiting_samples() == {"t2": 12, "default": 1}
    drivers.stuck.clear()
    drivers.of(replace(ipmi(1, "t2"), waiter="t2/h0"))[0].gate.set()
    assert await running == PowerState.ON
    assert woken == ["default/worker-1"]
    with pytest.raises(Busy, match="namespace 'default' has the turn"):
        await pool.power_state(replace(ipmi(1, "t2"), waiter="t2/h1"))
    await pool.power_off(worker_1, hard=True)
    assert [a for d in drivers.made for a in d.actions] == [PowerAction.HARD_OFF]
    assert woken == ["default/worker-1", "t2/h1"], "then t2's oldest waiter"
    assert await pool.power_state(replace(ipmi(1, "t2"), waiter="t2/h1")) == PowerState.ON
    await pool.close()
