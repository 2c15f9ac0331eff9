"""Who may make a NodeHealthCheck fence a server (issue 36, points 1 and 3), on the real API
server with the NodeRestriction admission plugin and the Node authorizer on (the session's
control plane runs them): each attempt made with the narrowest identity that reaches it.

- A kubelet's own client certificate (``system:node:<name>`` in ``system:nodes``) registers
  a Node naming another server every way a kubelet can (the Node's host annotation, a
  metal3 providerID, OpenShift's providerID with a made-up uid): no remediation, no power
  request; the check reports each Node as not remediated.
- A kubelet cannot opt its Node out: its annotation is not read, its providerID cannot
  change, and it cannot write the host that names it.
- A remediation whose Node stops being its host's (the host no longer names it) or is gone
  (a Node linked by its host's uid) stops and releases the host.
- A tenant who may edit hosts of its namespace cannot make its host name a Node (the
  node-name writers policy), and without that policy in force a host's word fences nothing.
- A tenant ServiceAccount allowed only ``create nodehealthchecks`` makes a check with a
  template of its own namespace: Nodes of hosts elsewhere are reported (status and Event),
  never remediated; its own namespace's are.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.admissionregistration_v1 import ValidatingAdmissionPolicyBinding
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from metalmend.api import names
from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import (
    BareMetalHost,
    FenceRemediation,
    FenceRemediationTemplate,
    Metal3Remediation,
    NodeHealthCheck,
)
from metalmend_lab.controlplane import ControlPlane
from tests.conftest import guard_node_names
from tests.integration.test_nodehealthcheck import DURATION, Run
from tests.integration.test_nodehealthcheck import World as Base
from tests.support import grant, until

# the hosts' word on their Node counts only while its writers are guarded (api/links.node_host)
pytestmark = pytest.mark.usefixtures("node_names_guarded")

UNHEALTHY = [
    {"type": "Ready", "status": "False", "duration": f"{DURATION}s"},
    {"type": "Ready", "status": "Unknown", "duration": f"{DURATION}s"},
]


class World(Base):
    """Node names short enough for a kubelet's certificate (its common name,
    ``system:node:<name>``, is at most 64 characters): the namespace's random suffix."""

    def node_name(self, name: str) -> str:
        return f"{name}-{self.ns[-6:]}"


@pytest.fixture
async def world(aclient: AsyncClient, namespace: str) -> AsyncIterator[World]:
    made = World(aclient, namespace)
    yield made
    await made.cleanup()


@pytest.fixture
async def run(aclient: AsyncClient, namespace: str) -> AsyncIterator[Run]:
    running = Run(aclient, namespace)
    yield running
    await running.kill()


@contextlib.asynccontextmanager
async def kubelet(control_plane: ControlPlane, node: str) -> AsyncIterator[AsyncClient]:
    """A client holding what the kubelet of Node ``node`` holds: a client certificate of
    the control plane's CA for ``system:node:<node>`` in group ``system:nodes``."""
    path = control_plane.user_kubeconfig(f"system:node:{node}", ["system:nodes"])
    client = AsyncClient(KubeConfig.from_file(path), field_manager="kubelet")
    try:
        yield client
    finally:
        await client.close()


async def register(
    client: AsyncClient, world: World, short: str, provider: str | None, **annotations: str
) -> None:
    """The kubelet registers its Node (as ``--provider-id`` would), then reports it not
    Ready."""
    name = world.node_name(short)
    labels = {"role": "worker", "suite": world.ns}
    await client.create(
        Node(
            metadata=ObjectMeta(name=name, labels=labels, annotations=annotations or None),
            spec=NodeSpec(providerID=provider),
        )
    )
    world.nodes.append(name)
    await not_ready(client, name)


async def not_ready(client: AsyncClient, name: str) -> None:
    now = dt.datetime.now(dt.UTC).isoformat()
    condition = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    await client.patch(Node.Status, name, {"status": {"conditions": [condition]}})


