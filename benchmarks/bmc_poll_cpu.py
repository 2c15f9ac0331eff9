"""CPU of one routine power read, for the ways a client can reach a Redfish BMC, against a
floor measured in the same run.

At rest, metalmend's CPU is its routine power reads (docs/scale.md, fixes 9, 13 and 14):
each is a new TCP and TLS connection, because the pool hangs up after a routine poll and
real BMCs close idle connections long before the next one. Absolute CPU differs between
machines (and on one machine with its load), so every figure is printed as a ratio to a
**floor** measured in the same process and the same run: a bare blocking ``ssl`` socket
doing the same TLS handshake (same CA, same host-name check) and one ``GET`` of the system
resource with basic authentication, its JSON parsed, nothing else. No client can do the
same work for much less. The rows, against the scale lab's BMC server
(``metalmend_lab.scalebmc``: real Redfish over TLS, basic authentication, one port per
system):

- **floor**: as above;
- **pool**: ``BmcPool.power_state(background=True)``, what host-power does (the driver, its
  deadline, the pool's slots, and the hang-up after the read), on the production
  transport (``bmc/curl.py``: libcurl's multi interface on the asyncio loop);
- **Redfish client**: metalmend's own ``RedfishDriver.power_state`` and ``hang_up``, without
  the pool around it: the production transport as the driver uses it;
- **httpx, new connection**: a bare ``httpx.AsyncClient`` GET with ``Connection: close``,
  the driver's transport until issue 38, without metalmend's code around it;
- **httpx, TLS resumed**: the same, with the TLS session of the last connection to that
  BMC handed to the next (no certificate check, a shorter handshake);
- **httpcore alone**: httpx's transport without httpx's client;
- **aiohttp**: aio-libs' client (its HTTP parser is C), one session, a connection per read;
- **asyncio streams**: ``asyncio.open_connection`` with TLS and a hand-written request:
  what asyncio's own TLS layer costs, with no HTTP library at all (not a candidate: no
  parser; it shows where asyncio's floor is);
- **pycurl multi**: libcurl (C: its own TLS and HTTP) driven from the asyncio loop through
  its multi interface (``loop.add_reader``/``add_writer`` and a timer): one handle per BMC,
  connections not reused;
- **keep-alive** (httpx): one connection per BMC kept open across reads; real BMCs close
  idle connections long before a poll 20 s later, so only a lower bound.

CPU is this process's user + system time per read (the BMC server is another process).
Rows are measured in turns (every row once, then again, ``METALMEND_BENCH_POLL_TURNS``
times, default 5) and each row's least CPU per read is printed, so a burst of load from
elsewhere on the machine lands on one turn, not on one row. ``METALMEND_BENCH_POLL_SYSTEMS``
(default 200) and ``METALMEND_BENCH_POLL_ROUNDS`` (reads of every system per turn, default
2) set the size.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import gc
import io
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpcore
import httpx

from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.controlplane import LOOPBACK
from metalmend_lab.pki import CertificateAuthority

SYSTEMS = int(os.environ.get("METALMEND_BENCH_POLL_SYSTEMS", "200"))
ROUNDS = int(os.environ.get("METALMEND_BENCH_POLL_ROUNDS", "2"))
TURNS = int(os.environ.get("METALMEND_BENCH_POLL_TURNS", "5"))
STARTUP = 120.0  # seconds for the BMC server to listen on every port
FLOOR = "floor (bare ssl socket, one GET)"
POOL = "pool (what host-power does)"
CLIENT = "Redfish client (the driver on libcurl)"

# The TLS session slot of the BMC a request is for (TLS resumed).
_SLOT: contextvars.ContextVar[Slot] = contextvars.ContextVar("tls_session_slot")


class Slot:
    session: ssl.SSLSession | None = None
    ssl_object: ssl.SSLObject | None = None
    resumed = 0


class ResumingContext(ssl.SSLContext):
    """Hands the TLS session of the BMC's last connection to its next one."""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        slot = _SLOT.get(None)
        if slot is not None:
            session = slot.session
        obj = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if slot is not None:
            slot.ssl_object = obj
        return obj


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any], Path]:
    ca = CertificateAuthority(workdir / "pki")
    serving = ca.issue("bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    config = {
        "cert": str(serving.cert), "key": str(serving.key),
        "ports_file": str(workdir / "ports.json"), "journal_dir": str(workdir), "journal": [],
        "systems": [{"id": f"sys-{i}", "host": f"host-{i}", "username": f"u{i}",
                     "password": f"p{i}"} for i in range(SYSTEMS)],
    }  # fmt: skip
    (workdir / "config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(workdir / "config.json")]
    process = subprocess.Popen(argv)
    deadline = time.monotonic() + STARTUP
    while not (workdir / "ports.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(
                f"the BMC server did not write {workdir / 'ports.json'} within {STARTUP:g}s"
                f" (exit code {process.poll()})"
            )
        time.sleep(0.1)
    return process, json.loads((workdir / "ports.json").read_text()), ca.pair.cert


Read = Callable[[int], Awaitable[None]]


class Row:
    """One way of reading: ``read(i)`` reads system i once; ``close`` frees what it holds."""

    def __init__(self, name: str, read: Read, close: Callable[[], Awaitable[None]] | None = None):
        self.name, self.read, self.close = name, read, close
        self.best = float("inf")
        self.warm = False

    async def turn(self) -> None:
        if not self.warm:  # every system once: connections, contexts and caches made
            for i in range(SYSTEMS):
                await self.read(i)
            self.warm = True
        gc.collect()
        start = time.process_time()
        for _ in range(ROUNDS):
            for i in range(SYSTEMS):
                await self.read(i)
        self.best = min(self.best, (time.process_time() - start) / (ROUNDS * SYSTEMS))


class Bmcs:
    """The lab's BMC server's systems: where each is, and its credentials."""

    def __init__(self, ports: dict[str, Any], ca: Path):
        self.ports, self.ca = ports, ca

    def port(self, i: int) -> int:
        return int(self.ports["systems"][f"sys-{i}"])

    def path(self, i: int) -> str:
        return f"/redfish/v1/Systems/sys-{i}"

    def url(self, i: int) -> str:
        return f"https://{LOOPBACK}:{self.port(i)}{self.path(i)}"

    def authorization(self, i: int) -> str:
        return "Basic " + base64.b64encode(f"u{i}:p{i}".encode()).decode()

    def request(self, i: int) -> bytes:
        return (
            f"GET {self.path(i)} HTTP/1.1\r\nHost: {LOOPBACK}:{self.port(i)}\r\n"
            f"Authorization: {self.authorization(i)}\r\nAccept: application/json\r\n"
            "Connection: close\r\n\r\n"
        ).encode()


def power_of(head: bytes, body: bytes, where: str) -> str:
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"{where} answered {head[:40]!r}")
    return str(json.loads(body)["PowerState"])


