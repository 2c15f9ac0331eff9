"""Invariant 7 (docs/design.md) on the real API server: teardown and remediation never act on
the same host at once. ``metalmend serve`` runs with the ServiceAccount and ClusterRole of
deploy/rbac/serve.yaml; the remediation controllers run their real code; the test plays
host-power (it writes the host's power status), as in test_remediation.py."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Event, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation, OpenShiftMachine
from metalmend.controllers import healthcheck, machineremediation, remediation
from metalmend.controllers.machineremediation import MachineRemediationController
from metalmend.controllers.remediation import RemediationController, host_view, reboot_key
from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.errors import Conflict
from metalmend.kube.manager import Manager
from metalmend.policy import interlock as il
from metalmend.policy import machineremediation as mr_policy
from metalmend.policy import remediation as m3_policy
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.settings import RuntimeSettings, Settings
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.policy.settings import TeardownSettings
from tests.integration import test_openshift_machines as openshift_tests
from tests.integration import test_remediation as remediation_tests
from tests.integration import test_serve_promenade as promenade_tests
from tests.integration.test_openshift_machines import openshift_machine
from tests.integration.test_remediation import Controllers, World
from tests.integration.test_serve_promenade import bearer, lines, status_of
from tests.support import until

# The fixtures of those modules, by the names the tests here ask for.
world = remediation_tests.world
controllers = remediation_tests.controllers
serve_kubeconfig = promenade_tests.serve_kubeconfig
admin_token = promenade_tests.admin_token
kube_module = openshift_tests.kube_module
openshift_crds = openshift_tests.openshift_crds

PROMENADE = "/promenade/api/v1.0"
DESIGN = """
schema: promenade/EtcdClusters/v1
metadata: {schema: metadata/Document/v1, name: etcd-clusters}
data:
  clusters:
    - name: kubernetes
      minimum_functionality: {healthy_members: 1}
      members:
        - {node: elsewhere, client_urls: ["http://127.0.0.1:9/"]}
"""


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    """serve's design store (SQLite): the design references name its revisions."""
    found = Database.open(f"sqlite:///{tmp_path / 'serve.sqlite'}")
    found.upgrade()
    yield found
    found.dispose()


@pytest.fixture
async def http(serve_kubeconfig: Path, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    app = create_app(compose(client, TeardownSettings(eviction_retry=0.5), database=database))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as h:
        yield h
    await client.close()


@pytest.fixture
def design_url(database: Database, kube: Client, namespace: str, admin_token: str) -> str:
    """An EtcdClusters design (no member on the tested Nodes) in serve's design store;
    the teardown admin may read it (deckhand viewer, as the design reference asks)."""
    kube.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=f"{namespace}-teardown-admin-deckhand"),
            roleRef=RoleRef(
                apiGroup="rbac.authorization.k8s.io", kind="ClusterRole",
                name="metalmend-deckhand-viewer",
            ),
            subjects=[Subject(kind="ServiceAccount", name="teardown-admin", namespace=namespace)],
        )
    )  # fmt: skip
    revision = DesignStore(database).put("etcd", parse(DESIGN)).revision
    return f"deckhand+https://deckhand/api/v1.0/revisions/{revision}/rendered-documents"


def ask(
    http: httpx.AsyncClient, step: str, node: str, token: str, design: str
) -> Any:  # the request's coroutine
    path = f"{PROMENADE}/nodes/{node}/{step}"
    if step in ("remove-etcd", "decommission"):
        body = {"rel": "design", "href": design, "type": "application/x-yaml"}
        return http.post(path, headers=bearer(token), json=body)
    if step == "drain":
        path += "?timeout=20&grace-period=1"
    elif step == "clear-labels":
        path += "?timeout=0"
    return http.post(path, headers=bearer(token))


async def host_of(world: World, name: str = "host-m1") -> Any:
    found = await world.get(BareMetalHost, name)
    assert found is not None
    return found


async def claim_on(world: World, name: str = "host-m1") -> il.Claim | None:
    return il.teardown_claim((await host_of(world, name)).metadata.annotations or {})


async def annotate(world: World, resource: Any, name: str, changes: dict[str, Any]) -> None:
    await world.client.patch(resource, name, {"metadata": {"annotations": changes}},
                             namespace=world.ns, patch_type=PatchType.MERGE)  # fmt: skip


