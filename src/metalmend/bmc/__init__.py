"""Power control of bare-metal servers through their BMCs, with no Ironic in between.

``BmcPool`` is the one async entry point: power state, power on, power off (soft or hard),
one driver per system (never another system behind the same endpoint), at most one call
in flight per BMC endpoint, a share per namespace and a global limit, ``Busy`` instead of
waiting behind a busy BMC, and a deadline that really ends every call. The driver is
chosen by the BareMetalHost's ``spec.bmc.address`` (``address.parse``); ``BmcSettings``
holds every limit.
"""

from metalmend.bmc.address import BmcAddress, parse
from metalmend.bmc.driver import PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BadAddress,
    BmcError,
    Busy,
    CredentialsError,
    Refused,
    TimedOut,
    Unreachable,
    Unsupported,
)
from metalmend.bmc.pool import BmcPool, BmcTarget, Credentials
from metalmend.bmc.settings import BmcSettings

__all__ = [
    "AuthenticationFailed",
    "BadAddress",
    "BmcAddress",
    "BmcError",
    "BmcPool",
    "BmcSettings",
    "BmcTarget",
    "Busy",
    "Credentials",
    "CredentialsError",
    "PowerState",
    "Refused",
    "TimedOut",
    "Unreachable",
    "Unsupported",
    "parse",
]
