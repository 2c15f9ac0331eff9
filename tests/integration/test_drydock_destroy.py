"""Drydock's destroy_nodes (docs/destroy.md) against the real API server and a real
database (SQLite file and PostgreSQL): ``metalmend serve`` runs with the ServiceAccount and
ClusterRoles of deploy/rbac/serve.yaml; callers are real ServiceAccount tokens.

Two stand-ins, at the edges this test does not cover: the test plays host-power (it
reports the host off once ``spec.online`` is false, and removes the reboot annotations of a
deprovisioned host, as metalmend run does: test_serve_interlock.py does the same), and a
BMC in memory serves the host's drives (the Redfish erase itself is tested against the
lab's emulator: tests/e2e/test_lab_destroy.py)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import AsyncClient, Client, KubeConfig, codecs
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.api.storage import Drive
from metalmend.bmc import BmcTarget
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend.bmc.errors import Unsupported
from metalmend.bmc.storage import EraseStatus
from metalmend.db import Database
from metalmend.destroy import routes as drydock
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.web import deps
from metalmend_lab.controlplane import ControlPlane
from metalmend_lab.servedeploy import grant_bmc_credentials
from tests.integration.test_serve_promenade import bearer, status_of, token
from tests.support import until

SERVE_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "serve.yaml"
TASKS = "/drydock/api/v1.0/tasks"
FAST = DestroySettings(poll_interval=0.1, bmc_retry=0.2, lease_seconds=1.5)


# ---- a BMC in memory --------------------------------------------------------------------


@dataclass
class Bmc:
    """Drives per system (the BMC address); an erase takes ``polls`` looks to finish."""

    drives: dict[str, list[Drive]] = field(default_factory=dict)
    erasing: dict[str, int] = field(default_factory=dict)  # drive id -> looks left
    erased: list[str] = field(default_factory=list)
    starts: list[str] = field(default_factory=list)
    polls: int = 3
    ipmi: frozenset[str] = frozenset()

    def _system(self, target: BmcTarget) -> str:
        if target.address.protocol == "ipmi":
            raise Unsupported(f"{target.address}: IPMI has no drives to erase")
        return target.address.system_path

    async def drives_of(self, target: BmcTarget) -> list[Drive]:
        return list(self.drives[self._system(target)])

    async def start_erase(self, target: BmcTarget, drive_id: str) -> str | None:
        self._system(target)
        self.starts.append(drive_id)
        self.erasing.setdefault(drive_id, self.polls)
        return f"/tasks/{drive_id}"

    async def erase_status(
        self, target: BmcTarget, drive_id: str, monitor: str | None = None
    ) -> EraseStatus:
        self._system(target)
        left = self.erasing.get(drive_id)
        if left is None:
            return EraseStatus(True)
        if left <= 1:
            del self.erasing[drive_id]
            self.erased.append(drive_id)
            return EraseStatus(True, 100)
        self.erasing[drive_id] = left - 1
        return EraseStatus(False, 50)


class Pool:
    """The DrivePool of ``metalmend serve`` over the in-memory BMC."""

    def __init__(self, bmc: Bmc) -> None:
        self.bmc = bmc

    async def drives(self, target: BmcTarget) -> list[Drive]:
        return await self.bmc.drives_of(target)

    async def start_erase(self, target: BmcTarget, drive_id: str) -> str | None:
        return await self.bmc.start_erase(target, drive_id)

    async def erase_status(
        self, target: BmcTarget, drive_id: str, monitor: str | None = None
    ) -> EraseStatus:
        return await self.bmc.erase_status(target, drive_id, monitor)


# ---- the cluster: Nodes and their hosts --------------------------------------------------


def disks(host: str) -> list[Drive]:
    base = f"/redfish/v1/Systems/{host}/Storage/1/Drives"
    return [
        Drive(f"{base}/0", capacity_bytes=100 << 30, serial_number=f"{host}-os"),
        Drive(f"{base}/1", capacity_bytes=500 << 30, serial_number=f"{host}-data"),
    ]


def add_host(kube: Client, namespace: str, name: str, bmc: Bmc, *, ipmi: bool = False) -> str:
    """A Node and its provisioned BareMetalHost (on, with a consumer), its BMC Secret."""
    system = f"/redfish/v1/Systems/{name}"
    address = "ipmi://10.0.0.9:623" if ipmi else f"redfish+http://127.0.0.1:9{system}"
    node = f"{namespace}-{name}"
    grant_bmc_credentials(kube, namespace)  # as an operator binds serve's role per namespace
    kube.create(
        Node(
            metadata=ObjectMeta(name=node), spec=NodeSpec(providerID=f"metal3://{namespace}/{name}")
        )
    )
    kube.create(
        Secret(
            metadata=ObjectMeta(
                name=f"{name}-bmc", labels={SECRET_LABEL: SECRET_LABEL_VALUE},
                annotations={HOSTS_ANNOTATION: name},
            ),
            stringData={"username": "admin", "password": "secret"},
        ),
        namespace=namespace,
    )  # fmt: skip
    spec = {
        "online": True,
        "bmc": {"address": address, "credentialsName": f"{name}-bmc"},
        "consumerRef": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                        "name": name, "namespace": namespace},
        "rootDeviceHints": {"serialNumber": f"{name}-os"},
    }  # fmt: skip
    kube.create(BareMetalHost(metadata=ObjectMeta(name=name), spec=spec), namespace=namespace)
    status = {
        "poweredOn": True,
        "operationalStatus": "OK",
        "provisioning": {"state": "provisioned"},
    }
    kube.patch(BareMetalHost.Status, name, {"status": status}, namespace=namespace,
               patch_type=PatchType.MERGE)  # fmt: skip
    if not ipmi:
        bmc.drives[system] = disks(name)
    return node


async def play_host_power(client: AsyncClient, namespace: str) -> None:
    """What host-power does here: the host reported off once spec.online is false; reboot
    annotations removed once it is deprovisioned."""
    while True:
        async for host in client.list(BareMetalHost, namespace=namespace):
            spec, status = host.get("spec") or {}, host.get("status") or {}
            name = host.metadata.name
            if spec.get("online") is False and status.get("poweredOn") is not False:
                await client.patch(BareMetalHost.Status, name, {"status": {"poweredOn": False}},
                                   namespace=namespace, patch_type=PatchType.MERGE)  # fmt: skip
            state = (status.get("provisioning") or {}).get("state")
            reboot = [
                k for k in host.metadata.annotations or {} if k.startswith("reboot.metal3.io")
            ]
            if state == "deprovisioning" and reboot:
                changes = {"metadata": {"annotations": dict.fromkeys(reboot)}}
                await client.patch(BareMetalHost, name, changes, namespace=namespace,
                                   patch_type=PatchType.MERGE)  # fmt: skip
        await asyncio.sleep(0.1)


# ---- the service ---------------------------------------------------------------------------


@pytest.fixture
def serve_kubeconfig(control_plane: ControlPlane, kube: Client) -> Path:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    return control_plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database.open(database_url)
    db.upgrade()
    yield db
    db.dispose()


@dataclass
class Service:
    http: httpx.AsyncClient
    app: Any
    bmc: Bmc
    client: AsyncClient


@contextlib.asynccontextmanager
async def service(
    kubeconfig: Path, database: Database, bmc: Bmc, settings: DestroySettings = FAST
) -> AsyncIterator[Service]:
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    root = compose(client, database=database, drives=Pool(bmc), destroy=settings)
    app = create_app(root)
    root.start()  # the lifespan's work (httpx's transport runs no lifespan)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as h:
            yield Service(h, app, bmc, client)
    finally:
        await root.stop()
        await client.close()


@pytest.fixture
async def world(
    serve_kubeconfig: Path, database: Database, aclient: AsyncClient, namespace: str
) -> AsyncIterator[Service]:
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    async with service(serve_kubeconfig, database, Bmc()) as served:
        yield served
    host_power.cancel()


@pytest.fixture
def admin(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    return token(control_plane, kube, namespace, "drydock-admin", "metalmend-drydock-admin")


def destroy(nodes: list[str], preserve: bool = False) -> dict[str, Any]:
    return {
        "action": "destroy_nodes",
        "design_ref": "deckhand+http://127.0.0.1:9/revisions/1/rendered-documents",
        "node_filter": {"filter_set_type": "union",
                        "filter_set": [{"filter_type": "union", "node_names": nodes}]},
        "preserve-local-storage": preserve,
    }  # fmt: skip


async def finished(http: httpx.AsyncClient, task_id: str, who: str, within: float = 60) -> Any:
    answer: dict[str, Any] = {}

    async def complete() -> bool:
        nonlocal answer
        answer = (await http.get(f"{TASKS}/{task_id}", headers=bearer(who))).json()
        return answer["status"] == "complete"

    await until(complete, within)
    return answer


def messages(task: dict[str, Any], node: str) -> list[str]:
    return [m["message"] for m in task["result"]["details"]["messageList"] if m["context"] == node]


# ---- tests ---------------------------------------------------------------------------------


async def test_destroy_powers_off_wipes_every_drive_and_releases_the_host(
    world: Service, kube: Client, namespace: str, admin: str
) -> None:
    node = add_host(kube, namespace, "h1", world.bmc)
    answer = await world.http.post(TASKS, json=destroy([node]), headers=bearer(admin))
    assert answer.status_code == 201, answer.text
    task = answer.json()
    assert (task["kind"], task["action"], task["status"]) == ("Task", "destroy_nodes", "requested")
    assert task["result"]["status"] == "incomplete"
    assert answer.headers["Location"] == f"{TASKS}/{task['task_id']}"

    done = await finished(world.http, task["task_id"], admin)
    assert done["result"]["status"] == "success", done["result"]
    assert (done["result"]["successes"], done["result"]["failures"]) == ([node], [])
    assert sorted(world.bmc.erased) == sorted(d.id for d in disks("h1"))
    assert sorted(world.bmc.starts) == sorted(world.bmc.erased)  # each erase asked once
    host = kube.get(BareMetalHost, "h1", namespace=namespace)
    assert host["spec"]["online"] is False
    assert "consumerRef" not in host["spec"]
    assert host["status"]["provisioning"]["state"] == "available"
    said = messages(done, node)
    assert said[0].startswith("claim: host")
    assert any(m.startswith("wipe: done: erased") for m in said)
    assert said[-1].startswith("release: host")
    first = done["result"]["details"]["messageList"][0]
    assert (first["context_type"], first["context"], first["error"]) == ("node", node, False)
    reasons = {e.reason for e in kube.list(Event, namespace=namespace)}
    assert {"DestroyStarted", "DestroyPowerOff", "DriveErased", "DestroyReleased"} <= reasons


async def test_preserve_local_storage_erases_only_the_os_drive(
    world: Service, kube: Client, namespace: str, admin: str
) -> None:
    node = add_host(kube, namespace, "h2", world.bmc)
    answer = await world.http.post(TASKS, json=destroy([node], True), headers=bearer(admin))
    done = await finished(world.http, answer.json()["task_id"], admin)
    assert done["result"]["status"] == "success", done["result"]
    assert done["preserve-local-storage"] is True
    assert world.bmc.erased == [disks("h2")[0].id]
    roles = {d["serial"]: (d["role"], d["erase"]) for d in done["nodes"][node]["drives"]}
    assert roles == {"h2-os": ("os", "erased"), "h2-data": ("data", "preserve")}


async def test_an_ipmi_host_is_reported_not_wiped_and_is_not_released(
    world: Service, kube: Client, namespace: str, admin: str
) -> None:
    redfish = add_host(kube, namespace, "h3", world.bmc)
    ipmi = add_host(kube, namespace, "h4", world.bmc, ipmi=True)
    answer = await world.http.post(TASKS, json=destroy([redfish, ipmi]), headers=bearer(admin))
    done = await finished(world.http, answer.json()["task_id"], admin)
    result = done["result"]
    assert result["status"] == "partial_success"
    assert (result["successes"], result["failures"]) == ([redfish], [ipmi])
    last = [m for m in result["details"]["messageList"] if m["context"] == ipmi][-1]
    assert last["error"] is True
    assert "drives NOT wiped" in last["message"]
    assert "IPMI" in last["message"]
    host = kube.get(BareMetalHost, "h4", namespace=namespace)
    assert host["status"]["provisioning"]["state"] == "provisioned"  # not released
    assert host["spec"]["online"] is False  # but off


async def test_the_power_off_is_acted_on_when_the_host_reports_it_not_at_the_next_poll(
    serve_kubeconfig: Path,
    database: Database,
    aclient: AsyncClient,
    kube: Client,
    namespace: str,
    admin: str,
) -> None:
    """With an hour between polls, only the watch of the host (serve's role may watch
    hosts) can see host-power's report of the power-off: the task ends long before."""
    hourly = replace(FAST, poll_interval=3600.0)
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    try:
        async with service(serve_kubeconfig, database, Bmc(), hourly) as served:
            ipmi = add_host(kube, namespace, "h9", served.bmc, ipmi=True)  # no erase to poll
            answer = await served.http.post(TASKS, json=destroy([ipmi]), headers=bearer(admin))
            assert answer.status_code == 201, answer.text
            done = await finished(served.http, answer.json()["task_id"], admin)
    finally:
        host_power.cancel()
    assert done["result"]["failures"] == [ipmi]  # IPMI: reported not wiped, after the off
    assert any(m.startswith("power-off: ") or "off" in m for m in messages(done, ipmi))
    assert kube.get(BareMetalHost, "h9", namespace=namespace)["status"]["poweredOn"] is False