async def events(world: World, reason: str) -> list[str]:
    found = world.client.list(Event, namespace=world.ns, fields={"reason": reason})
    return [e.message or "" async for e in found]


async def set_phase(world: World, name: str, phase: str) -> None:
    await world.client.patch(Metal3Remediation.Status, name, {"status": {"phase": phase}},
                             namespace=world.ns, patch_type=PatchType.MERGE)  # fmt: skip


# ---- a node under remediation cannot be torn down: 409, nothing changed ------------------

STEPS = ["drain", "clear-labels", "remove-etcd", "shutdown-kubelet", "remove-from-cluster",
         "decommission"]  # fmt: skip


@pytest.mark.parametrize("step", STEPS)
async def test_every_teardown_step_is_refused_409_while_a_remediation_key_holds_the_host(
    http: httpx.AsyncClient, world: World, admin_token: str, design_url: str, step: str
) -> None:
    machine = await world.machine("m1")
    key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}{machine.metadata.uid}"
    await annotate(world, BareMetalHost, "host-m1", {key: '{"mode":"hard"}'})
    host_before = await host_of(world)
    node_before = await world.node_obj("m1")

    answer = await ask(http, step, world.node_name("m1"), admin_token, design_url)

    document = status_of(answer, 409, "Conflict")
    assert document["message"] == (
        f"Node {world.node_name('m1')} is under remediation and cannot be torn down now:"
        f" host {world.ns}/host-m1 holds remediation reboot key {key}"
    )
    assert lines(document) == [f"host {world.ns}/host-m1 holds remediation reboot key {key}"]
    host_after, node_after = await host_of(world), await world.node_obj("m1")
    assert host_after.metadata.resourceVersion == host_before.metadata.resourceVersion
    # (the Node's own version moves with the node lifecycle controller: its spec and
    # labels are what a step would have changed)
    assert node_after.spec.unschedulable == node_before.spec.unschedulable
    assert node_after.metadata.labels == node_before.metadata.labels


HOLDERS = ["metal3-remediation powering on", "annotation request", "annotation flow key"]


@pytest.mark.parametrize("holder", HOLDERS)
async def test_teardown_is_refused_naming_the_remediation_that_holds_the_node(
    http: httpx.AsyncClient, world: World, admin_token: str, design_url: str, holder: str
) -> None:
    machine = await world.machine("m1")
    if holder == "metal3-remediation powering on":  # its key already removed
        await world.remediation(machine)
        await set_phase(world, "m1", "power-on")
        named = f"Metal3Remediation {world.ns}/m1 of host {world.ns}/host-m1 is in phase power-on"
    elif holder == "annotation request":
        await annotate(world, Machine, "m1", {names.EXTERNAL_REMEDIATION: ""})
        named = f"Machine {world.ns}/m1 of host {world.ns}/host-m1 asks for remediation"
    else:
        await annotate(world, BareMetalHost, "host-m1", {names.MACHINE_REMEDIATION_REBOOT: ""})
        named = f"reboot key {names.MACHINE_REMEDIATION_REBOOT}"
    answer = await ask(http, "drain", world.node_name("m1"), admin_token, design_url)
    assert named in status_of(answer, 409, "Conflict")["message"]
    assert (await world.node_obj("m1")).spec.unschedulable is None
    assert await claim_on(world) is None


# ---- a node being torn down is not remediated ----------------------------------------------


async def test_a_teardown_claims_the_host_and_keeps_the_claim_once_done(
    http: httpx.AsyncClient, world: World, admin_token: str, design_url: str
) -> None:
    await world.machine("m1")
    node = await world.node_obj("m1")
    answer = await ask(http, "drain", world.node_name("m1"), admin_token, design_url)
    status_of(answer, 200, "Success")
    claim = await claim_on(world)
    assert claim is not None
    who = f"system:serviceaccount:{world.ns}:teardown-admin"
    assert (claim.node, claim.node_uid, claim.by, claim.step) == (
        world.node_name("m1"), node.metadata.uid, who, "drain",
    )  # fmt: skip
    since = claim.since
    answer = await ask(http, "clear-labels", world.node_name("m1"), admin_token, design_url)
    status_of(answer, 200, "Success")
    claim = await claim_on(world)
    assert claim is not None
    assert (claim.step, claim.since) == ("clear-labels", since)


