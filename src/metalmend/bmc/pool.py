"""BmcPool: the one door to the BMCs, with the limits that keep them and us healthy.

- One driver per (BMC endpoint, system, credentials, certificate check): a driver drives
  exactly one system, so two hosts whose addresses share an endpoint (a chassis manager,
  a Redfish aggregator, sushy-tools) never drive each other's server.
- Before a driver is created the address passes ``address.check_allowed`` (cleartext
  HTTP, allowed BMC networks): on refusal nothing is sent.
- Slots: at most one call in flight per BMC endpoint (BMCs are small computers that
  mishandle concurrent sessions), taken by namespaces in turn when several wait for it
  (bmc/turns.py: a host waits behind at most one call per other namespace), at most
  ``max_in_flight_per_namespace`` per namespace (one tenant's broken or hostile BMCs
  cannot take every slot) and ``max_in_flight`` overall.
- No head-of-line blocking: a call that cannot get its slots within ``SLOT_WAIT`` raises
  ``Busy`` with a ``retry_after`` instead of waiting, so the caller requeues the host and
  serves other hosts meanwhile; a worker never sits behind a stuck BMC.
- Every call runs under ``asyncio.timeout(settings.timeout)`` and is really ended there:
  drivers are asynchronous and stop all work when cancelled (the IPMI driver kills its
  worker process), so a slot is free again as soon as the deadline passes.
- A driver is dropped (and closed) after any failure, so the next call starts afresh, and
  after ``DRIVER_IDLE`` seconds unused (its host deleted, or its address changed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from metalmend.api.storage import Drive
from metalmend.bmc import address as bmc_address
from metalmend.bmc import metrics
from metalmend.bmc.address import BmcAddress
from metalmend.bmc.driver import PowerAction, PowerDriver, PowerState
from metalmend.bmc.errors import BmcError, Busy, TimedOut, Unsupported, cap
from metalmend.bmc.ipmi import IpmiDriver, IpmiWorkers
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings
from metalmend.bmc.storage import EraseStatus, StorageDriver
from metalmend.bmc.turns import TURN_HOLD, Turns

log = logging.getLogger(__name__)

T = TypeVar("T")

SLOT_WAIT = 0.05
"""Longest a call waits for a slot before ``Busy``: long enough to ride out the gap
between two quick calls to one BMC, far too short to hold a worker behind a stuck one."""

BACKGROUND_RESERVE = 1
"""Slots a background call (a routine power poll) leaves free, of its namespace's share and
of all: at 5,000 hosts in one namespace the polls alone filled every slot, and a reboot's
call was turned away as busy again and again, for seconds (benchmarks/scale.py)."""

BACKGROUND_SLOT_WAIT = 2.0
"""Longest a background call waits in line for a slot of its namespace's share (or of all)
before ``Busy``. In line it costs nothing and is handed the slot when one frees, first
come first served. Turned away after SLOT_WAIT instead, at 5,000 hosts in one namespace
(7 polls in flight, the share less the reserve) 13 of host-power's 20 workers went round
read -> Busy -> requeue -> read every 50 ms: the event loop lagged 13 ms a turn, each read
took 45 ms of wall time, and the polls fell to 150 a second (every 33 s, not 20) while
every reboot waited on the same loop (docs/scale.md). The work queue keeps workers free
for changes meanwhile (``WorkQueue`` ``max_background``)."""

MIN_RETRY_AFTER = 0.1
DRIVER_IDLE = 600.0
"""A driver unused this long is closed: hosts come and go, and their connections must not
stay behind (a host is read at least every poll interval, well under this)."""
CLOSE_WAIT = 2.0
"""Longest spent closing a dropped driver (a Redfish logout to a BMC that stopped
answering must not delay the error the host is waiting for)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    every_host: bool = False
    """The Secret is bound with ``*`` (every host of its namespace may use it): it then
    goes only to BMCs inside the allowed networks, with certificates checked against the
    operator's CA bundle only (``address.check_trust``)."""


@dataclass(frozen=True)
class BmcTarget:
    """Everything needed to reach one host's BMC."""

    address: BmcAddress
    credentials: Credentials
    verify_certificates: bool = True
    namespace: str = ""
    """The host's namespace: the tenant whose share of the BMC slots the call takes. Tools
    and tests that act for no tenant share the tenant ""."""
    waiter: str = ""
    """Who asks (the host's key): a call turned away from a busy endpoint keeps its place
    in its namespace's line under this name, and is woken (``BmcPool.wake``) when its
    namespace's turn comes. "": not kept in line (it still respects the turns)."""


