"""IPMI through pyghmi: chassis power status and chassis control."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from pyghmi import exceptions as ipmi_errors
from pyghmi.ipmi import command as ipmi_command

from metalmend.bmc.address import BmcAddress
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BmcError,
    TimedOut,
    Unreachable,
    Unsupported,
    scrub,
)

T = TypeVar("T")

# Our vocabulary -> IPMI chassis control, as pyghmi names it.
CHASSIS_CONTROL = {
    PowerAction.ON: "on",
    PowerAction.SOFT_OFF: "shutdown",  # ACPI soft shutdown
    PowerAction.HARD_OFF: "off",
}

_AUTH_MARKERS = ("unauthorized", "password", "insufficient privilege", "username")


class IpmiDriver:
    def __init__(self, address: BmcAddress, username: str, password: str) -> None:
        self.address = address
        self._username = username
        self._password = password
        self._session: Any = None

    def power_state(self) -> PowerState:
        answer = self._call(lambda c: c.get_power())
        return PowerState.OFF if answer.get("powerstate") == "off" else PowerState.ON

    def act(self, action: PowerAction) -> None:
        self._call(lambda c: c.set_power(CHASSIS_CONTROL[action], wait=False))

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            # The BMC may be gone; the session dies with it.
            with contextlib.suppress(Exception):
                session.ipmi_session.logout()

    def _call(self, work: Callable[[Any], T]) -> T:
        try:
            if self._session is None:
                self._session = ipmi_command.Command(
                    bmc=self.address.host,
                    userid=self._username,
                    password=self._password,
                    port=self.address.port,
                    keepalive=False,
                )
            return work(self._session)
        except ipmi_errors.IpmiException as error:
            self.close()
            text = scrub(str(error), self._password)
            lowered = text.lower()
            if any(marker in lowered for marker in _AUTH_MARKERS):
                raise AuthenticationFailed(f"{self.address} refused the credentials") from None
            if "timeout" in lowered or "timed out" in lowered or "no response" in lowered:
                if _port_closed(self.address):
                    raise Unreachable(f"cannot reach {self.address}: port closed") from None
                raise TimedOut(f"{self.address} did not answer") from None
            if getattr(error, "ipmicode", 0) in (0xC1, 0xCC):
                raise Unsupported(f"{self.address} refused the command: {text}") from None
            raise BmcError(f"{self.address}: {text}") from None
        except Exception as error:  # pyghmi raises more than IpmiException
            self.close()
            text = scrub(str(error), self._password)
            raise BmcError(f"{self.address}: {type(error).__name__}: {text}") from None


# An RMCP/ASF presence ping. We do not need the answer: on a connected UDP socket, a closed
# port comes back as ICMP port-unreachable (ECONNREFUSED), which tells "nothing listens
# there" apart from "a BMC that does not answer".
_PRESENCE_PING = bytes.fromhex("0600ff06000011be80000000")


def _port_closed(address: BmcAddress, wait: float = 0.3) -> bool:
    try:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.settimeout(wait)
            probe.connect((address.host, address.port or 623))
            probe.send(_PRESENCE_PING)
            probe.recv(512)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False