@pytest.mark.parametrize("flow", ["metal3-remediation", "annotation"])
async def test_remediation_is_not_started_while_a_teardown_claims_the_host(
    http: httpx.AsyncClient, world: World, controllers: Controllers, admin_token: str,
    design_url: str, flow: str,
) -> None:  # fmt: skip
    await controllers.start(remediation.setup, machineremediation.setup)
    machine = await world.machine("m1")
    answer = await ask(http, "drain", world.node_name("m1"), admin_token, design_url)
    status_of(answer, 200, "Success")
    assert await claim_on(world) is not None
    if flow == "metal3-remediation":
        obj = await world.remediation(machine)
        key = reboot_key(obj)
    else:
        await annotate(world, Machine, "m1", {names.EXTERNAL_REMEDIATION: ""})
        key = names.MACHINE_REMEDIATION_REBOOT

    async def told() -> bool:
        return any("claimed by a teardown of Node" in m
                   for m in await events(world, il.REASON_HELD_BY_TEARDOWN))  # fmt: skip

    await until(told, within=15)
    if flow == "metal3-remediation":
        status = (await world.get(Metal3Remediation, "m1")).get("status") or {}
        assert "remediation waits" in status.get("message", "")
    await asyncio.sleep(1)  # time enough for a wrong power-off request to show
    assert key not in (await host_of(world)).metadata.annotations
    assert await world.node_obj("m1") is not None  # not fenced

    # The claim released (by an operator): the remediation starts at once.
    await annotate(world, BareMetalHost, "host-m1", {il.TEARDOWN_ANNOTATION: None})

    async def asked() -> bool:
        return key in ((await host_of(world)).metadata.annotations or {})

    await until(asked, within=15)


async def test_the_health_check_reports_a_torn_down_machine_and_does_not_ask_for_remediation(
    http: httpx.AsyncClient, world: World, controllers: Controllers, admin_token: str,
    design_url: str,
) -> None:  # fmt: skip
    await controllers.start(healthcheck.setup)
    await world.machine("m1")
    await world.client.patch(Machine, "m1", {"metadata": {"labels": {"role": "worker"}}},
                             namespace=world.ns, patch_type=PatchType.MERGE)  # fmt: skip
    status_of(await ask(http, "drain", world.node_name("m1"), admin_token, design_url), 200,
              "Success")  # fmt: skip
    check = {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineHealthCheck",
             "metadata": {"name": "workers", "namespace": world.ns,
                          "annotations": {names.REQUEST_REMEDIATION_BY: "annotation"}},
             "spec": {"clusterName": "c", "selector": {"matchLabels": {"role": "worker"}},
                      "unhealthyConditions": [{"type": "Ready", "status": "Unknown",
                                               "timeout": "1s"}]}}  # fmt: skip
    await world.client.create(codecs.from_dict(check))
    # the kubelet stopped by the teardown: its Node goes Unknown, as expected
    now = dt.datetime.now(dt.UTC).isoformat()
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
               "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    await world.client.patch(Node.Status, world.node_name("m1"),
                             {"status": {"conditions": [unknown]}})  # fmt: skip

    async def reported() -> bool:
        machine = await world.get(Machine, "m1")
        conditions = {c["type"]: c for c in (machine.get("status") or {}).get("conditions", [])}
        held = conditions.get(il.CONDITION_HOST_AVAILABLE, {})
        checked = conditions.get(names.CONDITION_HEALTH_CHECK_SUCCEEDED, {})
        return held.get("status") == "False" and checked.get("status") == "False"

    await until(reported, within=15)
    machine = await world.get(Machine, "m1")
    assert names.EXTERNAL_REMEDIATION not in (machine.metadata.annotations or {})
    assert await events(world, il.REASON_REMEDIATION_HELD)

    await annotate(world, BareMetalHost, "host-m1", {il.TEARDOWN_ANNOTATION: None})

    async def requested() -> bool:
        found = await world.get(Machine, "m1")
        return names.EXTERNAL_REMEDIATION in (found.metadata.annotations or {})

    await until(requested, within=15)


# ---- the race: both sides decide on the same host version, exactly one wins ---------------