DriverFactory = Callable[[BmcTarget, str | None], PowerDriver]
"""Makes the driver of a target; the second argument is the vetted IP address to connect
to, when ``check_allowed`` resolved one (so a DNS answer cannot change between the check
and the connection)."""


@dataclass
class _Call:
    endpoint: str
    namespace: str
    waiter: str
    driver_key: tuple[str, ...]
    started: float
    deadline: float

    def retry_after(self, now: float) -> float:
        """When a newcomer should try again: a call that has run for t seconds is, as a
        rule, not done before another t (quick calls come back quickly, stuck ones are
        not polled hard), and it is over by its deadline."""
        return max(MIN_RETRY_AFTER, min(now - self.started, self.deadline - now))


@dataclass(eq=False)
class _InLine:
    """A background call waiting in line for a slot (BACKGROUND_SLOT_WAIT): handed its
    ``_Call`` when a slot frees for it."""

    endpoint: str
    namespace: str
    waiter: str
    driver_key: tuple[str, ...]
    handed: asyncio.Future[_Call]


class BmcPool:
    def __init__(
        self, settings: BmcSettings | None = None, *, driver_factory: DriverFactory | None = None
    ) -> None:
        self.settings = settings or BmcSettings()
        self._make_driver = driver_factory or self._driver_for
        self.ipmi_workers = IpmiWorkers()
        self._drivers: dict[tuple[str, ...], PowerDriver] = {}
        self._last_used: dict[tuple[str, ...], float] = {}
        self._calls: list[_Call] = []
        self._freed = asyncio.Event()  # set (and replaced) whenever a call ends
        self._line: deque[_InLine] = deque()  # background calls waiting for a slot
        self._closing: set[asyncio.Task[None]] = set()
        self._erase_monitors: dict[tuple[str, str], str] = {}  # (system, drive) -> monitor
        self.turns = Turns()
        self.wake: Callable[[str], None] | None = None
        """Called with a waiter (``BmcTarget.waiter``) whose namespace's turn at an
        endpoint has come: the controller hands that host out again at once."""

    async def power_state(self, target: BmcTarget, *, background: bool = False) -> PowerState:
        """``background``: a routine poll, which leaves BACKGROUND_RESERVE slots (of the
        namespace's and of all) to calls that carry out or watch a change."""
        return await self._run(
            target, metrics.Operation.POWER_STATE, lambda d: d.power_state(), background
        )

    async def act(self, target: BmcTarget, action: PowerAction) -> None:
        """Send ``action`` (the type a policy decides in, unconverted) to the BMC."""
        await self._run(target, metrics.operation_of(action), lambda d: d.act(action))

    async def power_on(self, target: BmcTarget) -> None:
        await self.act(target, PowerAction.ON)

    async def power_off(self, target: BmcTarget, *, hard: bool) -> None:
        await self.act(target, PowerAction.HARD_OFF if hard else PowerAction.SOFT_OFF)

    # -- drives (bmc/storage.py): same bindings, slots and deadlines as power ------------

    async def drives(self, target: BmcTarget) -> list[Drive]:
        """Every local drive of the host's system, as its BMC serves them."""
        _refuse_storage_on_ipmi(target)
        return await self._run(
            target, metrics.Operation.DRIVES, lambda d: _storage(d, target).drives()
        )

    async def start_erase(self, target: BmcTarget, drive_id: str) -> str | None:
        """Start the BMC's secure erase of ``drive_id`` (a ``Drive.id`` from ``drives``);
        returns the task monitor to pass to ``erase_status`` (None: the BMC gave none)."""
        _refuse_storage_on_ipmi(target)
        monitor = await self._run(
            target,
            metrics.Operation.START_ERASE,
            lambda d: _storage(d, target).start_erase(drive_id),
        )
        if monitor is not None:  # followed by erase_status when the caller keeps none
            self._erase_monitors[(target.address.system_key, drive_id)] = monitor
        return monitor

    async def erase_status(
        self, target: BmcTarget, drive_id: str, monitor: str | None = None
    ) -> EraseStatus:
        """Where the erase of ``drive_id`` is (``EraseFailed`` when the BMC says it failed).
        Without ``monitor``, the one ``start_erase`` got in this process is followed, else
        (after a restart) what the Drive itself reports."""
        _refuse_storage_on_ipmi(target)
        monitor = monitor or self._erase_monitors.get((target.address.system_key, drive_id))
        status = await self._run(
            target,
            metrics.Operation.ERASE_STATUS,
            lambda d: _storage(d, target).erase_status(drive_id, monitor),
        )
        if status.finished:
            self._erase_monitors.pop((target.address.system_key, drive_id), None)
        return status

    async def erase_finished(
        self, target: BmcTarget, drive_id: str, monitor: str | None = None
    ) -> bool:
        return (await self.erase_status(target, drive_id, monitor)).finished

    async def close(self) -> None:
        drivers, self._drivers = list(self._drivers.values()), {}
        await asyncio.gather(*(_close(d) for d in drivers))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.ipmi_workers.close()

    # -- one call ---------------------------------------------------------------------

    async def _run(
        self,
        target: BmcTarget,
        operation: metrics.Operation,
        work: Callable[[PowerDriver], Awaitable[T]],
        background: bool = False,
    ) -> T:
        protocol = target.address.protocol
        try:
            call = await self._take_slots(target, _driver_key(target), background)
        except Busy:
            metrics.turned_away(protocol, operation)
            raise
        failure: BaseException | None = None
        try:
            return await self._call(target, call, work, background)
        except BaseException as error:
            failure = error
            raise
        finally:
            # Slot taken to answer (or deadline): what the host waited for at the BMC.
            seconds = time.monotonic() - call.started
            metrics.observe(protocol, operation, seconds, failure)

    async def _call(
        self,
        target: BmcTarget,
        call: _Call,
        work: Callable[[PowerDriver], Awaitable[T]],
        background: bool = False,
    ) -> T:
        timeout = self.settings.timeout
        key = call.driver_key
        self._last_used.pop(key, None)  # to the end: ``_last_used`` is kept oldest first
        self._last_used[key] = call.started
        self._expire_idle(call.started)
        try:
            async with asyncio.timeout(timeout):
                driver = self._drivers.get(key)
                if driver is None:
                    driver = await self._new_driver(target)
                    self._drivers[key] = driver
                answer = await work(driver)
            if background:
                # A routine poll: the next one is an interval away, longer than any BMC
                # keeps an idle connection, so it connects again either way. Closed now,
                # the connection's objects die young, where the garbage collector's cheap
                # young collections reclaim them; kept idle for seconds, those of 250
                # polls a second piled up as reference cycles in the oldest generation,
                # whose collection walks the whole heap (docs/scale.md, fix 9). The calls
                # of a change keep the connection for the calls that follow.
                driver.hang_up()
            return answer
        except TimeoutError:
            await self._forget(key)
            raise TimedOut(
                f"{target.address} did not answer within {timeout:g}s; the call was ended"
            ) from None
        except BmcError as error:
            await self._forget(key)
            limit = self.settings.max_message_chars
            if len(str(error)) > limit:  # drivers cap BMC texts; this is the last guard
                raise type(error)(cap(str(error), limit)) from None
            raise
        except asyncio.CancelledError:
            # The caller gave up: the driver was cut mid-call, so it is not reused. Closing
            # it must not delay the cancellation; it runs on its own.
            self._forget_later(key)
            raise
        except Exception:
            await self._forget(key)
            raise
        finally:
            self._release(call)

    async def _new_driver(self, target: BmcTarget) -> PowerDriver:
        # Refused raises here, before anything is sent to the address.
        every_host = target.credentials.every_host
        bmc_address.check_trust(
            target.address, target.verify_certificates, every_host, self.settings
        )
        vetted = await bmc_address.check_allowed(
            target.address, self.settings, every_host=every_host
        )
        return self._make_driver(target, vetted)

    def _driver_for(self, target: BmcTarget, vetted_ip: str | None) -> PowerDriver:
        creds, settings = target.credentials, self.settings
        if target.address.protocol == "ipmi":
            return IpmiDriver(
                target.address, creds.username, creds.password, settings, self.ipmi_workers,
                vetted_ip,
            )  # fmt: skip
        trust = bmc_address.check_trust(
            target.address, target.verify_certificates, creds.every_host, settings
        )
        verify: bool | str = trust is not None and (trust.ca_bundle or True)
        system_cas = trust is not None and trust.system_cas
        return RedfishDriver(
            target.address, creds.username, creds.password, verify, settings, vetted_ip,
            system_cas=system_cas,
        )  # fmt: skip

    # -- slots ------------------------------------------------------------------------

    async def _take_slots(
        self, target: BmcTarget, key: tuple[str, ...], background: bool = False
    ) -> _Call:
        endpoint, namespace = target.address.key, target.namespace
        loop = asyncio.get_running_loop()
        give_up = loop.time() + SLOT_WAIT
        while (blocker := self._blocker(endpoint, namespace, background)) is not None:
            why, busy, at_endpoint = blocker
            if background and not at_endpoint:  # only slots: wait in line for one
                return await self._wait_in_line(target, key, why, busy)
            left = give_up - loop.time()
            if left <= 0:
                now = time.monotonic()
                retry_after = _soonest_free(busy, now)
                if at_endpoint and target.waiter:
                    self.turns.wait(endpoint, namespace, target.waiter, now, retry_after)
                others = self._others(endpoint, namespace, now) if at_endpoint else 0
                raise Busy(f"{target.address}: {why}; trying again shortly", retry_after, others)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._freed.wait()
        return self._start(endpoint, namespace, target.waiter, key)

    def _start(self, endpoint: str, namespace: str, waiter: str, key: tuple[str, ...]) -> _Call:
        now = time.monotonic()
        call = _Call(endpoint, namespace, waiter, key, now, now + self.settings.timeout)
        self._calls.append(call)
        self.turns.started(endpoint, namespace, waiter)
        metrics.IN_FLIGHT.inc()
        return call

    async def _wait_in_line(
        self, target: BmcTarget, key: tuple[str, ...], why: str, busy: list[_Call]
    ) -> _Call:
        """A background call's wait for a slot: in line, handed one as it frees
        (``_hand_over``), or ``Busy`` after BACKGROUND_SLOT_WAIT."""
        handed: asyncio.Future[_Call] = asyncio.get_running_loop().create_future()
        place = _InLine(target.address.key, target.namespace, target.waiter, key, handed)
        self._line.append(place)
        try:
            async with asyncio.timeout(BACKGROUND_SLOT_WAIT):
                return await asyncio.shield(handed)
        except TimeoutError:
            if handed.done():  # handed a slot as the wait ran out: take it
                return handed.result()
            now = time.monotonic()
            retry_after = _soonest_free(busy, now)
            raise Busy(f"{target.address}: {why}; trying again shortly", retry_after, 0) from None
        except asyncio.CancelledError:
            if handed.done():  # handed a slot it will never use: give it back
                self._release(handed.result())
            raise
        finally:
            if not handed.done():
                handed.cancel()
                self._line.remove(place)

    def _blocker(
        self, endpoint: str, namespace: str, background: bool = False
    ) -> tuple[str, list[_Call], bool] | None:
        """Why a call for ``endpoint`` in ``namespace`` cannot start now, the calls it
        waits for, and whether it waits for the endpoint itself; None when it can."""
        now = time.monotonic()
        same_bmc = [c for c in self._calls if c.endpoint == endpoint]
        if same_bmc:
            others = self._others(endpoint, namespace, now)
            return f"waiting for BMC endpoint {endpoint}, {_busy_with(others)}", same_bmc, True
        turn = self.turns.turn(endpoint, namespace, now)
        if turn is not None and turn != namespace:
            others = self._others(endpoint, namespace, now)
            return (
                f"waiting for BMC endpoint {endpoint}: namespace {turn!r} has the turn,"
                f" {_busy_with(others)}",
                [],
                True,
            )
        reserve = BACKGROUND_RESERVE if background else 0
        same_tenant = [c for c in self._calls if c.namespace == namespace]
        if len(same_tenant) >= self.settings.max_in_flight_per_namespace - reserve:
            return (
                f"namespace {namespace!r} already has"
                f" {len(same_tenant)} BMC calls in flight, its share",
                same_tenant,
                False,
            )
        if len(self._calls) >= self.settings.max_in_flight - reserve:
            return f"all {len(self._calls)} BMC call slots are in use", list(self._calls), False
        return None

    def _others(self, endpoint: str, namespace: str, now: float) -> int:
        """Calls of other namespaces a call of ``namespace`` waits behind at ``endpoint``:
        the one under way (if another namespace's) and one per other namespace in line."""
        running = sum(1 for c in self._calls if c.endpoint == endpoint and c.namespace != namespace)
        return running + self.turns.ahead(endpoint, namespace, now)

    def waiting_samples(self) -> dict[str, int]:
        """Calls waiting in line for a busy BMC endpoint, by namespace (for /metrics)."""
        return dict(self.turns.waiting_by_namespace(time.monotonic()))

    def _hand_over(self) -> None:
        """A slot freed: the background calls in line take what they may now, in the order
        they came (each keeps BACKGROUND_RESERVE free, as it would have on its own)."""
        for place in list(self._line):
            if len(self._calls) >= self.settings.max_in_flight - BACKGROUND_RESERVE:
                return  # every slot a background call may take is taken
            if self._blocker(place.endpoint, place.namespace, True) is None:
                self._line.remove(place)
                call = self._start(place.endpoint, place.namespace, place.waiter, place.driver_key)
                place.handed.set_result(call)

    def _release(self, call: _Call) -> None:
        # Synchronous: a cancellation arriving now cannot leave the slot taken.
        self._calls.remove(call)
        metrics.IN_FLIGHT.dec()
        self._hand_over()
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()
        if any(c.endpoint == call.endpoint for c in self._calls):
            return
        waiter = self.turns.freed(call.endpoint, time.monotonic())
        if waiter is not None and self.wake is not None:
            try:
                self.wake(waiter)
            except Exception:  # a waker must not keep the slot taken; the waiter retries
                log.exception("waking a BMC waiter failed")

    # -- dropping drivers -------------------------------------------------------------

    def _expire_idle(self, now: float) -> None:
        """Drop the drivers unused for DRIVER_IDLE. ``_last_used`` is in order of last use,
        so the walk stops at the first driver used since: a call costs the drivers it
        expires, not one look at every driver (at 5,000 hosts that look, on every call,
        was a sixth of the controller's CPU: benchmarks/scale.py)."""
        expired = []
        for key, used in self._last_used.items():
            if now - used <= DRIVER_IDLE:
                break
            expired.append(key)
        if not expired:
            return
        in_use = {c.driver_key for c in self._calls}
        for key in expired:
            if key not in in_use:
                self._forget_later(key)

    async def _forget(self, key: tuple[str, ...]) -> None:
        self._last_used.pop(key, None)
        driver = self._drivers.pop(key, None)
        if driver is not None:
            await _close(driver)

    def _forget_later(self, key: tuple[str, ...]) -> None:
        self._last_used.pop(key, None)
        driver = self._drivers.pop(key, None)
        if driver is not None:
            task = asyncio.get_running_loop().create_task(_close(driver))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


