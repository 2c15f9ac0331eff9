"""Hosts of another namespace on a host's IPMI endpoint, with `metalmend run --controllers
host-power` as a process and the lab's pyghmi BMCs: their unknown user is a refused login
(backed off as one), and the host's own reboot goes through."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend_lab import lab
from tests.e2e.conftest import Metalmend, host
from tests.e2e.test_reboot import annotate, rebooted_after
from tests.support import until

TENANT = "t2"
INTRUDERS = 8


@pytest.fixture
def controller(hosts_lab: lab.RunningLab) -> Iterator[Metalmend]:
    power = Metalmend(hosts_lab, "host-power", 3.0)
    power.start()
    yield power
    power.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


@pytest.fixture
async def intruders(hosts_lab: lab.RunningLab, kube: AsyncClient) -> AsyncIterator[list[str]]:
    """Hosts of namespace t2 naming the lab IPMI host's BMC, with a user it does not know
    (each bound to its own Secret: metalmend would use it)."""
    spec = host(hosts_lab, "ipmi")
    await kube.create(Namespace(metadata=ObjectMeta(name=TENANT)))
    names = [f"intruder-{i}" for i in range(INTRUDERS)]
    for name in names:
        await kube.create(
            Secret(
                metadata=ObjectMeta(
                    name=name, labels={SECRET_LABEL: "true"}, annotations={HOSTS_ANNOTATION: name}
                ),
                stringData={"username": "nobody-here", "password": spec.password},
            ),
            namespace=TENANT,
        )
        await kube.create(
            BareMetalHost(
                metadata=ObjectMeta(name=name),
                spec={"online": True, "bmc": {"address": spec.address, "credentialsName": name}},
            ),
            namespace=TENANT,
        )
    yield names
    await kube.delete(Namespace, TENANT)


async def statuses(kube: AsyncClient, names: list[str]) -> dict[str, dict[str, Any]]:
    return {
        name: dict((await kube.get(BareMetalHost, name, namespace=TENANT)).get("status") or {})
        for name in names
    }


async def test_an_unknown_ipmi_user_on_a_hosts_bmc_is_a_refused_login_and_backs_off(
    hosts_lab: lab.RunningLab, controller: Metalmend, kube: AsyncClient, intruders: list[str]
) -> None:
    """Was: "did not answer within 5s", tried again after 1, 2, 4... s, each try holding
    the BMC's one slot for 5 s, and the host's own hard reboot waited up to a minute."""

    async def all_refused() -> bool:
        found = await statuses(kube, intruders)
        print({n: (s.get("errorType"), s.get("errorMessage")) for n, s in found.items()})
        return all(
            s.get("errorType") == "registration error"
            and "refused the login" in str(s.get("errorMessage"))
            for s in found.values()
        )

    await until(all_refused, within=60)
    before = {n: s.get("errorCount") for n, s in (await statuses(kube, intruders)).items()}
    spec = host(hosts_lab, "ipmi")
    asked = dt.datetime.now(dt.UTC)
    await annotate(kube, spec.name, {REBOOT: '{"mode":"hard"}'})
    await until(lambda: rebooted_after(kube, spec.name, asked), within=60)
    # A refused login waits minutes before the next (BMCs lock accounts): no new try.
    after = {n: s.get("errorCount") for n, s in (await statuses(kube, intruders)).items()}
    assert after == before, f"tried again while backing off: {before} -> {after}"
