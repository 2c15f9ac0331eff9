"""BmcPool: the async face of the drivers, with the limits that keep BMCs healthy.

- At most one command in flight per BMC: BMCs are small computers that mishandle
  concurrent sessions. A command that times out keeps its BMC's slot until its thread
  really finishes, so a timeout never lets a second command overlap a stuck one.
- At most ``max_in_flight`` commands in flight overall.
- Every call has a timeout; drivers are blocking and run in a thread pool.
- Drivers (and so Redfish sessions) are kept per BMC and credentials, and dropped on error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from metalmend.bmc.address import BmcAddress
from metalmend.bmc.driver import PowerAction, PowerDriver, PowerState
from metalmend.bmc.errors import BmcError, TimedOut, scrub
from metalmend.bmc.ipmi import IpmiDriver
from metalmend.bmc.redfish import RedfishDriver

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class BmcTarget:
    """Everything needed to reach one host's BMC."""

    address: BmcAddress
    credentials: Credentials
    verify_certificates: bool = True


class BmcPool:
    def __init__(
        self,
        *,
        timeout: float = 30.0,
        max_in_flight: int = 16,
        ca_bundle: str | None = None,
    ) -> None:
        self.timeout = timeout
        self.ca_bundle = ca_bundle
        self._global = asyncio.Semaphore(max_in_flight)
        self._locks: dict[str, asyncio.Lock] = {}
        self._drivers: dict[tuple[str, str], PowerDriver] = {}

    async def power_state(self, target: BmcTarget) -> PowerState:
        return await self._run(target, lambda d: d.power_state())

    async def power_on(self, target: BmcTarget) -> None:
        await self._run(target, lambda d: d.act(PowerAction.ON))

    async def power_off(self, target: BmcTarget, *, hard: bool) -> None:
        action = PowerAction.HARD_OFF if hard else PowerAction.SOFT_OFF
        await self._run(target, lambda d: d.act(action))

    def close(self) -> None:
        for driver in self._drivers.values():
            driver.close()
        self._drivers.clear()

    async def _run(self, target: BmcTarget, work: Callable[[PowerDriver], T]) -> T:
        lock = self._locks.setdefault(target.address.key, asyncio.Lock())
        await self._acquire(lock, target)
        try:
            await self._acquire(self._global, target)
        except BaseException:
            lock.release()
            raise
        driver = self._driver(target)
        future = _in_daemon_thread(work, driver)

        def release(_: object) -> None:
            self._global.release()
            lock.release()

        future.add_done_callback(release)  # only when the thread is really done
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            self._forget(target)
            raise TimedOut(f"{target.address} did not answer in {self.timeout:g}s") from None
        except BmcError as error:
            self._forget(target)
            raise type(error)(scrub(str(error), target.credentials.password)) from None

    async def _acquire(self, lock: asyncio.Lock | asyncio.Semaphore, target: BmcTarget) -> None:
        try:
            await asyncio.wait_for(lock.acquire(), self.timeout)
        except TimeoutError:
            raise TimedOut(f"{target.address} is busy with a command that does not end") from None

    def _driver(self, target: BmcTarget) -> PowerDriver:
        key = (target.address.key, _fingerprint(target))
        driver = self._drivers.get(key)
        if driver is None:
            creds = target.credentials
            if target.address.protocol == "ipmi":
                driver = IpmiDriver(target.address, creds.username, creds.password, self.timeout)
            else:
                verify: bool | str = target.verify_certificates and (self.ca_bundle or True)
                driver = RedfishDriver(
                    target.address, creds.username, creds.password, verify, self.timeout
                )
            self._drivers[key] = driver
        return driver

    def _forget(self, target: BmcTarget) -> None:
        driver = self._drivers.pop((target.address.key, _fingerprint(target)), None)
        if driver is not None:
            _in_daemon_thread(lambda d: d.close(), driver)


def _in_daemon_thread(work: Callable[[U], T], argument: U) -> asyncio.Future[T]:
    """Run blocking ``work`` in a daemon thread of its own. Not an executor: a BMC that
    never answers would hold an executor's thread, and the process could not exit until
    it did; a daemon thread dies with the process."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while we worked
            loop.call_soon_threadsafe(outcome)

    def finish(result: T | None, failure: BaseException | None) -> None:
        if future.done():  # the caller gave up waiting (timed out, cancelled)
            return
        if failure is not None:
            future.set_exception(failure)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = work(argument)
        except BaseException as failure:
            settle(functools.partial(finish, None, failure))
        else:
            settle(functools.partial(finish, result, None))

    threading.Thread(target=run, name="bmc", daemon=True).start()
    return future


def _fingerprint(target: BmcTarget) -> str:
    # Keyed by a digest so that the password is not kept as a dictionary key.
    creds = target.credentials
    material = f"{creds.username}\0{creds.password}\0{target.verify_certificates}"
    return hashlib.sha256(material.encode()).hexdigest()
