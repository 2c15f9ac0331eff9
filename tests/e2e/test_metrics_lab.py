"""/metrics of a real `metalmend run` process against the lab, read over HTTP as Prometheus
reads it: BMC calls by protocol, operation and outcome, reboot requests pending (from the
informer cache, so a restarted process reports them at once), remediations by phase, and
no host name or BMC address in any label."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcPool, PowerState
from metalmend.bmc.settings import BmcSettings
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend, host, target
from tests.support import until

CONTROLLERS = "host-power,metal3-remediation,machine-remediation"
HELD = "reboot.metal3.io/metrics-test"  # a keyed request: holds the host off until removed

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def controller(hosts_lab: lab.RunningLab) -> Iterator[Metalmend]:
    process = Metalmend(hosts_lab, CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def bmcs(hosts_lab: lab.RunningLab) -> AsyncIterator[BmcPool]:
    pool = BmcPool(BmcSettings(timeout=10, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    yield pool
    await pool.close()


def scrape_text(process: Metalmend) -> str:
    answer = httpx.get(f"http://127.0.0.1:{process.port}/metrics", timeout=5)
    answer.raise_for_status()
    return answer.text


def scrape(process: Metalmend) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(scrape_text(process)):
        for sample in family.samples:
            samples[sample.name, frozenset(sample.labels.items())] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def bmc_calls(samples: Samples, protocol: str, operation: str, outcome: str = "success") -> float:
    return value(
        samples,
        "metalmend_bmc_request_duration_seconds_count",
        protocol=protocol,
        operation=operation,
        outcome=outcome,
    )


async def annotate(kube: AsyncClient, name: str, changes: dict[str, Any]) -> None:
    await kube.patch(
        BareMetalHost, name, {"metadata": {"annotations": changes}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip


async def test_a_held_reboot_shows_as_pending_and_its_bmc_calls_are_counted(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, bmcs: BmcPool
) -> None:
    ipmi, redfish = host(hosts_lab, "ipmi"), host(hosts_lab, "redfish")
    # host-power reads every host's power at start: both protocols are timed
    await until(
        lambda: (
            bmc_calls(scrape(controller), "ipmi", "power_state") >= 1
            and bmc_calls(scrape(controller), "redfish", "power_state") >= 1
        ),
        within=30,
    )
    before = scrape(controller)
    assert value(before, "metalmend_reboot_requests_pending", requester="other", mode="hard") == 0

    await annotate(kube, ipmi.name, {HELD: '{"mode":"hard"}'})

    async def off() -> bool:
        return await bmcs.power_state(target(ipmi)) == PowerState.OFF

    await until(off, within=15)
    await until(lambda: bmc_calls(scrape(controller), "ipmi", "power_off_hard") >= 1, within=5)
    held = scrape(controller)
    pending = ("metalmend_reboot_requests_pending", {"requester": "other", "mode": "hard"})
    assert value(held, pending[0], **pending[1]) == 1
    assert value(held, "metalmend_reboot_request_oldest_age_seconds") >= 0
    assert value(held, "metalmend_reconcile_total", controller="host-power", outcome="success") > 0

    # Killed and started again: counters start over, but what is pending is read from the
    # cache, not remembered.
    controller.kill()
    controller.start()
    await until(lambda: value(scrape(controller), pending[0], **pending[1]) == 1, within=15)

    await annotate(kube, ipmi.name, {HELD: None})
    await until(lambda: bmc_calls(scrape(controller), "ipmi", "power_on") >= 1, within=15)
    await until(lambda: value(scrape(controller), pending[0], **pending[1]) == 0, within=15)
    after = scrape(controller)
    assert value(after, "metalmend_bmc_requests_in_flight") >= 0
    assert value(after, "metalmend_hosts_bmc_error", error_type="power management error") == 0
    # every remediation phase is a series, at 0 here: charts have a line from the start
    assert ("metalmend_remediations", frozenset({("controller", "metal3-remediation"),
            ("phase", "fencing")})) in after  # fmt: skip
    assert value(after, "metalmend_remediations", controller="machine-remediation",
                 phase="waiting-to-start") == 0  # fmt: skip
    # bounded labels: no host, system or BMC address becomes a series
    text = scrape_text(controller)
    for private in (ipmi.name, redfish.name, redfish.system_id, "127.0.0.1"):
        assert private not in text