async def reboot_keys(world: World, host: str, namespace: str | None = None) -> list[str]:
    found: Any = await world.client.get(BareMetalHost, host, namespace=namespace or world.ns)
    return [k for k in found.metadata.annotations or {} if is_reboot_annotation(k)]


async def remediations(client: AsyncClient, namespace: str) -> list[str]:
    made = [r.metadata.name async for r in client.list(Metal3Remediation, namespace=namespace)]
    fenced = [r.metadata.name async for r in client.list(FenceRemediation, namespace=namespace)]
    return sorted(made + fenced)


async def not_remediated(world: World, check: str) -> dict[str, str]:
    """Node -> why, as the check's status lists the Nodes it does not remediate."""
    try:
        status = await world.status(check)
    except ApiError:
        return {}
    return {
        u["name"]: u["notRemediated"]
        for u in status.get("unhealthyNodes") or []
        if u.get("notRemediated")
    }


async def phase_of(world: World, node: str) -> tuple[str, str]:
    obj: Any = await world.remediation(node)
    status = (obj.get("status") or {}) if obj is not None else {}
    return str(status.get("phase")), str(status.get("message"))


async def test_a_kubelets_own_node_cannot_make_the_check_power_cycle_another_server(
    world: World, run: Run, control_plane: ControlPlane
) -> None:
    ns = world.ns
    # the real worker-2: its host names its Node (not selected here: the check is of the
    # ghosts, and whatever it does, nothing may reach host-w2)
    await world.host("host-w2")
    ghosts = {
        "ghost-a": (None, {names.NODE_HOST: f"{ns}/host-w2"}),  # the annotation (the probe's)
        "ghost-b": (f"metal3://{ns}/host-w2", {}),  # --provider-id, metal3's form
        "ghost-c": (f"metal3://{ns}/host-w2/m3m-w2", {}),  # CAPM3's longer form
        "ghost-d": (f"baremetalhost:///{ns}/host-w2/{uuid.uuid4()}", {}),  # a guessed uid
    }
    for short, (provider, on_node) in ghosts.items():
        async with kubelet(control_plane, world.node_name(short)) as client:
            await register(client, world, short, provider, **on_node)
            # nor can it write the host's own word on its Node
            patch = {"metadata": {"annotations": {names.HOST_NODE: world.node_name(short)}}}
            with pytest.raises(ApiError) as refused:
                await client.patch(BareMetalHost, "host-w2", patch, namespace=ns,
                                   patch_type=PatchType.MERGE)  # fmt: skip
            assert refused.value.status.code == 403
    await world.check("workers", maxUnhealthy="100%", unhealthyConditions=UNHEALTHY)
    await run.start()

    wanted = {world.node_name(g) for g in ghosts}
    await until(lambda: _lists(world, "workers", wanted), within=DURATION + 20)
    reported = await not_remediated(world, "workers")
    for ghost in wanted:
        assert f"no BareMetalHost names Node {ghost}" in reported[ghost] or (
            "carries uid" in reported[ghost]
        ), reported[ghost]
    assert "proves nothing" in reported[world.node_name("ghost-a")]
    assert await remediations(world.client, ns) == []
    assert await reboot_keys(world, "host-w2") == []
    assert "NoBareMetalHost" in await world.reasons()


async def _lists(world: World, check: str, nodes: set[str]) -> bool:
    return nodes <= set(await not_remediated(world, check))


