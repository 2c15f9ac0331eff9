"""IPMI through pyghmi, in worker processes that a deadline or a cancellation can end.

pyghmi is blocking and keeps process-wide session state; a call stuck inside it cannot be
ended from a thread. So pyghmi runs only in ``ipmi_worker`` child processes, and a call
that passes its deadline or is cancelled kills (SIGKILL) its worker: its threads, sockets
and half-open sessions end with it, and a fresh worker takes over on the next call.

Workers: a fixed, small number (``IpmiWorkers.size``, 2 by default), started on first use,
each BMC endpoint pinned to one of them by a stable hash of its address. Why not one per
BMC: a worker is a Python interpreter with pyghmi and cryptography loaded, about 35 MB;
sixteen hostile BMCs would cost over 500 MB. Why not one for all: a kill would cut every
BMC's call. With two, a kill cuts at most the calls of the BMCs pinned to the same worker,
and those are sent again once, on the fresh worker, within their own deadline (reading
power and chassis on/off are idempotent). Most hostile BMCs never reach a worker at all:
the preflight probe runs here, asynchronously, before a session is opened, and tells "no
BMC there" (ECONNREFUSED: Unreachable) and "nobody answers" (TimedOut) apart at once.

Workers are started as fresh interpreters (``python -m metalmend.bmc.ipmi_worker``,
fork immediately followed by exec, as multiprocessing's 'spawn' does): the controller is
asyncio with threads, where a plain fork would copy locks held by other threads.

Sessions are reused per (BMC, user) inside the worker, as pyghmi wants. The UDP sockets
are bound to the local address that routes to the BMC (found by the preflight's connected
socket), never to every interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import sys
from typing import Any

from metalmend.bmc import metrics
from metalmend.bmc.address import BmcAddress
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import (
    AuthenticationFailed,
    BmcError,
    TimedOut,
    Unreachable,
    Unsupported,
    cap,
)
from metalmend.bmc.settings import BmcSettings

log = logging.getLogger(__name__)

OPERATION = {
    PowerAction.ON: "on",
    PowerAction.SOFT_OFF: "shutdown",  # ACPI soft shutdown
    PowerAction.HARD_OFF: "off",
}
PROBE_WAIT = 3.0
"""Longest the preflight waits for the BMC's answer (a LAN BMC answers in milliseconds;
pyghmi's own first retransmission comes after 0.5-1 s)."""
# A worker's start-up (a Python process importing pyghmi): under a second on an idle machine,
# seconds on a loaded one; never counted against a call's deadline (IpmiWorkers.worker).
WORKER_STARTUP = 60.0
WORKER_COMMAND = (sys.executable, "-m", "metalmend.bmc.ipmi_worker")
ANSWER_LIMIT = 1 << 16  # one answer line of a worker; anything longer is a broken worker

# IPMI 2.0 "Get Channel Authentication Capabilities", sent outside any session: every BMC
# answers it before a login (it is how clients discover what the BMC supports).
_AUTH_CAPABILITIES = bytes.fromhex("0600ff07000000000000000000092018c88100388e04b5")


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark a future's outcome as seen: no "exception was never retrieved" at exit."""
    if not future.cancelled():
        future.exception()


class _WorkerGone(Exception):
    """The worker ended (killed for another BMC's stuck call, or crashed) before it
    answered this call."""


