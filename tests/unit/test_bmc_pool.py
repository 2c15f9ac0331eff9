"""BmcPool's limits, with a driver that only counts (no BMC needed)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from metalmend.bmc import BmcPool, BmcTarget, Credentials, PowerState, TimedOut, parse
from metalmend.bmc.driver import PowerAction


class CountingDriver:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.active = 0
        self.most = 0
        self._lock = threading.Lock()

    def power_state(self) -> PowerState:
        with self._lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.seconds)
        with self._lock:
            self.active -= 1
        return PowerState.ON

    def act(self, action: PowerAction) -> None:
        self.power_state()

    def close(self) -> None:
        pass


def target(port: int) -> BmcTarget:
    return BmcTarget(parse(f"ipmi://127.0.0.1:{port}"), Credentials("u", "p"))


async def test_one_command_at_a_time_per_bmc_but_bmcs_in_parallel() -> None:
    pool = BmcPool(timeout=5)
    drivers = {1: CountingDriver(0.05), 2: CountingDriver(0.05)}
    pool._driver = lambda t: drivers[t.address.port]  # type: ignore[method-assign]
    await asyncio.gather(*(pool.power_state(target(p)) for p in (1, 2) for _ in range(4)))
    assert drivers[1].most == 1
    assert drivers[2].most == 1
    pool.close()


async def test_global_limit() -> None:
    pool = BmcPool(timeout=5, max_in_flight=2)
    shared = CountingDriver(0.05)
    pool._driver = lambda t: shared  # type: ignore[method-assign]
    await asyncio.gather(*(pool.power_state(target(p)) for p in range(6)))
    assert shared.most == 2
    pool.close()


async def test_a_timed_out_command_keeps_its_bmc_busy_until_it_really_ends() -> None:
    pool = BmcPool(timeout=0.2)
    stuck = CountingDriver(0.6)
    pool._driver = lambda t: stuck  # type: ignore[method-assign]
    with pytest.raises(TimedOut, match=r"did not answer in 0\.2s"):
        await pool.power_state(target(1))
    with pytest.raises(TimedOut, match="busy"):
        await pool.power_off(target(1), hard=True)  # waits for the slot, in vain
    assert stuck.most == 1, "never two commands in flight on one BMC"
    await asyncio.sleep(0.5)
    stuck.seconds = 0.0
    assert await pool.power_state(target(1)) == PowerState.ON
    pool.close()