async def remediation_takes(world: World, flow: str, machine: Any, host: Any) -> Any:
    """The remediation's real executor adding its key, decided on ``host``."""
    settings = Settings(runtime=RuntimeSettings(namespace=world.ns))
    if flow == "metal3-remediation":
        m3 = RemediationController(Manager(world.client), settings)
        obj = await world.get(Metal3Remediation, "m1")
        return await m3.act(obj, m3_policy.RequestPowerOff(), host)
    annotation_flow = MachineRemediationController(Manager(world.client), settings)
    return await annotation_flow.act(host, machine, mr_policy.RequestPowerOff())


@pytest.mark.parametrize("flow", ["metal3-remediation", "annotation"])
@pytest.mark.parametrize("first", ["teardown", "remediation", "at once"])
async def test_teardown_and_remediation_deciding_on_one_host_version_exactly_one_wins(
    aclient: AsyncClient, world: World, flow: str, first: str
) -> None:
    machine = await world.machine("m1")
    if flow == "metal3-remediation":
        await world.remediation(machine)  # no controller runs: the test drives its executor
    node = world.node_name("m1")
    interlock = Interlock(aclient)
    view, hosts = await interlock.observe(node, "drain", "tester")
    [claim] = il.decide_claims(view, view_time()).claims  # the teardown decided: free
    host = hosts[f"{world.ns}/host-m1"]  # the remediation decided on this same version
    assert host_view(host, "k").teardown is None

    teardown = interlock.writer.claim_host(host, claim.value)
    taking = remediation_takes(world, flow, machine, host)
    if first == "at once":
        outcomes = await asyncio.gather(teardown, taking, return_exceptions=True)
    else:
        ordered = (teardown, taking) if first == "teardown" else (taking, teardown)
        outcomes = []
        for write in ordered:
            try:
                outcomes.append(await write)
            except ApiError as error:
                outcomes.append(error)
    refused = [o for o in outcomes if isinstance(o, ApiError)]
    assert len(refused) == 1, outcomes
    assert refused[0].status.code == 409

    annotations = (await host_of(world)).metadata.annotations or {}
    keys = [k for k in annotations if k.startswith("reboot.metal3.io/")]
    won = "teardown" if il.TEARDOWN_ANNOTATION in annotations else "remediation"
    assert (won == "teardown") == (not keys)  # exactly one of them holds the host
    if won == "remediation":  # the teardown decides again: 409 naming the remediation
        with pytest.raises(Conflict) as refusal:  # answered 409
            await interlock.claim(node, "drain", "tester")
        assert keys[0] in refusal.value.message
    else:  # the remediation decides again, on the host as it now is: it waits
        fresh = host_view(await host_of(world), "k")
        assert fresh.teardown is not None
        if flow == "metal3-remediation":
            observed = m3_policy.Observed(
                spec=m3_policy.Spec(), progress=m3_policy.Progress(), has_finalizer=True,
                deleting_since=None, machine_found=True, machine_node=node, host=fresh,
                host_problem="", node=None, backup=None,
            )  # fmt: skip
            assert not m3_policy.decide(observed, view_time()).of(m3_policy.RequestPowerOff)
        else:
            view = mr_policy.View(
                host=f"{world.ns}/host-m1", host_found=True, machine=f"{world.ns}/m1",
                needs_remediation=True, node_ref=node, node=None, fence_refusal="",
                power=fresh.power, other_remediation=None, teardown=fresh.teardown,
            )  # fmt: skip
            assert not mr_policy.decide(view, view_time()).of(mr_policy.RequestPowerOff)


def view_time() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# ---- which host is the Node's -----------------------------------------------------------


async def test_a_node_without_a_host_is_torn_down_without_any_claim(
    http: httpx.AsyncClient, aclient: AsyncClient, namespace: str, admin_token: str,
    design_url: str,
) -> None:  # fmt: skip
    name = f"{namespace}-bare"
    await aclient.create(Node(metadata=ObjectMeta(name=name)))
    try:
        answer = await ask(http, "drain", name, admin_token, design_url)
        status_of(answer, 200, "Success")
        assert await Interlock(aclient).host_keys(await aclient.get(Node, name)) == []
    finally:
        with contextlib.suppress(ApiError):
            await aclient.delete(Node, name)


