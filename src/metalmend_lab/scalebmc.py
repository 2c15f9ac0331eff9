"""BMCs for thousands of lab hosts in one process: ``python -m metalmend_lab.scalebmc FILE``.

The lab's sushy-tools emulator (``lab.emulator``) is a Flask application that serves every
system from one endpoint, one request at a time; its per-host IPMI BMCs are one socket and
one pyghmi object each. Neither reaches 5,000 hosts on a small machine. This server speaks
the same Redfish that metalmend's driver reads (``bmc.redfish``), over TLS with HTTP basic
authentication and keep-alive HTTP/1.1, from one asyncio process:

- one listening port per system, all on 127.0.0.1: a real site has one BMC per server,
  and metalmend's BMC pool allows one call in flight per BMC endpoint (``bmc.pool``), so
  5,000 systems behind one port would measure that limit, not the controller;
- per port: ``GET /redfish/v1/`` (service root), ``GET /redfish/v1/Systems`` (one member),
  ``GET /redfish/v1/Systems/<id>`` (a ComputerSystem with ``PowerState`` and its
  ``#ComputerSystem.Reset`` action) and ``POST .../Actions/ComputerSystem.Reset``
  (On, ForceOn, ForceOff, GracefulShutdown, ForceRestart, GracefulRestart): power changes at
  once, as with the lab's instant BMCs;
- each system its own username and password (the host's Secret), checked on every request;
- resets of the systems named in ``journal`` are written to ``<journal_dir>/<host>.commands``
  as the lab's BMCs write them (``<unix time> hard off``), for ``benchmarks.shared.one_reboot``;
  with ``"journal_peers": true``, each line also names the process that sent the reset
  (``<unix time> hard off pid=<pid>``: the client's socket found from the connection's
  peer port in ``/proc/net/tcp`` and the sockets of this user's processes), so that
  ``benchmarks.sharding`` can tell which replica of ``metalmend run`` sent it;
- a control port (plain HTTP, no authentication, 127.0.0.1): ``GET /counters`` (requests
  by method, resets), read by the scale benchmark for BMC calls per second.

The configuration file (JSON, written by the benchmark): ``{"cert", "key", "ports_file",
"journal_dir", "journal": [host...], "journal_peers", "systems": [{"id", "host", "username",
"password", "power"}]}``. Once every port listens, ``ports_file`` is written:
``{"control": port, "systems": {id: port}}``.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
ROOT = "/redfish/v1/"
SYSTEMS = "/redfish/v1/Systems"
RESET_TYPES = ("On", "ForceOn", "ForceOff", "GracefulShutdown", "ForceRestart", "GracefulRestart")
OFF_RESETS = {"ForceOff": "hard off", "GracefulShutdown": "soft off"}
ON_RESETS = {"On": "on", "ForceOn": "on"}
MAX_HEADER_BYTES = 16384
MAX_BODY_BYTES = 65536


@dataclass
class System:
    id: str
    host: str
    authorization: bytes  # the whole expected header value: b"Basic <base64>"
    power: str = "On"
    journal: Path | None = None
    journal_peers: bool = False  # name the sending process in the journal

    @property
    def path(self) -> str:
        return f"{SYSTEMS}/{self.id}"


@dataclass
class Counters:
    by_method: Counter[str] = field(default_factory=Counter)
    resets: int = 0
    refused: int = 0  # 401s: a wrong password, or none

    def as_json(self) -> dict[str, Any]:
        total = sum(self.by_method.values())
        return {"requests": total, "by_method": dict(self.by_method), "resets": self.resets,
                "refused": self.refused}  # fmt: skip


def basic(username: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{username}:{password}".encode())


def service_root() -> dict[str, Any]:
    return {
        "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
        "@odata.id": ROOT,
        "Id": "RootService",
        "Name": "metalmend lab BMC",
        "RedfishVersion": "1.8.0",
        "Systems": {"@odata.id": SYSTEMS},
    }


def systems_collection(system: System) -> dict[str, Any]:
    return {
        "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
        "@odata.id": SYSTEMS,
        "Name": "Computer System Collection",
        "Members@odata.count": 1,
        "Members": [{"@odata.id": system.path}],
    }


def computer_system(system: System) -> dict[str, Any]:
    return {
        "@odata.type": "#ComputerSystem.v1_10_0.ComputerSystem",
        "@odata.id": system.path,
        "Id": system.id,
        "Name": system.host,
        "UUID": system.id,
        "PowerState": system.power,
        "Status": {"State": "Enabled", "Health": "OK"},
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": f"{system.path}/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": list(RESET_TYPES),
            }
        },
    }


def reset(system: System, reset_type: str) -> str | None:
    """Apply a ResetType at once; the journal word for it, or None if not a reset type."""
    if reset_type in OFF_RESETS:
        system.power = "Off"
        return OFF_RESETS[reset_type]
    if reset_type in ON_RESETS:
        system.power = "On"
        return ON_RESETS[reset_type]
    if reset_type in ("ForceRestart", "GracefulRestart"):
        system.power = "On"
        return "restart"
    return None


def peer_pid(peer_port: int, server_port: int) -> int | None:
    """The process (of this user) holding the loopback TCP socket ``peer_port`` ->
    ``server_port``: its inode from /proc/net/tcp, then the process whose descriptors
    include that socket. None when not found (the client already gone)."""
    local = f"0100007F:{peer_port:04X}"
    remote = f"0100007F:{server_port:04X}"
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        columns = line.split()
        if columns[1] == local and columns[2] == remote:
            inode = columns[9]
            break
    if inode is None:
        return None
    wanted, uid = f"socket:[{inode}]", os.getuid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                if os.readlink(fd.path) == wanted:
                    return int(entry.name)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return None


def answer(
    system: System, method: str, path: str, body: bytes, by: Callable[[], int | None] = lambda: None
) -> tuple[int, dict[str, Any]]:
    """(status, JSON document) of one authenticated Redfish request; ``by``: the sending
    process, asked only when a journalled system with ``journal_peers`` is reset."""
    path = path.split("?", 1)[0]
    if method == "GET":
        if path in (ROOT, ROOT.rstrip("/")):
            return 200, service_root()
        if path.rstrip("/") == SYSTEMS:
            return 200, systems_collection(system)
        if path.rstrip("/") == system.path:
            return 200, computer_system(system)
        return 404, _error("ResourceMissingAtURI", f"{path} not found")
    if method == "POST" and path == f"{system.path}/Actions/ComputerSystem.Reset":
        try:
            reset_type = json.loads(body or b"{}").get("ResetType")
        except (ValueError, AttributeError):
            return 400, _error("MalformedJSON", "the body is not a JSON object")
        word = reset(system, reset_type) if isinstance(reset_type, str) else None
        if word is None:
            return 400, _error("ActionParameterValueNotInList", f"ResetType {reset_type!r}")
        if system.journal is not None:
            sender = f" pid={by()}" if system.journal_peers else ""
            with system.journal.open("a") as journal:
                journal.write(f"{time.time():.6f} {word}{sender}\n")
        return 204, {}
    return 405, _error("OperationNotAllowed", f"{method} {path}")


def _error(message_id: str, message: str) -> dict[str, Any]:
    code = f"Base.1.8.{message_id}"
    info = [{"MessageId": code}]
    return {"error": {"code": code, "message": message, "@Message.ExtendedInfo": info}}


def response(status: int, document: dict[str, Any], keep_alive: bool) -> bytes:
    reasons = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
               404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}  # fmt: skip
    payload = b"" if status == 204 else json.dumps(document).encode()
    head = [f"HTTP/1.1 {status} {reasons.get(status, 'Error')}",
            f"Content-Length: {len(payload)}", "OData-Version: 4.0",
            "Connection: " + ("keep-alive" if keep_alive else "close")]  # fmt: skip
    if payload:
        head.append("Content-Type: application/json")
    if status == 401:
        head.append('WWW-Authenticate: Basic realm="metalmend lab BMC"')
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


class RedfishProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive for one system's port (a protocol, not streams: thousands
    of idle connections cost a buffer each, not a task)."""

    def __init__(self, system: System, counters: Counters) -> None:
        self.system, self.counters = system, counters
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.transport.is_closing():
            request = self._next_request()
            if request is None:
                return
            self._serve(*request)

    def _next_request(self) -> tuple[str, str, dict[str, bytes], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEADER_BYTES:
                self._close(response(413, _error("GeneralError", "headers too large"), False))
            return None
        lines = self.buffer[:end].split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip()
        length = int(headers.get("content-length", b"0") or 0)
        if length > MAX_BODY_BYTES:
            self._close(response(413, _error("GeneralError", "body too large"), False))
            return None
        if len(self.buffer) < end + 4 + length:
            return None
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        method, path, *_ = [*lines[0].decode("latin-1").split(" "), "", ""]
        return method, path, headers, body

    def _serve(self, method: str, path: str, headers: dict[str, bytes], body: bytes) -> None:
        assert self.transport is not None
        keep_alive = headers.get("connection", b"").lower() != b"close"
        self.counters.by_method[method] += 1
        if headers.get("authorization") != self.system.authorization:
            self.counters.refused += 1
            status, document = 401, _error("AccessDenied", "authentication required")
        else:
            status, document = answer(self.system, method, path, body, self._sender)
            self.counters.resets += method == "POST" and status == 204
        self.transport.write(response(status, document, keep_alive))
        if not keep_alive:
            self.transport.close()

    def _sender(self) -> int | None:
        assert self.transport is not None
        peer = self.transport.get_extra_info("peername")
        sock = self.transport.get_extra_info("sockname")
        return peer_pid(peer[1], sock[1]) if peer and sock else None

    def _close(self, last: bytes) -> None:
        assert self.transport is not None
        self.transport.write(last)
        self.transport.close()


class ControlProtocol(asyncio.Protocol):
    """``GET /counters`` in plain HTTP, one request per connection."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        path = self.buffer.split(b" ", 2)[1].decode("latin-1")
        if path == "/counters":
            self.transport.write(response(200, self.counters.as_json(), False))
        else:
            self.transport.write(response(404, _error("ResourceMissingAtURI", path), False))
        self.transport.close()


def systems_from(config: dict[str, Any]) -> list[System]:
    journal_dir = Path(config.get("journal_dir") or ".")
    journalled = set(config.get("journal") or ())
    peers = bool(config.get("journal_peers"))
    return [
        System(
            id=entry["id"],
            host=entry["host"],
            authorization=basic(entry["username"], entry["password"]),
            power=entry.get("power", "On"),
            journal=journal_dir / f"{entry['host']}.commands"
            if entry["host"] in journalled
            else None,
            journal_peers=peers,
        )
        for entry in config["systems"]
    ]


async def serve(config: dict[str, Any]) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(config["cert"], config["key"])
    counters = Counters()
    loop = asyncio.get_running_loop()
    ports: dict[str, int] = {}
    servers = []
    for system in systems_from(config):
        server = await loop.create_server(
            functools.partial(RedfishProtocol, system, counters), LOOPBACK, 0, ssl=tls, backlog=64
        )
        servers.append(server)
        ports[system.id] = server.sockets[0].getsockname()[1]
    control = await loop.create_server(lambda: ControlProtocol(counters), LOOPBACK, 0)
    written = {"control": control.sockets[0].getsockname()[1], "systems": ports}
    target = Path(config["ports_file"])
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(written))
    os.replace(partial, target)  # whole or absent: the benchmark waits for it
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    config = json.loads(Path(argv[0]).read_text())
    asyncio.run(serve(config))


if __name__ == "__main__":
    main(sys.argv[1:])
