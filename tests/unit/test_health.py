"""What /readyz and /healthz mean (kube/manager.py), served over IPv4 and IPv6. No API
server: a manager that never ran, with its parts in the states the endpoints report."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import ConfigMap

from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.health import bind_address, serving
from metalmend.kube.manager import LeaderElection, Manager

NOWHERE = KubeConfig.from_dict(
    {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "never-sent"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
)


async def nothing(key: str) -> Result:
    return DONE


@pytest.fixture
async def client() -> AsyncIterator[AsyncClient]:
    kube = AsyncClient(NOWHERE)
    yield kube
    await kube.close()


async def test_a_standby_is_live_but_not_ready(client: AsyncClient) -> None:
    manager = Manager(client, leader_election=LeaderElection(lease_name="m", namespace="ns"))
    assert manager.not_live() == []
    (why,) = manager.not_ready()
    assert why.startswith("standby: waiting for the lease ns/m")
    manager.controllers_running = True  # it leads now
    assert manager.not_ready() == []


async def test_an_api_server_out_of_reach_is_not_ready_then_not_live(client: AsyncClient) -> None:
    manager = Manager(client)
    informer = manager.informer(ConfigMap)
    informer.synced.set()
    manager.controllers_running = True
    assert manager.not_ready() == []
    informer.last_error = "watch configmaps: ConnectError: connection refused"
    informer.failing_since = time.monotonic()
    assert manager.not_ready() == [
        "API server out of reach: watch configmaps: ConnectError: connection refused"
    ]
    assert manager.not_live() == []  # a blip: not a reason to restart
    informer.failing_since = time.monotonic() - manager.api_lost_after - 1
    (why,) = manager.not_live()
    assert why.startswith("API server out of reach for 6")


async def test_a_dead_controller_worker_makes_the_process_not_live(client: AsyncClient) -> None:
    manager = Manager(client)
    controller = manager.add(Controller("broken", nothing))
    controller.died = "controller broken: a worker ended: RuntimeError: boom"
    assert manager.not_live() == [controller.died]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost"])
async def test_health_binds_ipv4_and_ipv6(client: AsyncClient, host: str) -> None:
    manager = Manager(client)
    manager.controllers_running = True
    async with serving(manager, host, 0) as port:
        literal = host.strip("[]")
        url_host = f"[{literal}]" if ":" in literal else literal
        async with httpx.AsyncClient(base_url=f"http://{url_host}:{port}") as http:
            assert (await http.get("/healthz")).text == "ok"
            assert (await http.get("/readyz")).text == "ok"
    await asyncio.sleep(0)


def test_a_taken_port_is_one_line() -> None:
    taken = bind_address("[::1]", 0)
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError, match=r"^cannot serve health endpoints on \[::1\]:\d+: "):
            bind_address("::1", port)
    finally:
        taken.close()
    assert socket.has_ipv6