async def test_a_node_without_provider_id_is_claimed_through_the_machine_naming_it(
    http: httpx.AsyncClient, world: World, admin_token: str, design_url: str
) -> None:
    await world.machine("m1")
    name = world.node_name("m1")
    await world.client.delete(Node, name)
    await world.client.create(Node(metadata=ObjectMeta(name=name), spec=NodeSpec()))
    answer = await ask(http, "drain", name, admin_token, design_url)
    status_of(answer, 200, "Success")
    claim = await claim_on(world)
    assert claim is not None
    assert claim.node == name


async def test_a_hostile_claim_value_neither_breaks_teardown_nor_lets_remediation_start(
    http: httpx.AsyncClient, world: World, controllers: Controllers, admin_token: str,
    design_url: str,
) -> None:  # fmt: skip
    await controllers.start(machineremediation.setup)
    await world.machine("m1")
    hostile = json.dumps({"node": "\x1b[2J" + "x" * 5000, "by": ["not", "a", "name"]})
    await annotate(world, BareMetalHost, "host-m1", {il.TEARDOWN_ANNOTATION: hostile})
    await annotate(world, Machine, "m1", {names.EXTERNAL_REMEDIATION: ""})

    async def told() -> bool:  # the claim names another Node than the host's: stale
        return any("...(cut)" in m and "\x1b" not in m
                   for m in await events(world, il.REASON_STALE_CLAIM))  # fmt: skip

    await until(told, within=15)
    assert names.MACHINE_REMEDIATION_REBOOT not in (await host_of(world)).metadata.annotations
    await annotate(world, Machine, "m1", {names.EXTERNAL_REMEDIATION: None})
    answer = await ask(http, "drain", world.node_name("m1"), admin_token, design_url)
    status_of(answer, 200, "Success")  # the teardown replaces the claim with its own
    claim = await claim_on(world)
    assert claim is not None
    assert claim.node == world.node_name("m1")


# ---- OpenShift's Machines hold their hosts too (issue 37) ---------------------------------


async def test_an_openshift_machine_asking_for_remediation_refuses_teardown_of_its_node(
    http: httpx.AsyncClient, aclient: AsyncClient, namespace: str, openshift_crds: Path,
    admin_token: str, design_url: str,
) -> None:  # fmt: skip
    """As OpenShift's MachineHealthCheck asks (external-baremetal: the annotation on its
    ``machine.openshift.io`` Machine): serve, with its own role, reads those Machines too."""
    ns = namespace
    _, _, node = await openshift_machine(aclient, ns, "worker-0", "host-0")
    try:
        await aclient.patch(OpenShiftMachine, "worker-0",
                            {"metadata": {"annotations": {names.EXTERNAL_REMEDIATION: ""}}},
                            namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
        answer = await ask(http, "drain", node, admin_token, design_url)
        named = f"Machine {ns}/worker-0 of host {ns}/host-0 asks for remediation"
        assert named in status_of(answer, 409, "Conflict")["message"]
        host: Any = await aclient.get(BareMetalHost, "host-0", namespace=ns)
        assert il.teardown_claim(host.metadata.annotations or {}) is None
    finally:
        with contextlib.suppress(ApiError):
            await aclient.delete(Node, node)


async def test_a_node_without_provider_id_is_claimed_through_its_openshift_machine(
    http: httpx.AsyncClient, aclient: AsyncClient, namespace: str, openshift_crds: Path,
    admin_token: str, design_url: str,
) -> None:  # fmt: skip
    ns = namespace
    _, _, node = await openshift_machine(aclient, ns, "worker-1", "host-1")
    try:
        await aclient.delete(Node, node)
        await aclient.create(Node(metadata=ObjectMeta(name=node), spec=NodeSpec()))
        await aclient.patch(OpenShiftMachine.Status, "worker-1",
                            {"status": {"nodeRef": {"kind": "Node", "name": node}}},
                            namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
        assert await Interlock(aclient).host_keys(await aclient.get(Node, node)) == [f"{ns}/host-1"]
        answer = await ask(http, "drain", node, admin_token, design_url)
        status_of(answer, 200, "Success")
        host: Any = await aclient.get(BareMetalHost, "host-1", namespace=ns)
        claim = il.teardown_claim(host.metadata.annotations or {})
        assert claim is not None
        assert claim.node == node
    finally:
        with contextlib.suppress(ApiError):
            await aclient.delete(Node, node)
