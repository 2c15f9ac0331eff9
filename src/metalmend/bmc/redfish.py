"""Redfish through sushy. Reading this is reading Redfish: a ComputerSystem's PowerState,
and its Reset action with a ResetType."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import sushy
from sushy import exceptions as sushy_errors

from metalmend.bmc.address import BmcAddress
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BadAddress,
    BmcError,
    TimedOut,
    Unreachable,
    Unsupported,
    scrub,
)

T = TypeVar("T")

# Our vocabulary -> Redfish ComputerSystem.Reset ResetType.
RESET_TYPE = {
    PowerAction.ON: sushy.ResetType.ON,
    PowerAction.SOFT_OFF: sushy.ResetType.GRACEFUL_SHUTDOWN,
    PowerAction.HARD_OFF: sushy.ResetType.FORCE_OFF,
}


class RedfishDriver:
    def __init__(
        self,
        address: BmcAddress,
        username: str,
        password: str,
        verify: bool | str,
        timeout: float,
    ) -> None:
        self.address = address
        self._username = username
        self._password = password
        self._verify = verify
        self._timeout = timeout
        self._root: sushy.Sushy | None = None

    def power_state(self) -> PowerState:
        state = self._call(lambda: self._system().power_state)  # refreshed on each get
        return PowerState.OFF if state == sushy.PowerState.OFF else PowerState.ON

    def act(self, action: PowerAction) -> None:
        reset_type = RESET_TYPE[action]

        def reset() -> None:
            system = self._system()
            allowed = system.get_allowed_reset_system_values()
            if allowed and reset_type not in allowed:
                names = ", ".join(sorted(v.value for v in allowed))
                raise Unsupported(f"{self.address} does not offer {reset_type.value} ({names})")
            system.reset_system(reset_type)

        self._call(reset)

    def close(self) -> None:
        if self._root is not None:
            # A dead BMC's session cannot be logged out; there is nothing more to do.
            with contextlib.suppress(Exception):
                self._root.close()
            self._root = None

    def _system(self) -> Any:
        if self._root is None:
            self._root = sushy.Sushy(
                self.address.endpoint,
                verify=self._verify,
                auth=sushy.auth.SessionOrBasicAuth(self._username, self._password),
                read_timeout=self._timeout,
                connect_timeout=self._timeout,
                server_side_retries=1,  # our own retries and timeouts govern
                server_side_retries_delay=0,
            )
        system = self._root.get_system(self.address.system_path or None)
        return system

    def _call(self, work: Callable[[], T]) -> T:
        try:
            return work()
        except BmcError:
            raise
        except sushy_errors.AccessError:
            self.close()
            raise AuthenticationFailed(f"{self.address} refused the credentials") from None
        except sushy_errors.ResourceNotFoundError:
            raise BadAddress(f"no Redfish system at {self.address}") from None
        except sushy_errors.ConnectionError as error:
            self.close()
            text = scrub(str(error), self._password)
            if "timed out" in text.lower() or "timeout" in text.lower():
                raise TimedOut(f"{self.address} did not answer in {self._timeout:g}s") from None
            raise Unreachable(f"cannot reach {self.address}: {_reason(text)}") from None
        except Exception as error:  # sushy and requests raise more than SushyError
            self.close()
            text = scrub(str(error), self._password)
            raise BmcError(f"{self.address}: {type(error).__name__}: {text}") from None


def _reason(text: str) -> str:
    for marker in ("Connection refused", "No route to host", "Name or service not known"):
        if marker in text:
            return marker
    return text[-200:]
