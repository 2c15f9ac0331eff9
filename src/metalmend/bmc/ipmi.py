"""IPMI through pyghmi: chassis power status and chassis control."""

from __future__ import annotations

import hashlib
import socket
import threading
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

_COMMANDS: dict[tuple[str, str, bytes], Any] = {}
_COMMANDS_LOCK = threading.Lock()

# Our vocabulary -> IPMI chassis control, as pyghmi names it.
CHASSIS_CONTROL = {
    PowerAction.ON: "on",
    PowerAction.SOFT_OFF: "shutdown",  # ACPI soft shutdown
    PowerAction.HARD_OFF: "off",
}

_AUTH_MARKERS = ("unauthorized", "password", "insufficient privilege", "username")


class IpmiDriver:
    def __init__(
        self, address: BmcAddress, username: str, password: str, timeout: float = 10.0
    ) -> None:
        self.address = address
        self._timeout = timeout
        self._username = username
        self._password = password
        self._session: Any = None

    def power_state(self) -> PowerState:
        answer = self._call(lambda c: c.get_power())
        return PowerState.OFF if answer.get("powerstate") == "off" else PowerState.ON

    def act(self, action: PowerAction) -> None:
        self._call(lambda c: c.set_power(CHASSIS_CONTROL[action], wait=False))

    def _preflight(self) -> None:
        # Before pyghmi logs in: pyghmi keeps process-wide session state, and a login to a
        # BMC that is not there lingers in it; ask first whether anyone answers.
        answer = probe(self.address.host, self.address.port or 623, min(self._timeout, 3.0))
        if answer == "refused":
            raise Unreachable(f"cannot reach {self.address}: nothing listens on that port")
        if answer == "silent":
            raise TimedOut(f"{self.address} did not answer")

    def close(self) -> None:
        self._session = None

    def _command(self) -> Any:
        """pyghmi shares one session per BMC and user across the whole process, and a
        second Command for a live session waits on it forever; so Commands are kept in
        one process-wide table too, and replaced only when their session broke."""
        key = (self.address.key, self._username, hashlib.sha256(self._password.encode()).digest())
        with _COMMANDS_LOCK:
            command = _COMMANDS.get(key)
            session = getattr(command, "ipmi_session", None)
            if command is None or session is None or session.broken or not session.logged:
                self._preflight()
                command = ipmi_command.Command(
                    bmc=self.address.host,
                    userid=self._username,
                    password=self._password,
                    port=self.address.port,
                )
                _COMMANDS[key] = command
            return command

    def _call(self, work: Callable[[Any], T]) -> T:
        try:
            if self._session is None:
                self._session = self._command()
            return work(self._session)
        except BmcError:
            raise
        except ipmi_errors.IpmiException as error:
            self.close()
            text = scrub(str(error), self._password)
            lowered = text.lower()
            if any(marker in lowered for marker in _AUTH_MARKERS):
                raise AuthenticationFailed(f"{self.address} refused the credentials") from None
            if "timeout" in lowered or "timed out" in lowered or "no response" in lowered:
                raise TimedOut(f"{self.address} did not answer") from None
            if getattr(error, "ipmicode", 0) in (0xC1, 0xCC):
                raise Unsupported(f"{self.address} refused the command: {text}") from None
            raise BmcError(f"{self.address}: {text}") from None
        except Exception as error:  # pyghmi raises more than IpmiException
            self.close()
            text = scrub(str(error), self._password)
            raise BmcError(f"{self.address}: {type(error).__name__}: {text}") from None


# IPMI 2.0 "Get Channel Authentication Capabilities", sent outside any session: every BMC
# answers it before a login (it is how clients discover what the BMC supports).
_AUTH_CAPABILITIES = bytes.fromhex("0600ff07000000000000000000092018c88100388e04b5")


def probe(host: str, port: int, wait: float) -> str:
    """ "answers", "refused" (nothing listens: ICMP port unreachable) or "silent".

    On a connected UDP socket a closed port comes back as ECONNREFUSED, which tells
    "no BMC there" apart from "a BMC that does not answer"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(wait)
        try:
            sock.connect((host, port))
            sock.send(_AUTH_CAPABILITIES)
            sock.recv(512)
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return "silent"
    return "answers"
