"""A Redfish BMC whose line closes every connection (a cut link, a BMC restarting) is
unreachable, as ``lab fault bmc-down`` shows it: not a TLS problem for the operator to fix."""

from __future__ import annotations

import asyncio

import pytest

from metalmend.bmc.address import parse
from metalmend.bmc.errors import Unreachable
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings


async def test_a_line_that_closes_every_connection_is_unreachable() -> None:
    async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()  # an orderly close before the TLS handshake: EOF to the client

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    address = parse(f"redfish+https://127.0.0.1:{port}/redfish/v1/Systems/1")
    driver = RedfishDriver(address, "admin", "password", False, BmcSettings(timeout=5))
    try:
        with pytest.raises(Unreachable, match=r"cannot reach .*closed during TLS"):
            await driver.power_state()
    finally:
        await driver.close()
        server.close()
        await server.wait_closed()
