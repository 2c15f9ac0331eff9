"""The Redfish driver against a hostile BMC: a small HTTP server on 127.0.0.1, written
here, that answers too much, too slowly, the wrong thing, or points elsewhere. The driver
must end each call with a clear error, bounded memory and a closed connection, and send
the credentials nowhere but the address it was given."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from metalmend.bmc.address import BmcAddress, parse
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import BadAddress, BmcError, Refused, TimedOut, Unreachable, Unsupported
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings

PASSWORD = "h0stile-test-password"
SYSTEM = "/redfish/v1/Systems/1"
INSECURE = BmcSettings(timeout=20.0, allow_insecure_http=True)
MiB = 1 << 20
CHUNK = b"x" * (64 * 1024)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Responder = Callable[["HostileBmc", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class HostileBmc:
    """Answers each path with its responder (404 for others) and records what it got."""

    routes: dict[str, Responder]
    requests: list[Request] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client closed a connection while we were still answering."""
    body_bytes_sent: int = 0
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def address(self, path: str = SYSTEM, scheme: str = "redfish+http") -> BmcAddress:
        return parse(f"{scheme}://127.0.0.1:{self.port}{path}")

    def driver(self, settings: BmcSettings = INSECURE, path: str = SYSTEM) -> RedfishDriver:
        return RedfishDriver(self.address(path), "operator", PASSWORD, True, settings)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {}
                for line in filter(None, lines):
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(Request(method, path, headers, body))
                await self.routes.get(path, not_found)(self, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # the test is over; asyncio's server would log a cancelled handler
        finally:
            self._tasks.discard(task)
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HostileBmc]:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)