async def test_a_kubelet_cannot_opt_its_node_out_of_remediation(
    world: World, run: Run, control_plane: ControlPlane
) -> None:
    ns = world.ns
    await world.host("host-k")  # names Node k
    await world.check("workers", maxUnhealthy="100%", unhealthyConditions=UNHEALTHY)
    name = world.node_name("k")
    async with kubelet(control_plane, name) as client:
        await client.create(
            Node(
                metadata=ObjectMeta(name=name, labels={"role": "worker", "suite": ns}),
                spec=NodeSpec(providerID=f"metal3://{ns}/host-k"),
            )
        )
        world.nodes.append(name)
        # the kubelet says its Node is another server's (NodeRestriction lets it)...
        patch = {"metadata": {"annotations": {names.NODE_HOST: "elsewhere/nothing"}}}
        await client.patch(Node, name, patch)
        # ... cannot change its providerID (set once, at registration)...
        with pytest.raises(ApiError) as immutable:
            await client.patch(Node, name, {"spec": {"providerID": "k3s://k"}})
        assert immutable.value.status.code == 422
        # ... nor unsay the host's word
        unsay = {"metadata": {"annotations": {names.HOST_NODE: None}}}
        with pytest.raises(ApiError) as refused:
            await client.patch(BareMetalHost, "host-k", unsay, namespace=ns,
                               patch_type=PatchType.MERGE)  # fmt: skip
        assert refused.value.status.code == 403
        await run.start()
        await not_ready(client, name)
        # remediated all the same: host-k holds its Node, whatever the Node says
        await until(lambda: _keyed(world, "host-k"), within=DURATION + 20)
    made = await world.remediation("k")
    assert made is not None
    assert await not_remediated(world, "workers") == {}


async def _keyed(world: World, host: str, namespace: str | None = None) -> bool:
    return bool(await reboot_keys(world, host, namespace))


async def _released(world: World, host: str) -> bool:
    return not await reboot_keys(world, host)


async def _failed(world: World, node: str) -> bool:
    return (await phase_of(world, node))[0] == "failed"


async def test_a_remediation_whose_node_is_no_longer_its_hosts_or_gone_stops_and_releases(
    world: World, run: Run, control_plane: ControlPlane
) -> None:
    ns = world.ns
    await world.host("host-a")  # names Node a
    await world.host("host-b", node="")  # names no Node: b is linked by its uid
    host_b: Any = await world.client.get(BareMetalHost, "host-b", namespace=ns)
    await world.node("a", f"metal3://{ns}/host-a", ready=False)
    async with kubelet(control_plane, world.node_name("b")) as client:  # OpenShift's form
        await register(client, world, "b", f"baremetalhost:///{ns}/host-b/{host_b.metadata.uid}")
    await world.check("workers", maxUnhealthy="100%", unhealthyConditions=UNHEALTHY)
    await run.start()
    await until(lambda: _keyed(world, "host-a"), within=DURATION + 20)
    await until(lambda: _keyed(world, "host-b"), within=DURATION + 20)

    # host-a no longer names Node a (re-provisioned for another use, say)
    await world.client.patch(
        BareMetalHost, "host-a", {"metadata": {"annotations": {names.HOST_NODE: None}}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    await until(lambda: _released(world, "host-a"))
    # the phase is written after the key is removed: waited for, not read once
    await until(lambda: _failed(world, "a"))
    _, message = await phase_of(world, "a")
    assert "is not a Node of host" in message

    # Node b is deleted before it was fenced: nothing says host-b is its server any more
    await world.client.delete(Node, world.node_name("b"))
    await until(lambda: _released(world, "host-b"))
    await until(lambda: _failed(world, "b"))
    _, message = await phase_of(world, "b")
    assert f"Node {world.node_name('b')} is gone" in message
    assert await world.node_obj("a") is not None, "never fenced"


# ---- point 3: a tenant's check ---------------------------------------------------------------


@pytest.fixture
def tenant_namespace(kube: Client) -> Iterator[str]:
    name = f"t2-{secrets.token_hex(3)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


@pytest.fixture
def tenant(kube: Client, control_plane: ControlPlane, tenant_namespace: str) -> Iterator[Path]:
    """A ServiceAccount of the tenant's namespace allowed to create NodeHealthChecks and
    nothing else (no rights in any namespace)."""
    role = f"{tenant_namespace}-nhc-creator"
    rule = PolicyRule(
        apiGroups=["healthcheck.metalmend.dev"], resources=["nodehealthchecks"], verbs=["create"]
    )
    kube.create(ClusterRole(metadata=ObjectMeta(name=role), rules=[rule]))
    subject = Subject(kind="ServiceAccount", name="tenant", namespace=tenant_namespace)
    kube.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=role),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[subject],
        )
    )
    yield control_plane.service_account_kubeconfig(tenant_namespace, "tenant")
    kube.delete(ClusterRoleBinding, role)
    kube.delete(ClusterRole, role)