async def test_a_node_under_remediation_is_refused_before_anything_is_stored(
    world: Service, kube: Client, namespace: str, admin: str
) -> None:
    node = add_host(kube, namespace, "h5", world.bmc)
    kube.patch(BareMetalHost, "h5", {"metadata": {"annotations": {
        "reboot.metal3.io/machine-remediation": ""}}}, namespace=namespace,
        patch_type=PatchType.MERGE)  # fmt: skip
    answer = await world.http.post(TASKS, json=destroy([node]), headers=bearer(admin))
    body = status_of(answer, 409, "Conflict")
    assert "under remediation" in body["message"]
    listed = (await world.http.get(TASKS, headers=bearer(admin))).json()
    assert [t for t in listed if node in t["nodes"]] == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        pytest.param({**destroy(["x"]), "node_filter": None}, "null filter would select every",
                     id="a-null-filter-is-refused"),
        pytest.param({**destroy(["x"]), "node_filter": {"filter_set": [{"node_tags": ["a"]}]}},
                     "node_tags not supported", id="node-tags-are-not-supported"),
        pytest.param({**destroy(["x"]), "action": "deploy_nodes"}, "deploy_nodes is not served",
                     id="other-actions-are-not-served"),
        pytest.param({**destroy(["x"]), "preserve-local-storage": "yes"}, "true or false",
                     id="preserve-must-be-a-boolean"),
        pytest.param({**destroy(["Bad_Name"])}, "is not a valid Node name", id="bad-node-name"),
    ],
)  # fmt: skip
async def test_bad_requests_are_400_status_bodies_naming_the_problem(
    world: Service, admin: str, body: dict[str, Any], says: str
) -> None:
    document = status_of(
        await world.http.post(TASKS, json=body, headers=bearer(admin)), 400, "BadRequest"
    )
    assert says in document["message"]


