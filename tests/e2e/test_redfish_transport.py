"""The Redfish driver's transport (bmc/curl.py: libcurl's multi interface on the asyncio
loop) against real servers on loopback, written here or in test_redfish_hostile: a BMC
that hangs up idle connections, answers of exactly the byte limit and one byte more, a
proxy named in the environment, and a name that resolves elsewhere than the vetted IP."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from metalmend.bmc.address import parse
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import BmcError
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.pki import CertificateAuthority
from tests.e2e.test_redfish_hostile import (
    INSECURE,
    PASSWORD,
    SYSTEM,
    HostileBmc,
    answer,
    healthy,
    system,
)


class CountingBmc(HostileBmc):
    """A HostileBmc that counts the connections it accepted."""

    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await super().serve(reader, writer)


@contextlib.asynccontextmanager
async def listening(
    bmc: HostileBmc, host: str, port: int = 0, context: ssl.SSLContext | None = None
) -> AsyncIterator[HostileBmc]:
    """``bmc`` serving on ``host`` (a loopback address) and ``port`` (0: any)."""
    server = await asyncio.start_server(bmc.serve, host, port, ssl=context)
    bmc.port = server.sockets[0].getsockname()[1]
    try:
        yield bmc
    finally:
        server.close()
        for task in list(bmc._tasks):
            task.cancel()
        await asyncio.gather(*bmc._tasks, return_exceptions=True)


# ---- idle connections -----------------------------------------------------------------


async def test_a_bmc_that_hangs_up_an_idle_connection_costs_no_failed_read() -> None:
    """The BMC answers with keep-alive, then closes the connection while it is idle (as
    real BMCs do after a second or so): the next call finds it closed and connects again."""
    reply = system()

    async def answer_then_hang_up(
        bmc: HostileBmc, r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> None:
        await reply(bmc, r, w)
        w.close()  # idle: closed by the BMC, the client not told

    bmc = CountingBmc(healthy(**{SYSTEM: answer_then_hang_up}))
    async with listening(bmc, "127.0.0.1"):
        driver = bmc.driver()
        try:
            for _ in range(3):
                assert await driver.power_state() == PowerState.ON
                await asyncio.sleep(0.05)  # the close reaches the client
        finally:
            await driver.close()
    gets = [r for r in bmc.requests if r.path == SYSTEM]
    assert len(gets) == 3  # discovery's read of the system, then two polls
    assert bmc.connections >= 3


async def test_a_hang_up_racing_the_next_request_is_retried_on_a_new_connection() -> None:
    """The BMC takes the next request on a kept connection and closes it without an
    answer (its idle timer fired as the request arrived): the request is sent again on a
    fresh connection, once, and the call succeeds."""
    reply = system()
    # The connections' writers themselves, kept alive: the id() of a closed one's freed
    # writer can be a new connection's, which then looked kept and was hung up on.
    served: set[asyncio.StreamWriter] = set()

    async def once_per_connection(
        bmc: HostileBmc, r: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> None:
        if w in served:
            w.close()  # a request on a kept connection: hung up, no answer
            return
        served.add(w)
        await reply(bmc, r, w)

    bmc = CountingBmc(healthy(**{SYSTEM: once_per_connection}))
    async with listening(bmc, "127.0.0.1"):
        driver = bmc.driver()
        try:
            assert await driver.power_state() == PowerState.ON
            assert await driver.power_state() == PowerState.ON
        finally:
            await driver.close()
    gets = [r for r in bmc.requests if r.path == SYSTEM]
    assert len(gets) == 3  # discovery's, the one hung up on, the one sent again


async def test_an_action_is_never_sent_twice_when_a_kept_connection_was_closed() -> None:
    """The same BMC, and a reset after a read: the reset goes on a fresh connection, so a
    hang-up of the kept one cannot make libcurl send it again (a reset a BMC received and
    then hung up on would be done twice)."""
    target = f"{SYSTEM}/Actions/ComputerSystem.Reset"
    reply, accepted = system(), answer(None, 204, raw=b"")
    # The connections' writers themselves, kept alive: the id() of a closed one's freed
    # writer can be a new connection's, which then looked kept and was hung up on.
    served: set[asyncio.StreamWriter] = set()

    def once_per_connection(respond: Any) -> Any:
        async def serve(bmc: HostileBmc, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            if w in served:
                w.close()  # a request on a kept connection: hung up, no answer
                return
            served.add(w)
            await respond(bmc, r, w)

        return serve

    routes = healthy(**{SYSTEM: once_per_connection(reply), target: once_per_connection(accepted)})
    bmc = CountingBmc(routes)
    async with listening(bmc, "127.0.0.1"):
        driver = bmc.driver()
        try:
            assert await driver.power_state() == PowerState.ON  # a connection kept
            await driver.act(PowerAction.ON)
        finally:
            await driver.close()
    posts = [r for r in bmc.requests if r.method == "POST"]
    assert len(posts) == 1, posts


# ---- the byte limit -------------------------------------------------------------------


@pytest.mark.parametrize("extra", [0, 1], ids=["exactly the limit", "one byte more"])
async def test_the_byte_limit_is_exact(extra: int) -> None:
    # The system's answer padded to the limit (plus ``extra``) with JSON whitespace.
    limit = 4096
    body = b'{"@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "PowerState": "On"}'
    padded = body[:-1] + b" " * (limit + extra - len(body)) + b"}"
    assert len(padded) == limit + extra
    settings = BmcSettings(timeout=20.0, allow_insecure_http=True, max_response_bytes=limit)
    bmc = HostileBmc(healthy(**{SYSTEM: answer(None, raw=padded)}))
    async with listening(bmc, "127.0.0.1"):
        driver = bmc.driver(settings)
        try:
            if extra:
                with pytest.raises(BmcError, match=f"answer larger than {limit} bytes"):
                    await driver.power_state()
            else:
                assert await driver.power_state() == PowerState.ON
        finally:
            await driver.close()


# ---- the environment ------------------------------------------------------------------


async def test_a_proxy_in_the_environment_is_never_used(monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = HostileBmc(healthy())
    async with listening(proxy, "127.0.0.1"):
        url = f"http://127.0.0.1:{proxy.port}"
        for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy",
                     "ALL_PROXY"):  # fmt: skip
            monkeypatch.setenv(name, url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        bmc = HostileBmc(healthy())
        async with listening(bmc, "127.0.0.1"):
            driver = bmc.driver()
            try:
                assert await driver.power_state() == PowerState.ON
            finally:
                await driver.close()
    assert proxy.requests == [], "the credentials went to the proxy"
    assert bmc.requests


# ---- where the connection goes --------------------------------------------------------


async def test_a_name_that_resolves_elsewhere_is_never_dialled() -> None:
    """``localhost`` resolves to 127.0.0.1, where a decoy listens on the same port; the
    vetted IP is 127.0.0.2 (both loopback). Only the vetted IP is dialled, and the request
    still names the host of the address."""
    vetted = CountingBmc(healthy())
    async with listening(vetted, "127.0.0.2"):
        decoy = CountingBmc(healthy())
        async with listening(decoy, "127.0.0.1", vetted.port):
            named = parse(f"redfish+http://localhost:{vetted.port}{SYSTEM}")
            driver = RedfishDriver(named, "operator", PASSWORD, True, INSECURE, "127.0.0.2")
            try:
                assert await driver.power_state() == PowerState.ON
                assert await driver.power_state() == PowerState.ON
            finally:
                await driver.close()
    assert decoy.connections == 0
    assert decoy.requests == []
    assert vetted.requests
    assert {r.headers["host"] for r in vetted.requests} == {f"localhost:{vetted.port}"}


@pytest.fixture
def named_certificate(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A serving context whose certificate names bmc-7.example.invalid only (no IP)."""
    ca = CertificateAuthority(tmp_path / "pki")
    serving = ca.issue("bmc", "bmc-7", dns_names=("bmc-7.example.invalid",), server=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(serving.cert, serving.key)
    return context, ca.pair.cert


async def test_tls_to_the_vetted_ip_checks_the_certificate_of_the_name(
    named_certificate: tuple[ssl.SSLContext, Path],
) -> None:
    """Dialled by IP, the TLS handshake still sends the address's name (SNI) and checks
    the certificate against it: the name's certificate is accepted, and the same server
    addressed by its IP is refused (its certificate does not name the IP)."""
    context, ca = named_certificate
    settings = BmcSettings(timeout=20.0)
    bmc = HostileBmc(healthy())
    async with listening(bmc, "127.0.0.1", context=context):
        named = parse(f"redfish://bmc-7.example.invalid:{bmc.port}{SYSTEM}")
        driver = RedfishDriver(named, "operator", PASSWORD, str(ca), settings, "127.0.0.1",
                               system_cas=False)  # fmt: skip
        try:
            assert await driver.power_state() == PowerState.ON
        finally:
            await driver.close()
        by_ip = parse(f"redfish://127.0.0.1:{bmc.port}{SYSTEM}")
        refused = RedfishDriver(by_ip, "operator", PASSWORD, str(ca), settings, system_cas=False)
        try:
            with pytest.raises(BmcError, match="TLS certificate is not trusted"):
                await refused.power_state()
        finally:
            await refused.close()
    assert {r.headers["host"] for r in bmc.requests} == {f"bmc-7.example.invalid:{bmc.port}"}


async def test_an_untrusted_certificate_sends_no_request(
    named_certificate: tuple[ssl.SSLContext, Path], tmp_path: Path
) -> None:
    context, _ = named_certificate
    other = CertificateAuthority(tmp_path / "other").pair.cert  # not the server's CA
    bmc = HostileBmc(healthy())
    async with listening(bmc, "127.0.0.1", context=context):
        named = parse(f"redfish://bmc-7.example.invalid:{bmc.port}{SYSTEM}")
        driver = RedfishDriver(named, "operator", PASSWORD, str(other), BmcSettings(timeout=20.0),
                               "127.0.0.1", system_cas=False)  # fmt: skip
        try:
            with pytest.raises(BmcError, match="TLS certificate is not trusted") as caught:
                await driver.power_state()
        finally:
            await driver.close()
    assert bmc.requests == []  # the credentials were never sent
    assert PASSWORD not in str(caught.value)
    assert "operator" not in str(caught.value)