async def _close(driver: PowerDriver) -> None:
    try:
        async with asyncio.timeout(CLOSE_WAIT):
            await driver.close()
    except Exception as error:  # close never raises by contract; a broken one must not either
        log.debug("closing a BMC driver: %s", type(error).__name__)


def _refuse_storage_on_ipmi(target: BmcTarget) -> None:
    # Before a slot is taken: IPMI has no notion of drives, so nothing is sent.
    if target.address.protocol == "ipmi":
        raise Unsupported(f"{target.address}: IPMI cannot list or erase drives; use Redfish")


def _storage(driver: PowerDriver, target: BmcTarget) -> StorageDriver:
    if not isinstance(driver, StorageDriver):
        raise Unsupported(f"{target.address}: this BMC's driver cannot list or erase drives")
    return driver


def _soonest_free(busy: list[_Call], now: float) -> float:
    """Seconds until the first of the ``busy`` calls should be done (TURN_HOLD: none):
    what a Busy tells its caller to wait."""
    return min((c.retry_after(now) for c in busy), default=TURN_HOLD)


def _busy_with(others: int) -> str:
    if not others:
        return "busy with another call of this namespace"
    return f"busy with {others} call{'s' if others != 1 else ''} of other namespaces"


def _driver_key(target: BmcTarget) -> tuple[str, ...]:
    """One driver per endpoint, system, credentials and certificate check. The credentials
    enter as a digest so that the password is not kept as a dictionary key."""
    creds = target.credentials
    material = (
        f"{creds.username}\0{creds.password}\0{target.verify_certificates}\0{creds.every_host}"
    )
    return (target.address.system_key, hashlib.sha256(material.encode()).hexdigest())