async def test_unknown_nodes_tasks_and_callers_get_status_bodies(
    world: Service, control_plane: ControlPlane, kube: Client, namespace: str, admin: str
) -> None:
    missing = await world.http.post(
        TASKS, json=destroy([f"{namespace}-none"]), headers=bearer(admin)
    )
    status_of(missing, 404, "NotFound")
    status_of(await world.http.get(f"{TASKS}/nope", headers=bearer(admin)), 404, "NotFound")
    status_of(await world.http.get(TASKS), 401, "Unauthorized")
    viewer = token(control_plane, kube, namespace, "drydock-viewer", "metalmend-drydock-viewer")
    refused = await world.http.post(TASKS, json=destroy(["n"]), headers=bearer(viewer))
    assert "may not create tasks" in status_of(refused, 403, "Forbidden")["message"]
    assert (await world.http.get(TASKS, headers=bearer(viewer))).status_code == 200


async def test_a_task_cut_off_mid_erase_finishes_after_the_service_restarts_erasing_once(
    serve_kubeconfig: Path, database: Database, aclient: AsyncClient, kube: Client,
    namespace: str, admin: str,
) -> None:  # fmt: skip
    bmc = Bmc(polls=40)  # an erase takes 40 looks: long enough to stop the service during it
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    node = add_host(kube, namespace, "h6", bmc)
    async with service(serve_kubeconfig, database, bmc) as first:
        task_id = (
            await first.http.post(TASKS, json=destroy([node]), headers=bearer(admin))
        ).json()["task_id"]
        await until(lambda: len(bmc.starts) == 2, 30)
    # stopped (as a killed service: its lease is left to expire), erases running
    assert bmc.erasing
    assert not bmc.erased
    bmc.polls = 3
    async with service(serve_kubeconfig, database, bmc) as second:
        done = await finished(second.http, task_id, admin)
    host_power.cancel()
    assert done["result"]["status"] == "success", done["result"]
    assert sorted(bmc.starts) == sorted(d.id for d in disks("h6"))  # never started twice


