"""Power control of a healthy host while a tenant's hostile BMCs are configured.

One lab host (instant IPMI BMC) and ``metalmend run --controllers host-power`` as a
process, as in production. Hard reboots of the healthy host (the reboot annotation,
``{"mode":"hard"}``), measured as in ``reboot_latency``: request -> power-off received at
the BMC, BMC on -> status (lastPoweredOn) seen, and the whole request -> status.

First quiet, then with 16 BareMetalHosts of another namespace whose BMCs are hostile:

| kind                     | count | behaviour                                             |
|--------------------------|-------|-------------------------------------------------------|
| Redfish, slow drip       | 5     | a valid 200 answer, one byte every 2 s, forever         |
| Redfish, huge body       | 4     | a 400 MiB body, sent as fast as it is read            |
| Redfish, refused         | 2     | nothing listens (connection refused)                  |
| IPMI, silent             | 3     | a UDP port that takes every packet and never answers  |
| IPMI, refused            | 2     | nothing listens (ICMP port unreachable)               |

(slow and huge have no IPMI variant: IPMI is one datagram each way.) Printed: both
figures side by side, the ratio (target: within 2x of quiet), and the controller's memory
(main process plus its children, the IPMI workers; target: under 300 MB), sampled every
0.2 s, and the kernel's peak (VmHWM) of each process. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import statistics
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret
from lightkube.types import PatchType

from benchmarks.shared import one_reboot
from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from metalmend_lab.hosts import NAMESPACE

REBOOTS = 30
HOSTILE_NAMESPACE = "hostile-tenant"
HOSTILE = {"drip": 5, "huge": 4, "refused": 2, "ipmi-silent": 3, "ipmi-refused": 2}
DRIP_EVERY = 2.0
HUGE_BYTES = 400 << 20
WARM_UP = 12.0  # seconds for every hostile host to be tried at least once (BMC timeout 5 s)


# ---- hostile BMCs ------------------------------------------------------------------------------


async def _drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A valid answer, one byte every 2 s, forever (or until the client goes)."""
    gone: asyncio.Future[bytes] | None = None
    with contextlib.suppress(Exception):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        )
        gone = asyncio.ensure_future(reader.read(1))  # done when the client hangs up
        while not gone.done():
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(DRIP_EVERY)
    if gone is not None:
        gone.cancel()
    writer.close()


async def _huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A 400 MiB JSON body, as fast as the client reads it."""
    gone: asyncio.Future[bytes] | None = None
    with contextlib.suppress(Exception):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {HUGE_BYTES}\r\n\r\n".encode()
            + b'{"PowerState": "'
        )
        chunk = b"x" * (1 << 16)
        gone = asyncio.ensure_future(reader.read(1))  # done when the client hangs up
        for _ in range(HUGE_BYTES // len(chunk)):
            if gone.done():  # metalmend reads 1 MiB at most, then hangs up
                break
            writer.write(chunk)
            await writer.drain()
    if gone is not None:
        gone.cancel()
    writer.close()


@dataclass
class HostileBmcs:
    """The hostile BMCs, served from a thread of this process (their own event loop)."""

    tls: ssl.SSLContext
    addresses: dict[str, str] = field(default_factory=dict)  # host name -> BMC address
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _sockets: list[socket.socket] = field(default_factory=list)

    def start(self) -> None:
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait()

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._open())
        ready.set()
        self._loop.run_forever()

    async def _open(self) -> None:
        system = "/redfish/v1/Systems/1"
        for kind, count in HOSTILE.items():
            for i in range(count):
                name = f"hostile-{kind}-{i}"
                if kind in ("drip", "huge"):
                    handler = _drip if kind == "drip" else _huge
                    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=self.tls)
                    port = server.sockets[0].getsockname()[1]
                    self.addresses[name] = f"redfish+https://127.0.0.1:{port}{system}"
                elif kind == "refused":
                    self.addresses[name] = f"redfish+https://127.0.0.1:{free_port()}{system}"
                elif kind == "ipmi-silent":
                    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    sock.bind(("127.0.0.1", 0))  # takes every packet, answers none
                    self._sockets.append(sock)
                    self.addresses[name] = f"ipmi://127.0.0.1:{sock.getsockname()[1]}"
                else:
                    self.addresses[name] = f"ipmi://127.0.0.1:{_free_udp_port()}"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def register_hostile(client: Client, addresses: dict[str, str]) -> None:
    """The tenant's hosts, each with a Secret bound to it (so metalmend does use it)."""
    with contextlib.suppress(Exception):
        client.create(Namespace(metadata=ObjectMeta(name=HOSTILE_NAMESPACE)))
    for name, address in addresses.items():
        client.create(
            Secret(
                metadata=ObjectMeta(
                    name=f"{name}-bmc",
                    labels={SECRET_LABEL: SECRET_LABEL_VALUE},
                    annotations={HOSTS_ANNOTATION: name},
                ),
                stringData={"username": "admin", "password": "tenant-secret"},
            ),
            namespace=HOSTILE_NAMESPACE,
        )
        spec = {"online": True, "bmc": {"address": address, "credentialsName": f"{name}-bmc"}}
        client.create(
            BareMetalHost(metadata=ObjectMeta(name=name), spec=spec), namespace=HOSTILE_NAMESPACE
        )
        client.patch(
            BareMetalHost.Status, name,
            {"status": {"poweredOn": True, "operationalStatus": "OK",
                        "provisioning": {"state": "provisioned"}}},
            namespace=HOSTILE_NAMESPACE, patch_type=PatchType.MERGE,
        )  # fmt: skip


