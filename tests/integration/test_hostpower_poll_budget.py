"""power.poll_budget on the real API server: with more hosts than the budget allows at
power.poll_interval, host-power's idle polls keep the stretched interval (policy.hostpower
poll_every), /metrics shows both intervals, and the log says why, once."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from metalmend.api.power import PowerState
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcPool
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend.controllers import hostpower as hostpower_controller
from metalmend.controllers import metrics as hostpower_metrics
from metalmend.kube.manager import Manager
from metalmend.policy.hostpower import PowerSettings, poll_grid, poll_phase, spread_poll
from metalmend.settings import BmcSettings, RuntimeSettings, Settings
from metalmend_lab.controlplane import free_port
from tests.support import until

HOSTS = 3
BUDGET = 0.1  # reads a second: 3 hosts at one read every 20 s would be 0.15
STRETCHED = 30.0  # 3 / 0.1


class OnDriver:
    """A BMC that answers at once: the server is on."""

    async def power_state(self) -> PowerState:
        return PowerState.ON

    async def act(self, action: object) -> None:
        return None

    async def close(self) -> None:
        return None

    def hang_up(self) -> None:
        return None


async def test_idle_polls_keep_the_interval_the_budget_allows_and_metrics_say_it(
    aclient: AsyncClient, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"w{i}" for i in range(HOSTS)]
    await aclient.create(
        Secret(
            metadata=ObjectMeta(
                name="bmc",
                labels={SECRET_LABEL: "true"},
                annotations={HOSTS_ANNOTATION: ",".join(names)},
            ),
            stringData={"username": "admin", "password": "secret"},
        ),
        namespace=namespace,
    )
    for name in names:
        address = f"ipmi://127.0.0.1:{free_port()}"
        await aclient.create(
            BareMetalHost(
                metadata=ObjectMeta(name=name),
                spec={"online": True, "bmc": {"address": address, "credentialsName": "bmc"}},
            ),
            namespace=namespace,
        )
    settings = Settings(
        runtime=RuntimeSettings(namespace=namespace),
        bmc=BmcSettings(timeout=5),
        power=PowerSettings(poll_interval=20.0, poll_budget=BUDGET),
    )
    manager = Manager(aclient)
    pool = BmcPool(BmcSettings(timeout=5), driver_factory=lambda target, ip: OnDriver())
    controller = hostpower_controller.HostPowerController(manager, settings, bmcs=pool)
    running = asyncio.create_task(manager.run())
    caplog.set_level(logging.INFO, logger=hostpower_controller.__name__)
    try:
        await manager.wait_synced()
        await until(lambda: len(controller.hosts.store) == HOSTS, within=30)
        key = f"{namespace}/w0"

        slots: list[dt.datetime] = []

        async def idle_poll() -> bool:
            """A reconcile once the host's power status is written (in the cache): its
            requeue is the idle poll."""
            host = controller.hosts.store.get(key)
            written = host is not None and (host.get("status") or {}).get("poweredOn") is True
            result = await controller.reconcile(key)
            if written and result.requeue_at is not None:
                slots.append(result.requeue_at)
            return bool(slots)

        await until(idle_poll, within=30)
        slot = slots[0]
        now = dt.datetime.now(dt.UTC)
        wait = (slot - now).total_seconds()
        assert 0.25 * STRETCHED - 1 <= wait <= 1.25 * STRETCHED, wait
        # On the host's own slot of a 30 s interval (not of the configured 20 s one), in
        # this process's batch: rounded down to its grid (1 s for 3 hosts), shifted by its
        # own draw.
        grid = poll_grid(settings.power, HOSTS, STRETCHED)
        assert grid == 1.0
        early = (poll_phase(key) * STRETCHED - slot.timestamp()) % STRETCHED
        assert early < grid + 0.01 or STRETCHED - early < 0.01, early
        batch = spread_poll(slot, STRETCHED, poll_phase(key), grid, controller.grid_shift)
        assert (batch - slot).total_seconds() == pytest.approx(STRETCHED, abs=0.01)

        samples = controller.cache_samples()
        name = hostpower_metrics.POLL_INTERVAL.name
        assert (name, ("configured",), 20.0) in samples
        assert (name, ("effective",), STRETCHED) in samples
        said = [r.getMessage() for r in caplog.records if "power.poll_budget" in r.getMessage()]
        assert len(said) == 1, said
        assert "every 30s instead" in said[0], said[0]
        assert "--power-poll-budget" in said[0], said[0]
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await pool.close()