async def test_a_tenants_check_remediates_only_hosts_of_its_templates_namespace(
    world: World, aclient: AsyncClient, tenant: Path, tenant_namespace: str
) -> None:
    ns, t2 = world.ns, tenant_namespace
    # the lab's namespace: a host naming its unhealthy Node (the probe's worker-1)
    await world.host("host-a")
    await world.node("a", f"metal3://{ns}/host-a", ready=False)
    # the tenant's own namespace: its host, its Node, its template
    own = World(aclient, t2)
    await own.host("host-t")
    await own.node("t", None, ready=False)
    template = {"template": {"spec": {"strategy": "reboot"}}}
    await aclient.create(
        FenceRemediationTemplate(metadata=ObjectMeta(name="fence"), spec=template), namespace=t2
    )
    selector = {"matchExpressions": [{"key": "suite", "operator": "In", "values": [ns, t2]}]}
    spec: dict[str, Any] = {"selector": selector, "minHealthy": 0,
                            "unhealthyConditions": UNHEALTHY}  # fmt: skip
    name = f"{t2}-check"
    runner = Run(aclient, None)  # metalmend run over every namespace
    async with AsyncClient(KubeConfig.from_file(tenant), field_manager="tenant") as as_tenant:
        # a check without a template would reach every namespace: refused
        with pytest.raises(ApiError) as refused:
            await as_tenant.create(NodeHealthCheck(metadata=ObjectMeta(name=name), spec=spec))
        assert refused.value.status.code == 422
        assert "set remediationTemplate or escalatingRemediations" in str(
            refused.value.status.message
        )
        ref = {"kind": "FenceRemediationTemplate", "namespace": t2, "name": "fence"}
        await as_tenant.create(
            NodeHealthCheck(
                metadata=ObjectMeta(name=name), spec={**spec, "remediationTemplate": ref}
            )
        )
        world.checks.append(name)
    try:
        await runner.start()
        # its own namespace's host: remediated, in its namespace
        await until(lambda: _exists_fence(aclient, t2, own.node_name("t")), within=DURATION + 20)
        # the lab's: reported on the check, never remediated
        node_a = world.node_name("a")
        await until(lambda: _lists(world, name, {node_a}))
        why = (await not_remediated(world, name))[node_a]
        assert f"host {ns}/host-a is outside namespace {t2}" in why
        await until(lambda: _recorded_in(world, "HostOutsideTemplateNamespace"))
        assert await remediations(aclient, ns) == []
        assert await reboot_keys(world, "host-a") == []
    finally:
        await runner.kill()
        await own.cleanup()


async def _exists_fence(client: AsyncClient, namespace: str, name: str) -> bool:
    try:
        await client.get(FenceRemediation, name, namespace=namespace)
    except ApiError:
        return False
    return True


async def _recorded_in(world: World, reason: str) -> bool:
    return reason in await world.reasons()


POLICY = Path(__file__).resolve().parents[2] / "deploy/policies/nodehealthcheck-admission.yaml"


@pytest.fixture
def template_policy(kube: Client, tenant_namespace: str) -> Iterator[dict[str, str]]:
    """deploy/policies/nodehealthcheck-admission.yaml, its binding limited to checks
    labelled for this test (the shared test cluster must not see it: a check is
    cluster-scoped, so a namespace selector would not keep it out)."""
    label = {"metalmend.dev/test-policy": tenant_namespace}
    created: list[Any] = []
    for document in yaml.safe_load_all(POLICY.read_text()):
        meta, spec = document["metadata"], document["spec"]
        meta["name"] = f"{meta['name']}-{tenant_namespace}"
        if document["kind"] == "ValidatingAdmissionPolicyBinding":
            spec["policyName"] = f"{spec['policyName']}-{tenant_namespace}"
            spec["matchResources"] = {"objectSelector": {"matchLabels": label}}
        created.append(kube.create(codecs.from_dict(document)))
    yield label
    for obj in reversed(created):  # the binding before its policy
        kube.delete(type(obj), obj.metadata.name)