class _Worker:
    """One worker process and the calls it has in hand."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.killed = False  # set at once by kill(): the process is reaped only later
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(_consume)  # a worker killed before it was ready
        self._ids = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls) -> _Worker:
        """A worker that said it is ready (its imports done), or BmcError."""
        process = await asyncio.create_subprocess_exec(
            *WORKER_COMMAND,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=ANSWER_LIMIT,
        )  # fmt: skip
        metrics.IPMI_WORKER_STARTS.inc()
        worker = cls(process)
        try:
            async with asyncio.timeout(WORKER_STARTUP):
                await worker.ready
        except BaseException as error:
            worker.kill()
            if isinstance(error, TimeoutError | _WorkerGone):
                raise BmcError(
                    f"an IPMI worker process did not start within {WORKER_STARTUP:.0f}s"
                    " (is the machine overloaded, or pyghmi not installed?)"
                ) from None
            raise
        return worker

    @property
    def alive(self) -> bool:
        return not self.killed and self.process.returncode is None and not self._reader.done()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self._ids += 1
        request = {**request, "id": self._ids}
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[self._ids] = answer
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            await self.process.stdin.drain()
            return await answer
        except (ConnectionError, BrokenPipeError):
            raise _WorkerGone from None
        finally:
            self.pending.pop(request["id"], None)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            while line := await self.process.stdout.readline():
                answer = json.loads(line)
                if answer == {"ready": True}:
                    if not self.ready.done():
                        self.ready.set_result(None)
                    continue
                future = self.pending.get(answer.get("id"))
                if future is not None and not future.done():
                    future.set_result(answer)
        except (ValueError, asyncio.LimitOverrunError) as error:
            log.warning("an IPMI worker answered nonsense (%s); replacing it", type(error).__name__)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: whatever pyghmi was doing ends now, in every thread."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            if self.process.returncode is None:
                self.process.kill()
        futures: list[asyncio.Future[Any]] = [self.ready, *self.pending.values()]
        for future in futures:
            if not future.done():
                future.set_exception(_WorkerGone())
        if self.process.stdin is not None:
            self.process.stdin.close()

    async def wait(self) -> None:
        await self.process.wait()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class IpmiWorkers:
    """The worker processes of one BmcPool; endpoints are pinned to a worker by hash."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._workers: dict[int, _Worker] = {}
        self._starting: dict[int, asyncio.Task[_Worker]] = {}

    def slot(self, endpoint: str) -> int:
        return int.from_bytes(hashlib.sha256(endpoint.encode()).digest()[:4]) % self.size

    async def worker(self, endpoint: str) -> _Worker:
        """The slot's live worker, started if there is none.

        A start runs in a task of its own, shielded from the caller: a call whose deadline
        passes while the worker is still importing pyghmi (seconds on a loaded machine)
        gives up, but the worker comes up for the next call. Started under each call's
        deadline, every start on a busy machine was killed before it was ready and the next
        call started another: a BMC that answers in milliseconds read "did not answer" for
        as long as the load lasted."""
        slot = self.slot(endpoint)
        worker = self._workers.get(slot)
        if worker is not None and worker.alive:  # a killed one is reaped by asyncio
            return worker
        starting = self._starting.get(slot)
        if starting is None or starting.done():
            starting = asyncio.get_running_loop().create_task(self._start(slot))
            starting.add_done_callback(_consume)  # its callers may all have given up
            self._starting[slot] = starting
        return await asyncio.shield(starting)

    async def _start(self, slot: int) -> _Worker:
        worker = self._workers[slot] = await _Worker.start()
        return worker

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers.values() if w.alive]

    async def close(self) -> None:
        starting = [task for task in self._starting.values() if not task.done()]
        self._starting.clear()
        for task in starting:
            task.cancel()
        for task in starting:
            with contextlib.suppress(BaseException):
                await task
        workers = list(self._workers.values())
        self._workers.clear()
        for worker in workers:
            worker.kill()
        for worker in workers:
            with contextlib.suppress(Exception):
                await worker.wait()