async def test_a_node_already_being_destroyed_is_refused_a_second_task(
    serve_kubeconfig: Path, database: Database, aclient: AsyncClient, kube: Client,
    namespace: str, admin: str,
) -> None:  # fmt: skip
    bmc = Bmc(polls=1000)  # its erases never finish in this test
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    node = add_host(kube, namespace, "h8", bmc)
    async with service(serve_kubeconfig, database, bmc) as served:
        first = (await served.http.post(TASKS, json=destroy([node]), headers=bearer(admin))).json()
        again = await served.http.post(TASKS, json=destroy([node]), headers=bearer(admin))
    host_power.cancel()
    document = status_of(again, 409, "Conflict")
    assert document["message"] == f"Node {node} is being destroyed by task {first['task_id']}"


async def test_concurrent_requests_to_destroy_one_node_through_two_replicas_store_one_task(
    serve_kubeconfig: Path, database_url: str, aclient: AsyncClient, kube: Client,
    namespace: str, admin: str,
) -> None:  # fmt: skip
    """Six POSTs for one node sent together, through two replicas with their own
    connections to one database: one 201, five 409 naming its task (the check and the
    claim are one transaction: TaskStore.create), and one task stored."""
    bmc = Bmc(polls=1000)  # its erases never finish in this test
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    node = add_host(kube, namespace, "h9", bmc)
    one_db, two_db = Database.open(database_url), Database.open(database_url)
    one_db.upgrade()
    try:
        async with (
            service(serve_kubeconfig, one_db, bmc) as one,
            service(serve_kubeconfig, two_db, bmc) as two,
        ):
            answers = await asyncio.gather(*(
                replica.http.post(TASKS, json=destroy([node]), headers=bearer(admin))
                for replica in (one, two, one, two, one, two)
            ))  # fmt: skip
            listed = (await one.http.get(TASKS, headers=bearer(admin))).json()
    finally:
        host_power.cancel()
        one_db.dispose()
        two_db.dispose()
    codes = sorted(a.status_code for a in answers)
    assert codes == [201, 409, 409, 409, 409, 409], [a.text for a in answers]
    task_id = next(a.json()["task_id"] for a in answers if a.status_code == 201)
    for refused in (a for a in answers if a.status_code == 409):
        document = status_of(refused, 409, "Conflict")
        assert document["message"] == f"Node {node} is being destroyed by task {task_id}"
    assert [t["task_id"] for t in listed] == [task_id]


async def test_two_replicas_on_one_database_run_a_task_once(
    serve_kubeconfig: Path, database: Database, aclient: AsyncClient, kube: Client,
    namespace: str, admin: str,
) -> None:  # fmt: skip
    bmc = Bmc()
    host_power = asyncio.create_task(play_host_power(aclient, namespace))
    node = add_host(kube, namespace, "h7", bmc)
    async with (
        service(serve_kubeconfig, database, bmc) as one,
        service(serve_kubeconfig, database, bmc) as two,
    ):
        task_id = (await one.http.post(TASKS, json=destroy([node]), headers=bearer(admin))).json()[
            "task_id"
        ]
        served = deps.find(two.app, drydock.Drydock)
        assert served is not None
        two_worker = served.worker
        two_worker.wake()
        done = await finished(two.http, task_id, admin)
    host_power.cancel()
    assert done["result"]["status"] == "success"
    assert sorted(bmc.starts) == sorted(d.id for d in disks("h7"))
    assert dt.datetime.fromisoformat(
        done["updated"].replace("Z", "+00:00")
    ) >= dt.datetime.fromisoformat(done["created"].replace("Z", "+00:00"))