async def test_the_policy_lets_a_check_name_only_templates_its_author_may_remediate_with(
    world: World,
    kube: Client,
    tenant: Path,
    tenant_namespace: str,
    template_policy: dict[str, str],
) -> None:
    """With the chart's policy, the tenant (only ``create nodehealthchecks``) may not name
    a template of the lab's namespace, nor of its own until it may create the template's
    remediations there."""
    ns, t2 = world.ns, tenant_namespace
    spec: dict[str, Any] = {"selector": {"matchLabels": {"suite": ns}}, "minHealthy": 0}
    tries = iter(range(1_000_000))

    async with AsyncClient(KubeConfig.from_file(tenant), field_manager="tenant") as as_tenant:

        async def attempt(namespace: str) -> str:
            """The refusal ("<code> <message>"), or "" when the check was created (under a
            name of its own: one made before the policy was in force is not in the way)."""
            name = f"{t2}-policed-{next(tries)}"
            ref = {"kind": "FenceRemediationTemplate", "namespace": namespace, "name": "fence"}
            body = NodeHealthCheck(
                metadata=ObjectMeta(name=name, labels=template_policy),
                spec={**spec, "remediationTemplate": ref},
            )
            try:
                await as_tenant.create(body)
            except ApiError as error:
                return f"{error.status.code} {error.status.message}"
            world.checks.append(name)
            return ""

        why = await until_refused(lambda: attempt(ns))
        account = f"system:serviceaccount:{t2}:tenant"
        assert why.startswith("403 "), why
        assert f"{account} may not create fenceremediations in namespace {ns}" in why
        own = await attempt(t2)
        assert own.startswith("403 "), own
        assert f"fenceremediations in namespace {t2}" in own, own
        grant(kube, t2, "fencer", Subject(kind="ServiceAccount", name="tenant", namespace=t2),
              resources=["fenceremediations"], verbs=["create"],
              group="remediation.metalmend.dev")  # fmt: skip
        await until(lambda: _accepted(attempt(t2)))


async def until_refused(attempt: Any) -> str:
    """A new policy takes a moment to be enforced: the first refusal's message."""
    found: list[str] = []

    async def refused() -> bool:
        found.append(await attempt())
        return bool(found[-1])

    await until(refused)
    return found[-1]


async def _accepted(outcome: Any) -> bool:
    return await outcome == ""