def floor_row(bmcs: Bmcs) -> Row:
    context = ssl.create_default_context(cafile=str(bmcs.ca))

    async def read(i: int) -> None:
        with (
            socket.create_connection((LOOPBACK, bmcs.port(i))) as raw,
            context.wrap_socket(raw, server_hostname=LOOPBACK) as tls,
        ):
            tls.sendall(bmcs.request(i))
            answer = bytearray()
            while chunk := tls.recv(65536):
                answer += chunk
        head, _, body = bytes(answer).partition(b"\r\n\r\n")
        power_of(head, body, bmcs.url(i))

    return Row(FLOOR, read)


def pool_row(bmcs: Bmcs) -> Row:
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(bmcs.ca)))
    targets = [
        BmcTarget(
            parse(bmcs.url(i).replace("https://", "redfish://")), Credentials(f"u{i}", f"p{i}")
        )
        for i in range(SYSTEMS)
    ]

    async def read(i: int) -> None:
        await pool.power_state(targets[i], background=True)

    return Row(POOL, read, pool.close)


def client_row(bmcs: Bmcs) -> Row:
    settings = BmcSettings(timeout=10.0, ca_bundle=str(bmcs.ca))
    drivers = [
        RedfishDriver(
            parse(bmcs.url(i).replace("https://", "redfish://")),
            f"u{i}",
            f"p{i}",
            str(bmcs.ca),
            settings,
            system_cas=False,
        )
        for i in range(SYSTEMS)
    ]

    async def read(i: int) -> None:
        await drivers[i].power_state()
        drivers[i].hang_up()  # as the pool does after a routine poll

    async def aclose() -> None:
        for driver in drivers:
            await driver.close()

    return Row(CLIENT, read, aclose)