# ---- memory of the controller ------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _kib(pid: int, field_name: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


class MemorySampler:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self.peak_processes = 0
        self.hwm_kib: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            pids = _tree(self.pid)
            total = sum(_kib(p, "VmRSS") for p in pids)
            if total > self.peak_kib:
                self.peak_kib, self.peak_processes = total, len(pids)
            for p in pids:
                self.hwm_kib[p] = max(self.hwm_kib.get(p, 0), _kib(p, "VmHWM"))

    @contextlib.contextmanager
    def sampling(self) -> Iterator[MemorySampler]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


# ---- reboots -----------------------------------------------------------------------------------


async def reboots(client: AsyncClient, name: str, commands: Path) -> list[tuple[float, ...]]:
    return [await one_reboot(client, name, commands) for _ in range(REBOOTS)]


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def hostile_hosts_in_error(client: AsyncClient) -> dict[str, str]:
    found: dict[str, str] = {}
    host: Any
    async for host in client.list(BareMetalHost, namespace=HOSTILE_NAMESPACE):
        status: Any = host.get("status") or {}
        found[str(host.metadata.name)] = str(status.get("errorMessage") or "")[:90]
    return found


async def run(running: lab.RunningLab, hostile: HostileBmcs) -> None:
    client = AsyncClient(KubeConfig.from_file(running.kubeconfig))
    assert running.hardware is not None
    name = running.hardware.hosts[0].name
    commands = running.plane.workdir.parent / "hardware" / f"{name}.commands"
    for _ in range(100):  # until host-power has recorded lastPoweredOn once
        host: Any = await client.get(BareMetalHost, name, namespace=NAMESPACE)
        if ((host.get("status") or {}).get("provisioning") or {}).get("lastPoweredOn"):
            break
        await asyncio.sleep(0.1)
    controller = running.extras["metalmend"].pid
    assert controller is not None

    with MemorySampler(controller).sampling() as quiet_memory:
        quiet = await reboots(client, name, commands)

    hostile.start()
    register_hostile(running.client(), hostile.addresses)
    with MemorySampler(controller).sampling() as hostile_memory:
        await asyncio.sleep(WARM_UP)
        loud = await reboots(client, name, commands)
    errors = await hostile_hosts_in_error(client)
    await client.close()

    print(f"reboot of a healthy host, {REBOOTS} hard reboots each (ms): quiet | 16 hostile BMCs")
    labels = ("request -> power-off at BMC", "BMC on -> status updated", "request -> status")
    for i, label in enumerate(labels):
        q = [r[i] for r in quiet]
        h = [r[i] for r in loud]
        print(
            f"  {label:28} p50 {quantile(q, 50):7.1f} | {quantile(h, 50):7.1f}"
            f"   p90 {quantile(q, 90):7.1f} | {quantile(h, 90):7.1f}"
            f"   max {max(q):7.1f} | {max(h):7.1f}"
        )
    total_q, total_h = [r[2] for r in quiet], [r[2] for r in loud]
    print(
        f"  ratio hostile/quiet, request -> status: p50 {quantile(total_h, 50) / quantile(total_q, 50):.2f}x"
        f"  p90 {quantile(total_h, 90) / quantile(total_q, 90):.2f}x  (target: within 2x)"
    )
    for label, memory in (("quiet", quiet_memory), ("hostile", hostile_memory)):
        hwm = sum(memory.hwm_kib.values())
        print(
            f"  controller memory, {label:7}: peak RSS {memory.peak_kib / 1024:6.1f} MB over"
            f" {memory.peak_processes} processes (main + IPMI workers); sum of per-process"
            f" peaks (VmHWM) {hwm / 1024:6.1f} MB  (target: under 300 MB)"
        )
    failing = sum(1 for message in errors.values() if message)
    print(f"  hostile hosts reporting an error on the host: {failing}/{len(errors)}")
    for host_name, message in sorted(errors.items()):
        print(f"    {host_name:24} {message}")


def main() -> None:
    # Writes to a client that hung up are the point of the hostile BMCs, not news.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
        options = lab.LabOptions(
            lab_dir=Path(workdir), hosts=1, bmc="ipmi", boot_delay=0.0,
            controllers="host-power",
        )  # fmt: skip
        with lab.started(options) as running:
            pair = running.plane.ca.issue(
                "hostile-bmc", "hostile-bmc", ip_addresses=("127.0.0.1",), server=True
            )
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(pair.cert, pair.key)
            asyncio.run(run(running, HostileBmcs(tls)))


if __name__ == "__main__":
    main()
