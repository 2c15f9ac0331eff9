"""Power control of bare-metal servers through their BMCs, with no Ironic in between.

``BmcPool`` is the one async entry point: power state, power on, power off (soft or hard),
with at most one command in flight per BMC, a global limit, and a timeout on every call.
The driver is chosen by the BareMetalHost's ``spec.bmc.address`` (``address.parse``).
"""

from metalmend.bmc.address import BmcAddress, parse
from metalmend.bmc.driver import PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BadAddress,
    BmcError,
    CredentialsError,
    TimedOut,
    Unreachable,
    Unsupported,
)
from metalmend.bmc.pool import BmcPool, BmcTarget, Credentials

__all__ = [
    "AuthenticationFailed",
    "BadAddress",
    "BmcAddress",
    "BmcError",
    "BmcPool",
    "BmcTarget",
    "Credentials",
    "CredentialsError",
    "PowerState",
    "TimedOut",
    "Unreachable",
    "Unsupported",
    "parse",
]
