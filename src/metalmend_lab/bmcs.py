"""The lab's BMCs.

- IPMI hosts: the power lives here (``HostPower``), behind a pyghmi BMC on its own UDP
  port (``start_ipmi_bmcs``); every command is journalled for the benchmarks.
- Redfish hosts: the power lives in sushy-tools' emulator (started by ``lab.hosts``, fake
  driver); ``RedfishPower`` reads it through Redfish, for the kubelet simulator.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from metalmend_lab.inventory import HostSpec

log = logging.getLogger("metalmend_lab.bmcs")


class HostPower:
    """The power of one IPMI host. Changes land ``delay`` seconds after the command, as on
    real hardware; the BMC thread and the kubelet read it concurrently."""

    def __init__(
        self, on: bool, delay: float, journal: Path | None = None, clients: Path | None = None
    ) -> None:
        self.journal = journal  # every command received, with its wall-clock time
        self.clients = clients  # every command again, with the BMC user who sent it
        self._lock = threading.Lock()
        self._on = on
        self.boots = 1 if on else 0  # power-ons so far: a new one is a new boot
        self._pending: tuple[bool, float] | None = None
        self.delay = delay
        self.ignore_soft = False

    def is_on(self) -> bool:
        with self._lock:
            if self._pending is not None and time.monotonic() >= self._pending[1]:
                if self._pending[0] and not self._on:
                    self.boots += 1
                self._on, self._pending = self._pending[0], None
            return self._on

    def boot(self) -> int | None:
        """None while off; otherwise which boot this is (changes with every power-on, however
        short the power was off)."""
        return self.boots if self.is_on() else None

    def request(self, on: bool, soft: bool = False, by: str = "") -> None:
        action = "on" if on else ("soft off" if soft else "hard off")
        self._journal(action)
        journal_client(self.clients, action, by)
        if soft and self.ignore_soft:
            return
        with self._lock:
            self._pending = (on, time.monotonic() + self.delay)
        self.is_on()

    def read_by_client(self) -> bool:
        """The power as the BMC answers a client's read, journalled as "status" so that
        benchmarks can count BMC reads (the kubelet reads ``is_on`` directly, unjournalled)."""
        self._journal("status")
        return self.is_on()

    def _journal(self, action: str) -> None:
        if self.journal is not None:
            with self.journal.open("a") as journal:
                journal.write(f"{time.time():.6f} {action}\n")


def journal_client(path: Path | None, action: str, user: str) -> None:
    """``<time> <user> <action>`` in ``<lab>/hardware/<host>.clients``: which BMC account sent
    each power command (the e2e tests of fencing beside the BMO stand-in read it)."""
    if path is not None:
        with path.open("a") as clients:
            clients.write(f"{time.time():.6f} {user or '-'} {action}\n")


def _refuse_unsupported_ciphers(session_class: Any) -> None:
    """pyghmi's BMC implements only cipher suite 3 (HMAC-SHA1) but answers a request for
    suite 17 (SHA-256) as if it had agreed, so a client that asks for 17 first (pyghmi's
    own) fails in RAKP. A real BMC refuses an algorithm it lacks (RMCP+ status 0x04,
    invalid authentication algorithm) and the client falls back to suite 3; make the lab
    BMC do that."""
    original = session_class.create_open_session_response
    if getattr(original, "refuses_unsupported", False):
        return

    def create_open_session_response(self: Any, request: bytearray) -> bytearray:
        requested_auth = request[12] if len(request) > 12 else 1
        if requested_auth != 1:  # 1 = RAKP-HMAC-SHA1
            self.clientsessionid = request[4:8]
            return bytearray([request[0], 0x04, 0, 0]) + request[4:8] + bytearray(4)
        response: bytearray = original(self, request)
        return response

    create_open_session_response.refuses_unsupported = True  # type: ignore[attr-defined]
    session_class.create_open_session_response = create_open_session_response


def _refuse_unknown_names(session_class: Any) -> None:
    """pyghmi's BMC drops a RAKP message 1 naming a user it does not know ("don't think
    about invalid usernames for now"), so the client waits out its deadline and reports a
    BMC that does not answer. A real BMC answers RAKP message 2 with status 0x0D,
    "unauthorized name" (IPMI 2.0, section 13.31 and table 13-15), which clients report
    as a refused login; make the lab BMC do that."""
    original = session_class._got_rakp1
    if getattr(original, "refuses_unknown_names", False):
        return

    def _got_rakp1(self: Any, data: Any) -> None:
        named = len(data) > 28 and data[27] != 0
        if named and self.authdata.get(bytes(data[28:]).decode("utf-8", "replace")) is None:
            # tag, status "unauthorized name", reserved, the console's session id
            refusal = bytearray([data[0], 0x0D, 0, 0]) + self.clientsessionid
            self.send_payload(refusal, RAKP2_PAYLOAD, retry=False)
            return
        original(self, data)

    _got_rakp1.refuses_unknown_names = True  # type: ignore[attr-defined]
    session_class._got_rakp1 = _got_rakp1


RAKP2_PAYLOAD = 0x13  # RMCP+ payload type of RAKP message 2 (IPMI 2.0, table 13-16)


def start_ipmi_bmcs(hosts: list[tuple[HostSpec, HostPower]]) -> threading.Thread | None:
    """All lab IPMI BMCs share pyghmi's session loop, in one daemon thread."""
    if not hosts:
        return None
    from pyghmi.ipmi import bmc as pyghmi_bmc
    from pyghmi.ipmi.private import serversession

    from metalmend.bmc import ipmi_wakeup

    _refuse_unsupported_ciphers(serversession.ServerSession)
    _refuse_unknown_names(serversession.ServerSession)
    # pyghmi's BMC loop has the client's lost wake-up too: a request that arrives while it
    # is about to wait sat unread until the client retransmitted (0.5-1 s later).
    ipmi_wakeup.install()

    class LabBmc(pyghmi_bmc.Bmc):  # type: ignore[misc]
        def __init__(self, spec: HostSpec, power: HostPower) -> None:
            accounts = {spec.username: spec.password}
            if spec.standin_password:  # the BMO stand-in's own account (lab.bmostandin)
                accounts[f"bmo-{spec.name}"] = spec.standin_password
            super().__init__(accounts, port=spec.internal_port, address="127.0.0.1")
            self.power = power
            self.user = ""  # who sent the request being handled (one loop thread)

        def handle_raw_request(self, request: Any, session: Any) -> Any:
            name = getattr(session, "username", b"")
            self.user = name.decode("utf-8", "replace") if isinstance(name, bytes) else ""
            return super().handle_raw_request(request, session)

        def get_power_state(self) -> str:
            return "on" if self.power.read_by_client() else "off"

        def power_on(self) -> None:
            self.power.request(True, by=self.user)

        def power_off(self) -> None:
            self.power.request(False, by=self.user)

        def power_shutdown(self) -> None:
            self.power.request(False, soft=True, by=self.user)

        def power_reset(self) -> None:
            self.power.request(False, by=self.user)
            self.power.request(True, by=self.user)

        power_cycle = power_reset

    for spec, power in hosts:
        LabBmc(spec, power)
    thread = threading.Thread(target=pyghmi_bmc.Bmc.listen, name="ipmi-bmcs", daemon=True)
    thread.start()
    return thread


class RedfishPower:
    def __init__(self, spec: HostSpec, ca_file: str) -> None:
        context = ssl.create_default_context(cafile=ca_file)
        self._http = httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{spec.internal_port}",
            auth=(spec.username, spec.password),
            verify=context,
            timeout=5.0,
        )
        # The query marks the kubelet's reads in the emulator's access log, where
        # benchmarks count the BMC client's (metalmend's) reads; the emulator ignores it.
        self._path = f"/redfish/v1/Systems/{spec.system_id}?reader=kubelet"
        self.last = False
        self.boots = 0

    async def boot(self) -> int | None:
        """As HostPower.boot, from Redfish's PowerState (the fake driver's changes take
        seconds, so every off is observed)."""
        try:
            answer = await self._http.get(self._path)
            on = answer.raise_for_status().json().get("PowerState") == "On"
            if on and not self.last:
                self.boots += 1
            self.last = on
        except (httpx.HTTPError, ValueError) as error:
            log.warning("cannot read power of %s: %s", self._path, error)
        return self.boots if self.last else None