async def test_a_host_editor_may_not_name_a_node_for_its_host(
    world: World, kube: Client, control_plane: ControlPlane
) -> None:
    """The narrowest identity that could aim a check at another server's Node: a tenant
    who may get, create and patch BareMetalHosts of its own namespace, and nothing else.
    With deploy/policies/node-name-writers.yaml in force it can neither make its host name a
    Node, nor create a host that names one, nor unsay a host's word; what the policy does
    not guard it may still change, and a listed writer may name the Node."""
    ns = world.ns
    await world.host("host-t", node="")  # the tenant's own host, naming no Node
    victim = world.node_name("victim")
    subject = Subject(kind="ServiceAccount", name="host-editor", namespace=ns)
    grant(kube, ns, "host-editor", subject, resources=["baremetalhosts"],
          verbs=["get", "create", "patch"], group="metal3.io")  # fmt: skip
    path = control_plane.service_account_kubeconfig(ns, "host-editor")
    account = f"system:serviceaccount:{ns}:host-editor"
    tries = iter(range(1_000_000))

    async with AsyncClient(KubeConfig.from_file(path), field_manager="tenant") as as_tenant:

        async def name_it() -> str:
            patch = {"metadata": {"annotations": {names.HOST_NODE: victim}}}
            try:
                await as_tenant.patch(BareMetalHost, "host-t", patch, namespace=ns,
                                      patch_type=PatchType.MERGE)  # fmt: skip
            except ApiError as error:
                return f"{error.status.code} {error.status.message}"
            # made before the policy was enforced (it takes a moment): unsay it, try again
            unsay = {"metadata": {"annotations": {names.HOST_NODE: None}}}
            await world.client.patch(BareMetalHost, "host-t", unsay, namespace=ns,
                                     patch_type=PatchType.MERGE)  # fmt: skip
            return ""

        why = await until_refused(name_it)
        assert why.startswith("403 "), why
        assert (
            f"{account} may not add, change or remove metalmend.dev/node-name of"
            " BareMetalHost host-t"
        ) in why, why
        assert "only the writers named in ValidatingAdmissionPolicy metalmend-node-name-writers" in why
        # nor create a host that names it
        body = BareMetalHost(
            metadata=ObjectMeta(name=f"host-new-{next(tries)}",
                                annotations={names.HOST_NODE: victim}),
            spec={"online": True},
        )  # fmt: skip
        with pytest.raises(ApiError) as created:
            await as_tenant.create(body, namespace=ns)
        assert created.value.status.code == 403
        assert "may not add, change or remove metalmend.dev/node-name" in str(
            created.value.status.message
        )
        # what the policy does not guard, it still may
        await as_tenant.patch(BareMetalHost, "host-t", {"spec": {"online": False}},
                              namespace=ns, patch_type=PatchType.MERGE)  # fmt: skip
        # a writer (here the tests' admin) names the Node; the tenant cannot unsay it
        await world.client.patch(
            BareMetalHost, "host-t", {"metadata": {"annotations": {names.HOST_NODE: victim}}},
            namespace=ns, patch_type=PatchType.MERGE,
        )  # fmt: skip
        with pytest.raises(ApiError) as unsaid:
            await as_tenant.patch(
                BareMetalHost, "host-t", {"metadata": {"annotations": {names.HOST_NODE: None}}},
                namespace=ns, patch_type=PatchType.MERGE,
            )  # fmt: skip
        assert unsaid.value.status.code == 403
    host: Any = await world.client.get(BareMetalHost, "host-t", namespace=ns)
    assert host.metadata.annotations[names.HOST_NODE] == victim


async def test_without_the_node_name_policy_a_hosts_word_fences_nothing(
    world: World, run: Run, kube: Client
) -> None:
    """The policy's binding gone (uninstalled, or never installed): a Node linked only by
    its host's word (a providerID without the host's uid) is reported, never remediated,
    and the report says what to install; once the policy is back in force, it is
    remediated. A Node whose providerID carries its host's uid needs no policy."""
    ns = world.ns
    await world.host("host-k")  # names Node k
    await world.node("k", "k3s://k", ready=False)
    await world.host("host-u", node="")  # linked by its uid
    host_u: Any = await world.client.get(BareMetalHost, "host-u", namespace=ns)
    await world.node("u", f"baremetalhost:///{ns}/host-u/{host_u.metadata.uid}", ready=False)
    kube.delete(ValidatingAdmissionPolicyBinding, names.NODE_NAME_POLICY)
    try:
        await world.check("workers", maxUnhealthy="100%", unhealthyConditions=UNHEALTHY)
        await run.start()
        node_k = world.node_name("k")
        await until(lambda: _lists(world, "workers", {node_k}), within=DURATION + 20)
        why = (await not_remediated(world, "workers"))[node_k]
        assert (
            f"host {ns}/host-k names Node {node_k} (metalmend.dev/node-name), but"
            f" ValidatingAdmissionPolicy {names.NODE_NAME_POLICY} has no binding"
        ) in why, why
        assert "deploy/policies/node-name-writers.yaml" in why
        await until(lambda: _keyed(world, "host-u"), within=DURATION + 20)
        assert await reboot_keys(world, "host-k") == []
    finally:
        guard_node_names(kube)
    await until(lambda: _keyed(world, "host-k"), within=DURATION + 20)
