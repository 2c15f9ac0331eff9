"""The power vocabulary every driver speaks, and the driver interface.

Drivers are asynchronous so that a call can really be ended at its deadline: the pool
wraps every call in ``asyncio.timeout`` and a driver must stop all work (close its
connection, kill its helper process) when cancelled. A blocking library may be used
only behind a boundary that cancellation can cut (a child process), never in a thread
that may live on after its caller gave up.
"""

from __future__ import annotations

from typing import Protocol

from metalmend.api.power import PowerAction, PowerState

__all__ = ["PowerAction", "PowerDriver", "PowerState"]


class PowerDriver(Protocol):
    async def power_state(self) -> PowerState:
        """Reported state of the one system the host names. Anything but a definite "off"
        is ON: fencing must never mistake a host that is still powering down for one that
        is off."""
        ...

    async def act(self, action: PowerAction) -> None:
        """Send ``action`` to the one system the host names."""
        ...

    async def close(self) -> None:
        """Drop sessions and connections; never raises."""
        ...

    def hang_up(self) -> None:
        """Nothing more is expected of this BMC soon (a routine poll was answered): close
        the connection now rather than keep it idle; what was found about the system is
        kept. Never raises; the closing, if any, runs on its own."""
        ...
