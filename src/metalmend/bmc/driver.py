"""The power vocabulary every driver speaks. Drivers are blocking (the protocol libraries
are); BmcPool runs them in threads."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"


class PowerAction(StrEnum):
    ON = "on"
    SOFT_OFF = "soft off"
    HARD_OFF = "hard off"


class PowerDriver(Protocol):
    def power_state(self) -> PowerState:
        """Reported state. Anything but a definite "off" is ON: fencing must never mistake
        a host that is still powering down for one that is off."""
        ...

    def act(self, action: PowerAction) -> None: ...

    def close(self) -> None: ...
