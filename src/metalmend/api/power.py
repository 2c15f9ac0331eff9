"""The power vocabulary shared by the policies and the BMC drivers: what a host's power
is, and what may be done to it. One type from policy to driver."""

from __future__ import annotations

from enum import StrEnum


class PowerState(StrEnum):
    ON = "on"
    OFF = "off"


class PowerAction(StrEnum):
    ON = "on"
    SOFT_OFF = "soft off"
    HARD_OFF = "hard off"