class IpmiDriver:
    def __init__(
        self,
        address: BmcAddress,
        username: str,
        password: str,
        settings: BmcSettings,
        workers: IpmiWorkers,
        connect_to: str | None = None,
    ) -> None:
        self.address = address
        self._username = username
        self._password = password
        self._settings = settings
        self._workers = workers
        self._connect_to = connect_to  # vetted IP, when the address policy resolved one
        self._route: tuple[str, str] | None = None  # (BMC IP, our local IP), once probed

    async def power_state(self) -> PowerState:
        answer = await self._call("state")
        return PowerState.OFF if answer.get("power") == "off" else PowerState.ON

    async def act(self, action: PowerAction) -> None:
        await self._call(OPERATION[action])

    async def close(self) -> None:
        # The session lives in the worker, which keeps it alive for the next driver of
        # this (BMC, user); a broken one is dropped there on its first failure.
        self._route = None

    def hang_up(self) -> None:
        """Nothing to close: IPMI runs over UDP, and the session is the worker's."""

    async def _call(self, operation: str) -> dict[str, Any]:
        if self._route is None:
            self._route = await self._preflight()
        bmc_ip, local_ip = self._route
        request = {
            "op": operation,
            "host": bmc_ip,
            "port": self.address.port or 623,
            "local": local_ip,
            "username": self._username,
            "password": self._password,
        }
        for attempt in (1, 2):
            worker = await self._workers.worker(self.address.key)
            try:
                answer = await worker.call(request)
            except _WorkerGone:
                if attempt == 2:
                    raise BmcError(
                        f"{self.address}: the IPMI worker ended twice during the call"
                    ) from None
                continue  # killed for another BMC's stuck call: once more, on a fresh one
            except BaseException:
                # Deadline passed or caller cancelled: pyghmi may be stuck inside this
                # call; end it for certain.
                worker.kill()
                raise
            break
        if "error" in answer:
            raise self._error(answer["error"], str(answer.get("message", "")))
        return answer

    def _error(self, kind: str, message: str) -> BmcError:
        said = cap(message, self._settings.max_message_chars)
        if kind == "auth":
            # An unknown user ("Unauthorized name in RAKP2", status 0x0D) or a wrong
            # password ("Incorrect password provided"): backed off as a refused login.
            return AuthenticationFailed(
                f"{self.address} refused the credentials: the BMC refused the login ({said})"
            )
        if kind == "timeout":
            return TimedOut(f"{self.address} did not answer: {said}")
        if kind == "unsupported":
            return Unsupported(f"{self.address} refused the command: {said}")
        return BmcError(f"{self.address}: {said}")

    async def _preflight(self) -> tuple[str, str]:
        """Is anyone there, before pyghmi opens a session (whose failures linger in its
        state)? Returns the BMC's IP and our local IP on the route to it."""
        host = self._connect_to or await _resolve(self.address.host, self.address.port or 623)
        port = self.address.port or 623
        wait = min(self._settings.timeout, PROBE_WAIT)
        answer, local = await probe(host, port, wait)
        if answer == "refused":
            raise Unreachable(f"cannot reach {self.address}: nothing listens on that port")
        if answer == "silent":
            raise TimedOut(f"{self.address} did not answer within {wait:g}s")
        return host, local


async def _resolve(host: str, port: int) -> str:
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as error:
        raise Unreachable(f"cannot resolve {host!r}: {error.strerror}") from None
    return str(infos[0][4][0])


def probe_blocking(host: str, port: int, wait: float) -> str:
    """``probe``'s answer, blocking: for tools outside an event loop (``metalmend lab
    status``), never for the controller."""
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


async def probe(host: str, port: int, wait: float) -> tuple[str, str]:
    """("answers" | "refused" | "silent", the local IP on the route to ``host``).

    On a connected UDP socket a closed port comes back as ECONNREFUSED, which tells
    "no BMC there" apart from "a BMC that does not answer"; connecting also makes the
    kernel pick the local address that routes to the BMC."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except OSError as error:
            raise Unreachable(f"cannot reach {host}:{port}: {error.strerror}") from None
        local = str(sock.getsockname()[0])
        try:
            await loop.sock_sendall(sock, _AUTH_CAPABILITIES)
            async with asyncio.timeout(wait):
                await loop.sock_recv(sock, 512)
        except ConnectionRefusedError:
            return "refused", local
        except (TimeoutError, OSError):
            return "silent", local
    return "answers", local