def answer(document: Any, status: int = 200, raw: bytes | None = None) -> Responder:
    body = raw if raw is not None else json.dumps(document).encode()

    async def respond(bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await w.drain()

    return respond


async def not_found(bmc: HostileBmc, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await answer({"error": {"message": "no such resource"}}, 404)(bmc, r, w)


def endless(declared_length: int | None = None, total: int = 400 * MiB) -> Responder:
    """200 and a JSON-looking body of ``total`` bytes, sent as fast as the client reads."""

    async def respond(bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        length = f"Content-Length: {declared_length}\r\n" if declared_length else ""
        w.write(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n{{".encode())
        try:
            while bmc.body_bytes_sent < total:
                w.write(CHUNK)
                await w.drain()
                bmc.body_bytes_sent += len(CHUNK)
        except ConnectionError:
            bmc.closed.set()
            raise

    return respond


def drip(every: float = 0.1) -> Responder:
    """A valid answer, one byte at a time, forever: each read is quick, the whole never ends."""

    async def respond(bmc: HostileBmc, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
        eof = asyncio.ensure_future(r.read(1))
        try:
            while not eof.done():
                w.write(b" ")
                await w.drain()
                bmc.body_bytes_sent += 1
                await asyncio.sleep(every)
        except ConnectionError:
            pass
        finally:
            eof.cancel()
        bmc.closed.set()
        raise ConnectionResetError("client went away")

    return respond


ROOT = answer({"@odata.id": "/redfish/v1/", "Systems": {"@odata.id": "/redfish/v1/Systems"}})
SYSTEMS = answer({"Members": [{"@odata.id": SYSTEM}]})


def system(**fields: Any) -> Responder:
    document = {
        "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
        "@odata.id": SYSTEM,
        "PowerState": "On",
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                "ResetType@Redfish.AllowableValues": ["On", "ForceOff", "GracefulShutdown"],
            }
        },
    }
    document.update(fields)
    return answer(document)


def healthy(**overrides: Responder) -> dict[str, Responder]:
    routes = {"/redfish/v1/": ROOT, "/redfish/v1/Systems": SYSTEMS, SYSTEM: system()}
    routes.update(overrides)
    return routes


# ---- size ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "declared", [None, 400 * MiB], ids=["no length, endless", "declares 400 MiB"]
)
async def test_a_huge_answer_is_cut_at_the_cap_without_taking_memory(declared: int | None) -> None:
    async with HostileBmc(healthy(**{SYSTEM: endless(declared)})).running() as bmc:
        driver = bmc.driver()
        tracemalloc.start()
        try:
            with pytest.raises(BmcError, match=f"answer larger than {MiB} bytes"):
                await driver.power_state()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await asyncio.wait_for(bmc.closed.wait(), 30)  # the connection was dropped
        await driver.close()
    assert peak < 16 * MiB  # read up to the 1 MiB cap, not the 400 MiB offered
    assert bmc.body_bytes_sent < 100 * MiB


async def test_a_3_mb_error_message_is_kept_by_its_start_only() -> None:
    message = "Fan 3 of chassis 1 failed; " + "details " * (3 * MiB // 8)
    error = answer({"error": {"code": "Base.1.0.GeneralError", "message": message}}, 500)
    settings = BmcSettings(timeout=20.0, allow_insecure_http=True, max_response_bytes=8 * MiB)
    async with HostileBmc(healthy(**{"/redfish/v1/": error})).running() as bmc:
        driver = bmc.driver(settings)
        with pytest.raises(BmcError) as caught:
            await driver.power_state()
        await driver.close()
    text = str(caught.value)
    assert "HTTP 500 on GET /redfish/v1/: Fan 3 of chassis 1 failed; details" in text
    assert "…" in text  # marked as cut
    assert len(text) <= settings.max_message_chars


async def test_an_error_answer_over_the_cap_is_reported_by_its_start() -> None:
    message = "Fan 3 of chassis 1 failed; " + "details " * (3 * MiB // 8)
    error = answer({"error": {"code": "Base.1.0.GeneralError", "message": message}}, 500)
    async with HostileBmc(healthy(**{"/redfish/v1/": error})).running() as bmc:
        driver = bmc.driver()  # cap 1 MiB: the 3 MB answer is not read whole
        with pytest.raises(BmcError) as caught:
            await driver.power_state()
        await driver.close()
    text = str(caught.value)
    assert f"HTTP 500 on GET /redfish/v1/, with an answer larger than {MiB} bytes" in text
    assert '{"error": {"code": "Base.1.0.GeneralError"' in text
    assert len(text) <= INSECURE.max_message_chars


async def test_endless_headers_are_a_protocol_error_not_memory() -> None:
    async def endless_headers(
        bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> None:
        w.write(b"HTTP/1.1 200 OK\r\n")
        try:
            while True:
                w.write(b"X-Filler: " + b"a" * 1000 + b"\r\n")
                await w.drain()
                bmc.body_bytes_sent += 1012
        except ConnectionError:
            bmc.closed.set()
            raise

    async with HostileBmc(healthy(**{SYSTEM: endless_headers})).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(BmcError, match="broke the HTTP protocol"):
            await driver.power_state()
        await asyncio.wait_for(bmc.closed.wait(), 30)
        await driver.close()
    assert bmc.body_bytes_sent < 64 * MiB


# ---- time ------------------------------------------------------------------------------


async def test_a_slow_drip_is_ended_by_the_callers_deadline_and_the_connection_closed() -> None:
    async with HostileBmc(healthy(**{SYSTEM: drip()})).running() as bmc:
        driver = bmc.driver(BmcSettings(timeout=600.0, allow_insecure_http=True))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):  # the pool's deadline
                await driver.power_state()
        # Not a thread living on: the BMC sees the connection closed.
        await asyncio.wait_for(bmc.closed.wait(), 30)
        await driver.close()
    assert bmc.body_bytes_sent < 1000000


async def test_a_slow_drip_is_ended_by_the_drivers_own_deadline() -> None:
    async with HostileBmc(healthy(**{SYSTEM: drip()})).running() as bmc:
        driver = bmc.driver(BmcSettings(timeout=1.0, allow_insecure_http=True))
        with pytest.raises(TimedOut, match="did not answer in 1s"):
            await driver.power_state()
        await asyncio.wait_for(bmc.closed.wait(), 30)
        await driver.close()


# ---- shape -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("routes", "error", "says"),
    [
        pytest.param(
            healthy(**{SYSTEM: answer(None, raw=b"<html><body>Login</body></html>")}),
            BmcError, "not JSON: <html><body>Login", id="html",
        ),
        pytest.param(
            healthy(**{SYSTEM: answer(None, raw=b"[" * 200000 + b"]" * 200000)}),
            BmcError, "not JSON", id="deeply nested",
        ),
        pytest.param(healthy(**{"/redfish/v1/": answer([1, 2])}), BmcError, "not an object", id="root is a list"),
        pytest.param(
            healthy(**{"/redfish/v1/": answer({"Systems": "/redfish/v1/Systems"})}),
            BmcError, "Systems link of /redfish/v1/ is missing", id="link is not an object",
        ),
        pytest.param(
            healthy(**{"/redfish/v1/": answer({"Systems": {"@odata.id": "http://203.0.113.9/redfish/v1/Systems"}})}),
            BmcError, "is not followed", id="link to another host",
        ),
        pytest.param(
            healthy(**{"/redfish/v1/Systems": answer({"Members": [{"@odata.id": "/redfish/v1/Systems/../../etc"}]})}),
            BadAddress, r"serves no system /redfish/v1/Systems/1: it serves none \(1 more listed with unusable paths\)", id="member with dot-dot",
        ),
        pytest.param(
            healthy(**{"/redfish/v1/Systems": answer({"Members": {"a": 1}})}),
            BmcError, "has no Members list", id="members not a list",
        ),
        pytest.param(
            healthy(**{SYSTEM: system(**{"@odata.type": "#Manager.v1_0_0.Manager"})}),
            BadAddress, "is not a ComputerSystem", id="not a system",
        ),
        pytest.param(healthy(**{SYSTEM: system(PowerState=7)}), BmcError, "not a Redfish power state", id="power state a number"),
        pytest.param(healthy(**{SYSTEM: answer({"@odata.type": "#ComputerSystem.v1_0_0.ComputerSystem"})}), BmcError, "does not report its PowerState", id="no power state"),
        pytest.param(
            healthy(**{"/redfish/v1/": answer(None, 307, raw=b"")}),
            BmcError, "a redirect; not followed", id="redirect",
        ),
    ],
)  # fmt: skip
async def test_a_wrong_answer_is_a_clear_error(
    routes: dict[str, Responder], error: type[BmcError], says: str
) -> None:
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(error, match=says) as caught:
            await driver.power_state()
        await driver.close()
    assert type(caught.value) is error
    assert len(str(caught.value)) <= INSECURE.max_message_chars
    assert all(r.path.startswith("/redfish/v1/") for r in bmc.requests)


async def test_a_redirect_elsewhere_is_not_followed() -> None:
    async with HostileBmc(healthy()).running() as elsewhere:
        moved = f"http://127.0.0.1:{elsewhere.port}/redfish/v1/"

        async def redirect(
            bmc: HostileBmc, _: asyncio.StreamReader, w: asyncio.StreamWriter
        ) -> None:
            w.write(
                f"HTTP/1.1 308 Moved\r\nLocation: {moved}\r\nContent-Length: 0\r\n\r\n".encode()
            )
            await w.drain()

        async with HostileBmc(healthy(**{"/redfish/v1/": redirect})).running() as bmc:
            driver = bmc.driver()
            with pytest.raises(BmcError, match="not followed"):
                await driver.power_state()
            await driver.close()
    assert elsewhere.requests == []  # the credentials went nowhere else


# ---- reset -----------------------------------------------------------------------------


async def test_reset_posts_the_mapped_reset_type_to_the_actions_target() -> None:
    target = f"{SYSTEM}/Actions/ComputerSystem.Reset"
    async with HostileBmc(healthy(**{target: answer(None, 204, raw=b"")})).running() as bmc:
        driver = bmc.driver()
        await driver.act(PowerAction.SOFT_OFF)
        await driver.act(PowerAction.HARD_OFF)
        await driver.act(PowerAction.ON)
        await driver.close()
    posted = [json.loads(r.body)["ResetType"] for r in bmc.requests if r.method == "POST"]
    assert posted == ["GracefulShutdown", "ForceOff", "On"]
    assert {r.path for r in bmc.requests if r.method == "POST"} == {target}


async def test_a_reset_type_the_system_does_not_allow_is_unsupported_and_not_sent() -> None:
    only_on = system(
        Actions={
            "#ComputerSystem.Reset": {
                "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                "@Redfish.ActionInfo": f"{SYSTEM}/ResetActionInfo",
            }
        }
    )
    info = answer({"Parameters": [{"Name": "ResetType", "AllowableValues": ["On", "ForceOff"]}]})
    routes = healthy(**{SYSTEM: only_on, f"{SYSTEM}/ResetActionInfo": info})
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        with pytest.raises(Unsupported, match="does not offer ResetType GracefulShutdown"):
            await driver.act(PowerAction.SOFT_OFF)
        await driver.close()
    assert [r for r in bmc.requests if r.method == "POST"] == []


# ---- where the credentials go ---------------------------------------------------------


async def test_cleartext_http_is_refused_unless_allowed_and_nothing_is_sent() -> None:
    async with HostileBmc(healthy()).running() as bmc:
        driver = bmc.driver(BmcSettings(timeout=5.0))
        with pytest.raises(Refused, match="cleartext"):
            await driver.power_state()
        await driver.close()
    assert bmc.requests == []


async def test_an_address_outside_the_allowed_networks_is_refused_and_nothing_is_sent() -> None:
    settings = BmcSettings(
        timeout=5.0,
        allow_insecure_http=True,
        allowed_networks=(ipaddress.ip_network("10.20.0.0/16"),),
    )
    async with HostileBmc(healthy()).running() as bmc:
        driver = bmc.driver(settings)
        with pytest.raises(Refused, match="outside the allowed BMC networks"):
            await driver.power_state()
        await driver.close()
    assert bmc.requests == []


async def test_the_driver_connects_to_the_vetted_ip_and_names_the_host() -> None:
    async with HostileBmc(healthy()).running() as bmc:
        named = parse(f"redfish+http://bmc-7.mgmt.invalid:{bmc.port}{SYSTEM}")
        driver = RedfishDriver(named, "operator", PASSWORD, True, INSECURE, "127.0.0.1")
        assert await driver.power_state() == PowerState.ON
        await driver.close()
    assert {r.headers["host"] for r in bmc.requests} == {f"bmc-7.mgmt.invalid:{bmc.port}"}
    assert all(r.headers["authorization"].startswith("Basic ") for r in bmc.requests)


# ---- the system found, and lost -------------------------------------------------------


async def test_a_system_that_vanishes_is_a_bad_address_not_another_system() -> None:
    other = "/redfish/v1/Systems/2"
    routes = healthy(**{other: system(**{"@odata.id": other})})
    async with HostileBmc(routes).running() as bmc:
        driver = bmc.driver()
        assert await driver.power_state() == PowerState.ON
        # The BMC drops our system and lists another one only.
        del routes[SYSTEM]
        routes["/redfish/v1/Systems"] = answer({"Members": [{"@odata.id": other}]})
        with pytest.raises(BadAddress, match=f"serves no system {SYSTEM}: it serves {other}"):
            await driver.power_state()
        with pytest.raises(BadAddress, match=f"serves no system {SYSTEM}"):
            await driver.act(PowerAction.HARD_OFF)
        await driver.close()
    assert [r for r in bmc.requests if r.method == "POST"] == []
    assert other not in {r.path for r in bmc.requests}


async def test_a_closed_port_is_unreachable_in_one_short_reason() -> None:
    async with HostileBmc(healthy()).running() as bmc:
        port = bmc.port
    driver = RedfishDriver(
        parse(f"redfish+http://127.0.0.1:{port}{SYSTEM}"), "operator", PASSWORD, True, INSECURE
    )
    with pytest.raises(Unreachable) as caught:
        await driver.power_state()
    await driver.close()
    assert str(caught.value) == f"cannot reach http://127.0.0.1:{port}{SYSTEM}: connection refused"


async def test_a_broken_member_counts_as_a_system_but_is_never_driven() -> None:
    listed = answer({"Members": [{"@odata.id": SYSTEM}, {"@odata.id": "https://203.0.113.9/x"}]})
    routes = healthy(**{"/redfish/v1/Systems": listed})
    async with HostileBmc(routes).running() as bmc:
        named = bmc.driver()  # names the usable one: fine
        assert await named.power_state() == PowerState.ON
        await named.close()
        unnamed = bmc.driver(path="")  # names none: the BMC has two entries, not one
        with pytest.raises(BadAddress, match="serves 2 systems") as caught:
            await unnamed.power_state()
        await unnamed.close()
    assert "1 more listed with unusable paths" in str(caught.value)