def httpx_rows(bmcs: Bmcs) -> list[Row]:
    plain = ssl.create_default_context(cafile=str(bmcs.ca))
    resuming = ResumingContext(ssl.PROTOCOL_TLS_CLIENT)
    resuming.load_verify_locations(str(bmcs.ca))
    slots = [Slot() for _ in range(SYSTEMS)]

    def row(name: str, context: ssl.SSLContext, *, close: bool, resume: bool) -> Row:
        clients: dict[int, httpx.AsyncClient] = {}

        async def read(i: int) -> None:
            client = clients.get(i)
            if client is None:
                client = clients[i] = httpx.AsyncClient(
                    verify=context, trust_env=False,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                )  # fmt: skip
            if resume:
                _SLOT.set(slots[i])
            headers = {"Connection": "close"} if close else {}
            answer = await client.get(bmcs.url(i), auth=(f"u{i}", f"p{i}"), headers=headers)
            if answer.status_code != 200:
                raise SystemExit(f"{bmcs.url(i)} answered {answer.status_code}")
            json.loads(answer.content)
            tls = slots[i].ssl_object
            if resume and tls is not None:
                slots[i].resumed += tls.session_reused
                slots[i].session = tls.session

        async def aclose() -> None:
            for client in clients.values():
                await client.aclose()
            if resume:
                resumed = sum(s.resumed for s in slots)
                print(f"  {name}: {resumed} TLS sessions resumed")

        return Row(name, read, aclose)

    return [
        row("httpx, new connection", plain, close=True, resume=False),
        row("httpx, TLS resumed", resuming, close=True, resume=True),
        row("keep-alive (httpx; not what BMCs allow)", plain, close=False, resume=False),
    ]


def httpcore_row(bmcs: Bmcs) -> Row:
    context = ssl.create_default_context(cafile=str(bmcs.ca))
    pools: dict[int, httpcore.AsyncConnectionPool] = {}

    async def read(i: int) -> None:
        pool = pools.get(i)
        if pool is None:
            pool = pools[i] = httpcore.AsyncConnectionPool(ssl_context=context, max_connections=1)
        headers = {"Authorization": bmcs.authorization(i), "Connection": "close",
                   "Accept": "application/json"}  # fmt: skip
        answer = await pool.request("GET", bmcs.url(i), headers=headers)
        if answer.status != 200:
            raise SystemExit(f"{bmcs.url(i)} answered {answer.status}")
        json.loads(answer.content)

    async def aclose() -> None:
        for pool in pools.values():
            await pool.aclose()

    return Row("httpcore alone", read, aclose)


def aiohttp_row(bmcs: Bmcs) -> Row | None:
    try:
        import aiohttp
    except ImportError:
        print("  aiohttp: not installed (make venv installs it); its row is left out")
        return None
    context = ssl.create_default_context(cafile=str(bmcs.ca))
    session: list[aiohttp.ClientSession] = []

    async def read(i: int) -> None:
        if not session:
            connector = aiohttp.TCPConnector(ssl=context, force_close=True, limit=0)
            session.append(aiohttp.ClientSession(connector=connector))
        headers = {"Authorization": bmcs.authorization(i), "Accept": "application/json"}
        async with session[0].get(bmcs.url(i), headers=headers) as answer:
            if answer.status != 200:
                raise SystemExit(f"{bmcs.url(i)} answered {answer.status}")
            json.loads(await answer.read())

    async def aclose() -> None:
        if session:
            await session[0].close()

    return Row(f"aiohttp {aiohttp.__version__}", read, aclose)


def streams_row(bmcs: Bmcs) -> Row:
    context = ssl.create_default_context(cafile=str(bmcs.ca))

    async def read(i: int) -> None:
        reader, writer = await asyncio.open_connection(
            LOOPBACK, bmcs.port(i), ssl=context, server_hostname=LOOPBACK
        )
        writer.write(bmcs.request(i))
        answer = await reader.read()
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
        head, _, body = answer.partition(b"\r\n\r\n")
        power_of(head, body, bmcs.url(i))

    return Row("asyncio streams (no HTTP library)", read)


class CurlLoop:
    """libcurl's multi interface on the running asyncio loop: libcurl says which sockets to
    watch (M_SOCKETFUNCTION) and when to call it back (M_TIMERFUNCTION); the loop calls
    ``socket_action`` when one is ready; a finished transfer resolves its future."""

    def __init__(self, pycurl: Any) -> None:
        self.pycurl = pycurl
        self.loop = asyncio.get_running_loop()
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_SOCKETFUNCTION, self._socket)
        self.multi.setopt(pycurl.M_TIMERFUNCTION, self._timer)
        self.timer: asyncio.TimerHandle | None = None
        self.waiting: dict[Any, asyncio.Future[None]] = {}
        self.watched: dict[int, int] = {}

    def _socket(self, what: int, fd: int, multi: Any, data: Any) -> None:
        pycurl = self.pycurl
        old = self.watched.pop(fd, 0)
        if old & 1:
            self.loop.remove_reader(fd)
        if old & 2:
            self.loop.remove_writer(fd)
        if what == pycurl.POLL_REMOVE:
            return
        flags = 0
        if what in (pycurl.POLL_IN, pycurl.POLL_INOUT):
            self.loop.add_reader(fd, self._act, fd, pycurl.CSELECT_IN)
            flags |= 1
        if what in (pycurl.POLL_OUT, pycurl.POLL_INOUT):
            self.loop.add_writer(fd, self._act, fd, pycurl.CSELECT_OUT)
            flags |= 2
        self.watched[fd] = flags

    def _timer(self, ms: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if ms >= 0:
            self.timer = self.loop.call_later(ms / 1000, self._act, self.pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, event: int) -> None:
        while self.multi.socket_action(fd, event)[0] == self.pycurl.E_CALL_MULTI_PERFORM:
            pass
        while True:
            queued, ok, failed = self.multi.info_read()
            for handle in ok:
                self.multi.remove_handle(handle)
                self.waiting.pop(handle).set_result(None)
            for handle, code, message in failed:
                self.multi.remove_handle(handle)
                self.waiting.pop(handle).set_exception(self.pycurl.error(code, message))
            if not queued:
                return

    async def perform(self, handle: Any) -> None:
        done = self.waiting[handle] = self.loop.create_future()
        self.multi.add_handle(handle)
        self._act(self.pycurl.SOCKET_TIMEOUT, 0)
        await done


def pycurl_row(bmcs: Bmcs) -> Row | None:
    try:
        import pycurl
    except ImportError:
        print("  pycurl: not installed (make venv installs it); its row is left out")
        return None
    handles: dict[int, Any] = {}
    curl: list[CurlLoop] = []

    async def read(i: int) -> None:
        if not curl:
            curl.append(CurlLoop(pycurl))
        handle = handles.get(i)
        if handle is None:
            handle = handles[i] = pycurl.Curl()
            handle.setopt(pycurl.URL, bmcs.url(i))
            handle.setopt(pycurl.CAINFO, str(bmcs.ca))
            handle.setopt(pycurl.USERPWD, f"u{i}:p{i}")
            handle.setopt(pycurl.HTTPHEADER, ["Accept: application/json"])
            handle.setopt(pycurl.FORBID_REUSE, 1)  # a new connection every read
            handle.setopt(pycurl.PROXY, "")
        body = io.BytesIO()
        handle.setopt(pycurl.WRITEFUNCTION, body.write)
        await curl[0].perform(handle)
        if handle.getinfo(pycurl.RESPONSE_CODE) != 200:
            raise SystemExit(f"{bmcs.url(i)} answered {handle.getinfo(pycurl.RESPONSE_CODE)}")
        json.loads(body.getvalue())

    async def aclose() -> None:
        for handle in handles.values():
            handle.close()

    return Row(f"pycurl multi ({pycurl.version.split()[1]})", read, aclose)


async def measure(ports: dict[str, Any], ca: Path) -> list[Row]:
    bmcs = Bmcs(ports, ca)
    candidates = [floor_row(bmcs), pool_row(bmcs), client_row(bmcs), *httpx_rows(bmcs),
                  httpcore_row(bmcs),
                  aiohttp_row(bmcs), streams_row(bmcs), pycurl_row(bmcs)]  # fmt: skip
    rows = [row for row in candidates if row is not None]
    try:
        for _ in range(TURNS):
            for row in rows:
                await row.turn()
    finally:
        for row in rows:
            if row.close is not None:
                await row.close()
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-poll-") as tmp:
        process, ports, ca = start_server(Path(tmp))
        try:
            print(
                f"CPU per routine power read: {SYSTEMS} Redfish BMCs, {ROUNDS} reads of each"
                f" per turn, {TURNS} turns, least CPU of a turn (load average"
                f" {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start)"
            )
            rows = asyncio.run(measure(ports, ca))
        finally:
            process.terminate()
            process.wait(30)
    floor = next(row.best for row in rows if row.name == FLOOR)
    pool = next(row.best for row in rows if row.name == POOL)
    client = next(row.best for row in rows if row.name == CLIENT)
    for row in rows:
        print(
            f"  {row.name:42} {row.best * 1000:7.3f} ms   {row.best / floor:5.2f}x of floor"
            f"   {row.best / pool:5.2f}x of pool"
        )
    print(f"  host-power's routine read (pool) costs {pool / floor:.2f}x the floor; target 1.5x")
    print(f"  metalmend's Redfish client alone costs {client / floor:.2f}x the floor")
    print(f"  at 250 reads a second (5,000 hosts every 20 s), pool: {pool * 250 * 100:.0f} %"
          f" of a core")  # fmt: skip


if __name__ == "__main__":
    main()
