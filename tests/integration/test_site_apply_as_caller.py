"""Site designs act with their caller's permissions, never serve's (docs/site-actions.md,
"Whose permissions apply a design", "What a design may hold", "redeploy_server"), through
Shipyard's API against the real API server, each refusal from the narrowest role that
reaches it, and each time: nothing changed in the cluster.

- a design that repoints an existing host's BMC is refused by the ``spec.bmc`` admission
  policy, which judges the caller (deploy_site and redeploy_server), at once, with the
  API server's message;
- a caller without the Kubernetes writes gets the API server's refusal at validation;
- keys that would power, fence, remediate or stop a server, and Kubernetes label domains,
  are refused naming the document and the key, at commit and at validation;
- a forced commit needs its own permission;
- a design cannot label (or redeploy) a Node that is another host's server;
- redeploy_server validates its host's BMC address and Secret as deploy_site does (one
  check), before anything is torn down;
- redeploy_server needs nodes/redeploy for each node, at creation and at the start;
- an action stored without its creator's identity fails instead of running as serve.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Node, Secret
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.db import Database
from metalmend.designs.store import DesignStore
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.destroy.store import TaskStore
from metalmend.kube.crds import install_crds
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.siteactions import model
from metalmend.siteactions.policy.actions import ActionLifecycle, new_action_id
from metalmend.siteactions.store import ActionStore
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig
from tests.integration.test_policies import scoped
from tests.integration.test_serve_promenade import bearer, lines, status_of, token
from tests.integration.test_shipyard_api import (
    SHIPYARD,
    TIMING,
    YAML,
    Service,
    also,
    serve_kubeconfig,
    service,
    wait_for,
)
from tests.support import until

__all__ = ["serve_kubeconfig", "service"]  # fixtures this module uses


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own API server (every fixture built on ``control_plane`` uses it).
    It installs admission policies that take parameters, and kube-apiserver (v1.36) was
    seen never to find a parameter kind's objects again once every policy of that kind
    had been removed for a few seconds ("no params found" for 120 s): a policy test of
    the shared control plane running after this module would never see its ConfigMap."""
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path_factory.mktemp("site-apply-plane")))
    plane.start()
    try:
        install_crds(Client(KubeConfig.from_file(plane.kubeconfig)))
        yield plane
    finally:
        plane.stop()


ADDRESS = "redfish://127.0.0.1:8000/redfish/v1/Systems/{}"
LISTENER = "redfish+https://127.0.0.1:9/redfish/v1/Systems/1"  # someone else's


def host_document(namespace: str, name: str, address: str, **extra: Any) -> str:
    image = '{url: "http://images.lab/os.qcow2", checksum: "http://images.lab/os.sha256"}'
    meta = extra.pop("meta", "")
    bmc_extra = extra.pop("bmc", "")
    document = extra.pop("doc", "bmh-doc")
    spec_extra = extra.pop("spec", "")
    return f"""---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: {document}}}
data:
  apiVersion: metal3.io/v1alpha1
  kind: BareMetalHost
  metadata: {{name: {name}, namespace: {namespace}{meta}}}
  spec:
    online: true
    bmc: {{address: "{address}", credentialsName: {name}-bmc{bmc_extra}}}
    image: {image}{spec_extra}
"""


def machine_document(namespace: str, name: str, annotations: str) -> str:
    return f"""---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: machine-doc}}
data:
  apiVersion: cluster.x-k8s.io/v1beta1
  kind: Machine
  metadata: {{name: {name}, namespace: {namespace}, annotations: {{{annotations}}}}}
  spec: {{clusterName: lab}}
"""


def node_document(name: str, labels: str) -> str:
    return f"""---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: node-doc}}
data:
  apiVersion: v1
  kind: Node
  metadata: {{name: {name}, labels: {{{labels}}}}}
"""


def bmc_secret(kube: Client, namespace: str, host: str) -> None:
    """The host's BMC Secret, labelled and bound to it alone (docs/security.md)."""
    kube.create(
        Secret(
            metadata=ObjectMeta(
                name=f"{host}-bmc", namespace=namespace,
                labels={"metalmend.dev/bmc-credentials": "true"},
                annotations={"metalmend.dev/bmc-hosts": host},
            ),
            stringData={"username": "admin", "password": "s3cret"},
        )
    )  # fmt: skip


def existing_host(kube: Client, namespace: str, name: str) -> None:
    bmc_secret(kube, namespace, name)
    kube.create(
        BareMetalHost(
            metadata=ObjectMeta(name=name, namespace=namespace),
            spec={"online": True, "bmc": {"address": ADDRESS.format(name),
                                          "credentialsName": f"{name}-bmc"}},
        )
    )  # fmt: skip


@contextlib.contextmanager
def registered(kube: Client, name: str, provider: str) -> Iterator[None]:
    """Node ``name`` as its kubelet registered it, its providerID ``provider``."""
    kube.create(Node(metadata=ObjectMeta(name=name), spec=NodeSpec(providerID=provider)))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            kube.delete(Node, name)


def account(
    control_plane: ControlPlane, kube: Client, namespace: str, name: str, *roles: str
) -> dict[str, str]:
    """A token of ServiceAccount ``namespace/name`` bound to ClusterRoles ``roles``."""
    found = bearer(token(control_plane, kube, namespace, name, roles[0] if roles else None))
    for role in roles[1:]:
        also(kube, namespace, name, role)
    return found


@pytest.fixture
def deployer(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    """Shipyard's admin with the Kubernetes writes of a design: a site's deployer."""
    return account(
        control_plane, kube, namespace, "deployer", "metalmend-shipyard-admin",
        "metalmend-site-writer",
    )  # fmt: skip


async def put_and_commit(
    http: httpx.AsyncClient, who: dict[str, str], body: str, **query: str
) -> httpx.Response:
    put = await http.post("/configdocs/site", content=body, headers={**who, **YAML})
    assert put.status_code == 201, put.text
    return await http.post("/commitconfigdocs", headers=who, params=query)


async def action(
    http: httpx.AsyncClient, who: dict[str, str], name: str, **parameters: Any
) -> dict[str, Any]:
    answer = await http.post("/actions", headers=who, json={"name": name, "parameters": parameters})
    assert answer.status_code == 201, answer.text
    done = await wait_for(http, who, answer.json()["id"])
    assert done["action_lifecycle"] == "Failed", done
    return done


def step(done: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(s for s in done["steps"] if s["id"] == name)
    return found


def refusal(done: dict[str, Any], name: str) -> str:
    """The step's last note; the step failed at its first try (no retries)."""
    found = step(done, name)
    assert found["state"] == "failed", done
    text: str = found["notes"][-1]["note_val"]
    assert "times)" not in text  # not "ApiError (10 times)"
    return text


def tags(service: Service) -> dict[int, set[str]]:
    database = Database.open(service.url)
    try:
        store = DesignStore(database)
        return {r.id: set(r.tags) for r in store.revisions()}
    finally:
        database.dispose()


def bmc_of(kube: Client, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.get(BareMetalHost, name, namespace=namespace).spec["bmc"]
    return found


async def test_a_design_that_repoints_a_hosts_bmc_is_refused_by_the_policy_as_the_caller(
    service: Service, deployer: dict[str, str], kube: Client, namespace: str
) -> None:
    """The spec.bmc policy judges the deployer (not a BMC writer), not serve: the design
    that would send worker's credentials to a listener is refused at validation, with
    the policy's message, for deploy_site and for redeploy_server; the host is untouched."""
    name = f"{namespace[:40]}-w"
    existing_host(kube, namespace, name)
    before = bmc_of(kube, namespace, name)
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            contextlib.contextmanager(scoped)(kube, "bmc-spec-writers.yaml", namespace)
        )
        # Enforced? The test's admin is not a BMC writer either (a new port each time).
        kube.create(BareMetalHost(metadata=ObjectMeta(name="probe", namespace=namespace),
                                  spec={"bmc": {"address": "ipmi://127.0.0.1:1"}}))  # fmt: skip
        ports = itertools.count(2)
        await until(lambda: _refuses_bmc_change(kube, namespace, next(ports)), 30)
        stack.enter_context(registered(kube, name, f"metal3://{namespace}/{name}"))
        design = host_document(
            namespace, name, LISTENER, bmc=", disableCertificateVerification: true"
        )
        async with service.running() as http:
            committed = await put_and_commit(http, deployer, design)
            assert committed.status_code == 200, committed.text
            done = await action(http, deployer, "deploy_site")
            text = refusal(done, "validation")
            assert f"BareMetalHost {namespace}/{name} of the design (dry run)" in text
            assert f"system:serviceaccount:{namespace}:deployer" in text
            assert f"may not change spec.bmc of existing BareMetalHost {name}" in text
            assert step(done, "apply")["state"] == "upstream_failed"
            # the same revision through redeploy_server: the same refusal, nothing torn down
            redeploy = await action(
                http, deployer, "redeploy_server", target_nodes=[name],
                **{"target-revision": "committed"},
            )  # fmt: skip
            text = refusal(redeploy, "validation")
            assert f"may not change spec.bmc of existing BareMetalHost {name}" in text
            assert step(redeploy, "decommission")["state"] == "upstream_failed"
        assert bmc_of(kube, namespace, name) == before
        assert "site-action-success" not in set().union(*tags(service).values())
        node = kube.get(Node, name)
        assert not node.spec.unschedulable


def _none(kube: Client, kind: Any, namespace: str) -> bool:
    """No object of ``kind`` in ``namespace`` (False while its storage is initializing:
    a CRD's first list after the control plane started may answer 429)."""
    try:
        return not list(kube.list(kind, namespace=namespace))
    except ApiError:
        return False


def _refuses_bmc_change(kube: Client, namespace: str, port: int) -> bool:
    try:
        kube.patch(
            BareMetalHost, "probe", {"spec": {"bmc": {"address": f"ipmi://127.0.0.1:{port}"}}},
            namespace=namespace, patch_type=PatchType.MERGE,
        )  # fmt: skip
    except Exception:
        return True
    return False


async def test_a_caller_without_the_kubernetes_writes_gets_the_api_servers_refusal(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    """Shipyard's admin alone may create the action, but not write hosts: the dry run as
    the caller is refused by RBAC at validation, though serve's own identity could have
    created the host before this version."""
    name = f"{namespace[:40]}-n"
    bmc_secret(kube, namespace, name)
    admin_only = account(
        control_plane, kube, namespace, "shipyard-only", "metalmend-shipyard-admin"
    )
    async with service.running() as http:
        committed = await put_and_commit(
            http, admin_only, host_document(namespace, name, ADDRESS.format(name))
        )
        assert committed.status_code == 200, committed.text
        done = await action(http, admin_only, "deploy_site")
    text = refusal(done, "validation")
    assert f"BareMetalHost {namespace}/{name} of the design (dry run)" in text
    assert 'cannot patch resource "baremetalhosts"' in text
    assert not list(kube.list(BareMetalHost, namespace=namespace))


async def test_keys_that_would_act_on_a_server_are_refused_naming_document_and_key(
    service: Service, deployer: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    """The remediation request on a Machine (a hard power cycle, the Node deleted), the
    teardown label on a Node (its kubelet stopped), a teardown claim, a Kubernetes label:
    refused at commit, a forced commit refused without its own permission, and the
    action's validation refuses them again; nothing is written."""
    name = f"{namespace[:40]}-k"
    bmc_secret(kube, namespace, name)
    design = (
        host_document(namespace, name, ADDRESS.format(name),
                      meta=", annotations: {metalmend.dev/teardown: '{}'}")
        + machine_document(namespace, name, "host.metal3.io/external-remediation: ''")
        + node_document(name, "promenade-decomission: enabled, kubernetes.io/hostname: x")
    )  # fmt: skip
    expected = [
        "document 'bmh-doc': annotation 'metalmend.dev/teardown'",
        "document 'machine-doc': annotation"
        " 'host.metal3.io/external-remediation' would power, fence, remediate or stop a server",
        "document 'node-doc': label 'promenade-decomission' would power, fence",
        "document 'node-doc': label 'kubernetes.io/hostname' is in a Kubernetes domain",
    ]
    with registered(kube, name, f"metal3://{namespace}/{name}"):
        async with service.running() as http:
            refused = await put_and_commit(http, deployer, design)
            found = lines(status_of(refused, 400, "BadRequest"))
            for text in expected:
                assert any(text in line for line in found), (text, found)
            forced = await http.post(
                "/commitconfigdocs", headers=deployer, params={"force": "true"}
            )
            assert (
                "create configdocs/commit-force" in status_of(forced, 403, "Forbidden")["message"]
            )
            also(kube, namespace, "deployer", "metalmend-shipyard-force-committer")
            forced = await http.post(
                "/commitconfigdocs", headers=deployer, params={"force": "true"}
            )
            assert forced.status_code == 200, forced.text
            done = await action(http, deployer, "deploy_site")
        text = refusal(done, "validation")
        for wanted in expected:
            assert wanted in text, (wanted, text)
        node = kube.get(Node, name)
        assert "promenade-decomission" not in (node.metadata.labels or {})
        assert not list(kube.list(BareMetalHost, namespace=namespace))
        await until(lambda: _none(kube, Machine, namespace), 30)


async def test_a_hosts_consumer_in_another_namespace_is_refused_naming_document_and_key(
    service: Service, deployer: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    """Issue 36, point 7: a design pointed a host's consumerRef at Machine worker-1 of
    another namespace; deploy_site completed and that Machine lost its nodeRef. Refused
    at commit naming the document and the key, and again by a forced commit's
    validation; nothing is written. The deployer may write the design's objects."""
    name = f"{namespace[:40]}-c"
    bmc_secret(kube, namespace, name)
    consumer = (
        "\n    consumerRef: {apiVersion: cluster.x-k8s.io/v1beta1, kind: Machine,"
        " namespace: metalmend-lab, name: worker-1}"
    )
    design = host_document(namespace, name, ADDRESS.format(name), spec=consumer)
    expected = (
        "document 'bmh-doc': spec.consumerRef.namespace 'metalmend-lab' is not the"
        f" BareMetalHost's namespace {namespace!r}"
    )
    async with service.running() as http:
        refused = await put_and_commit(http, deployer, design)
        found = lines(status_of(refused, 400, "BadRequest"))
        assert any(expected in line for line in found), (expected, found)
        also(kube, namespace, "deployer", "metalmend-shipyard-force-committer")
        forced = await http.post("/commitconfigdocs", headers=deployer, params={"force": "true"})
        assert forced.status_code == 200, forced.text
        done = await action(http, deployer, "deploy_site")
    assert expected in refusal(done, "validation")
    assert not list(kube.list(BareMetalHost, namespace=namespace))


async def test_a_design_cannot_label_or_redeploy_another_servers_node(
    service: Service, deployer: dict[str, str], kube: Client, namespace: str
) -> None:
    """Node n is the server of host ``other`` (its providerID): a design whose host n
    labels Node n, or redeploys it, is refused; the Node keeps its labels."""
    name = f"{namespace[:40]}-o"
    bmc_secret(kube, namespace, name)
    design = host_document(namespace, name, ADDRESS.format(name)) + node_document(
        name, "role: attacker"
    )
    with registered(kube, name, f"metal3://{namespace}/other"):
        async with service.running() as http:
            committed = await put_and_commit(http, deployer, design)
            assert committed.status_code == 200, committed.text
            done = await action(http, deployer, "deploy_site")
            wanted = (
                f"Node {name} in the cluster is the server of {namespace}/other, not of the"
                f" design's BareMetalHost {namespace}/{name}"
            )
            assert wanted in refusal(done, "validation")
            redeploy = await action(
                http, deployer, "redeploy_server", target_nodes=[name],
                **{"target-revision": "committed"},
            )  # fmt: skip
            assert wanted in refusal(redeploy, "validation")
            assert step(redeploy, "destroy")["state"] == "upstream_failed"
        assert "role" not in (kube.get(Node, name).metadata.labels or {})
        assert not list(kube.list(BareMetalHost, namespace=namespace))


async def test_redeploy_checks_its_hosts_bmc_as_deploy_site_does_before_tearing_down(
    service: Service, deployer: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    """Issue 27, point 3: redeploy_server validates its target hosts' BMC address and
    credentials Secret with deploy_site's own check (``redeploy.bmc_problems``), before
    decommission: a host whose address host-power cannot parse, whose Secret is bound to
    another host, or whose Secret does not exist fails the redeploy at validation, so no
    server is wiped to come back as a host nothing may power. Run by the narrowest role
    that could redeploy the design before: the redeployer with the design's Kubernetes
    writes (its dry run passes); deploy_site refuses the same revision with the same
    lines."""
    bad, unbound, missing = (f"{namespace[:40]}-{x}" for x in ("ba", "ub", "ms"))
    bmc_secret(kube, namespace, bad)
    kube.create(
        Secret(
            metadata=ObjectMeta(
                name=f"{unbound}-bmc", namespace=namespace,
                labels={"metalmend.dev/bmc-credentials": "true"},
                annotations={"metalmend.dev/bmc-hosts": "someone-else"},
            ),
            stringData={"username": "admin", "password": "s3cret"},
        )
    )  # fmt: skip
    design = (
        host_document(namespace, bad, "redfish://127.0.0.1:8000/redfish/v1/Systems/../1",
                      doc="bmh-bad")
        + host_document(namespace, unbound, ADDRESS.format(unbound), doc="bmh-unbound")
        + host_document(namespace, missing, ADDRESS.format(missing), doc="bmh-missing")
    )  # fmt: skip
    redeployer = account(
        control_plane, kube, namespace, "bmc-redeployer", "metalmend-shipyard-redeployer",
        "metalmend-site-writer",
    )  # fmt: skip
    expected = [
        f"BareMetalHost {namespace}/{bad}: spec.bmc.address: ",
        f"BareMetalHost {namespace}/{unbound}: Secret {namespace}/{unbound}-bmc is not bound"
        f" to host '{unbound}'",
        f"BareMetalHost {namespace}/{missing}: Secret {namespace}/{missing}-bmc not found, or"
        " not labelled metalmend.dev/bmc-credentials=true",
    ]
    with contextlib.ExitStack() as stack:
        for name in (bad, unbound, missing):
            stack.enter_context(registered(kube, name, f"metal3://{namespace}/{name}"))
        async with service.running() as http:
            committed = await put_and_commit(http, deployer, design)
            assert committed.status_code == 200, committed.text
            redeploy = await action(
                http, redeployer, "redeploy_server", target_nodes=[bad, unbound, missing],
                **{"target-revision": "committed"},
            )  # fmt: skip
            text = refusal(redeploy, "validation")
            for wanted in expected:
                assert wanted in text, (wanted, text)
            states = {s["id"]: s["state"] for s in redeploy["steps"]}
            assert states["decommission"] == states["destroy"] == "upstream_failed", states
            done = await action(http, deployer, "deploy_site")
            text = refusal(done, "validation")
            for wanted in expected:
                assert wanted in text, (wanted, text)
        for name in (bad, unbound, missing):  # not drained, nothing applied or destroyed
            assert not kube.get(Node, name).spec.unschedulable
    assert not list(kube.list(BareMetalHost, namespace=namespace))
    database = Database.open(service.url)
    try:
        assert TaskStore(database).busy([bad, unbound, missing]) == {}
    finally:
        database.dispose()


@contextlib.asynccontextmanager
async def without_worker(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    """The API of the service with no action worker running (its lifespan not started):
    actions are stored and wait."""
    client = AsyncClient(KubeConfig.from_file(service.kubeconfig))
    database = Database.open(service.url)
    database.upgrade()
    root = compose(
        client, database=database, drives=object(),  # type: ignore[arg-type]
        destroy=DestroySettings(lease_seconds=1.5), redeploy=TIMING,
        site_namespaces=(service.namespace,),
    )  # fmt: skip
    app = create_app(root)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url=f"http://serve{SHIPYARD}", timeout=60
    ) as http:
        yield http
    await client.close()
    database.dispose()


async def test_redeploy_needs_nodes_redeploy_per_node_at_creation_and_at_its_start(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    """A redeployer limited to one node (resourceNames) gets 403 for another; a binding
    revoked between creation and start fails the action at its start, before anything."""
    allowed, other = f"{namespace[:40]}-a", f"{namespace[:40]}-b"
    role = f"{namespace}-redeploy-one"
    kube.create(
        ClusterRole(
            metadata=ObjectMeta(name=role),
            rules=[
                PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["actions"],
                           resourceNames=["redeploy_server"], verbs=["create"]),
                PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["actions"],
                           verbs=["get", "list"]),
                PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["nodes/redeploy"],
                           resourceNames=[allowed], verbs=["create"]),
            ],
        )
    )  # fmt: skip
    who = account(control_plane, kube, namespace, "one-node", role)
    binding = f"{namespace}-one-node"  # token() names the binding of the first role so
    try:
        async with without_worker(service) as http:
            body = {"name": "redeploy_server", "parameters": {"target_nodes": [other]}}
            refused = await http.post("/actions", headers=who, json=body)
            message = status_of(refused, 403, "Forbidden")["message"]
            assert f"may not create nodes/redeploy (shipyard.metalmend.dev) on {other}" in message
            both = {"name": "redeploy_server", "parameters": {"target_nodes": [allowed, other]}}
            assert (await http.post("/actions", headers=who, json=both)).status_code == 403
            body = {"name": "redeploy_server", "parameters": {"target_nodes": [allowed]}}
            created = await http.post("/actions", headers=who, json=body)
            assert created.status_code == 201, created.text
            action_id = created.json()["id"]
        kube.delete(ClusterRoleBinding, binding)  # revoked before the action starts
        await until(lambda: _forbidden(kube, namespace, allowed), 30)
        also(kube, namespace, "one-node", "metalmend-shipyard-viewer")  # to read it still
        async with service.running() as http:
            done = await wait_for(http, who, action_id)
        assert done["action_lifecycle"] == "Failed", done
        text = refusal(done, "preflight")
        assert text.startswith("at the action's start: Credentials do not permit access")
        assert f"nodes/redeploy (shipyard.metalmend.dev) on {allowed}" in text
        assert {s["id"]: s["state"] for s in done["steps"]}["destroy"] == "upstream_failed"
    finally:
        kube.delete(ClusterRole, role)


def _forbidden(kube: Client, namespace: str, node: str) -> bool:
    from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
    from lightkube.resources.authorization_v1 import SubjectAccessReview

    review = kube.create(
        SubjectAccessReview(
            spec=SubjectAccessReviewSpec(
                user=f"system:serviceaccount:{namespace}:one-node",
                resourceAttributes=ResourceAttributes(
                    group="shipyard.metalmend.dev", resource="nodes", subresource="redeploy",
                    verb="create", name=node,
                ),
            )
        )
    )  # fmt: skip
    return not review.status.allowed


async def test_an_action_stored_without_its_creator_fails_instead_of_running_as_serve(
    service: Service, deployer: dict[str, str], kube: Client, namespace: str
) -> None:
    name = f"{namespace[:40]}-m"
    bmc_secret(kube, namespace, name)
    async with without_worker(service) as http:
        committed = await put_and_commit(
            http, deployer, host_document(namespace, name, ADDRESS.format(name))
        )
        assert committed.status_code == 200, committed.text
    # as an action stored before migration 0005: no caller
    database = Database.open(service.url)
    now = dt.datetime.now(dt.UTC)
    old = model.Action(
        id=new_action_id(now, os.urandom(10)), name="deploy_site", parameters={},
        lifecycle=ActionLifecycle.PENDING, created=now, updated=now, user="someone",
        context_marker=None, committed_rev_id=1, revision=None, allow_intermediate_commits=False,
        steps=tuple(model.Step(s, i) for i, s in
                    enumerate(("validation", "apply", "wait", "create_action_tag"))),
    )  # fmt: skip
    ActionStore(database).create(old)
    database.dispose()
    async with service.running() as http:
        done = await wait_for(http, deployer, old.id)
    assert done["action_lifecycle"] == "Failed", done
    assert "does not record who created it" in refusal(done, "validation")
    assert not list(kube.list(BareMetalHost, namespace=namespace))


async def finished(
    http: httpx.AsyncClient, who: dict[str, str], name: str, **parameters: Any
) -> dict[str, Any]:
    answer = await http.post("/actions", headers=who, json={"name": name, "parameters": parameters})
    assert answer.status_code == 201, answer.text
    return await wait_for(http, who, answer.json()["id"], within=120)


async def test_relabel_nodes_applies_the_designs_labels_as_the_caller(
    service: Service, deployer: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    """relabel_nodes (issue 30, point 3): the committed design's Node labels applied to the
    target Node as its caller: the labels of other managers (the kubelet's) kept, nothing
    else written, no tag. The narrowest refusals: a Shipyard admin who may not patch
    Nodes gets the API server's refusal at validation; a redeployer may not create the
    action; a target without a Node document, or not registered, fails validation;
    parameters are refused by name at creation."""
    name, stray = f"{namespace[:40]}-r", f"{namespace[:40]}-s"
    bmc_secret(kube, namespace, name)
    design = host_document(namespace, name, ADDRESS.format(name)) + node_document(
        name, "example.com/role: storage, example.com/rack: r1"
    )
    admin_only = account(control_plane, kube, namespace, "relabel-admin-only",
                         "metalmend-shipyard-admin")  # fmt: skip
    redeployer = account(control_plane, kube, namespace, "relabel-redeployer",
                         "metalmend-shipyard-redeployer")  # fmt: skip
    with registered(kube, name, f"metal3://{namespace}/{name}"):
        kube.patch(Node, name, {"metadata": {"labels": {"kubelet-own": "yes"}}})
        async with service.running() as http:
            never = await http.post(
                "/actions", headers=deployer,
                json={"name": "relabel_nodes", "parameters": {"target_nodes": [name]}},
            )  # fmt: skip
            assert (
                "relabel_nodes needs committed configdocs"
                in (status_of(never, 400, "BadRequest")["message"])
            )
            committed = await put_and_commit(http, deployer, design)
            assert committed.status_code == 200, committed.text
            before = tags(service)
            for parameters, problem in (
                ({}, "target_nodes is required: the node(s) to relabel"),
                ({"target_nodes": []}, "target_nodes is empty: name the node(s) to relabel"),
                ({"target_nodes": [name], "force": "true"},
                 "relabel_nodes has no parameter 'force'; its one parameter is target_nodes"),
            ):  # fmt: skip
                body = {"name": "relabel_nodes", "parameters": parameters}
                refused = await http.post("/actions", headers=deployer, json=body)
                assert problem in status_of(refused, 400, "BadRequest")["message"]
            body = {"name": "relabel_nodes", "parameters": {"target_nodes": [name]}}
            forbidden = await http.post("/actions", headers=redeployer, json=body)
            assert (
                "create actions (shipyard.metalmend.dev) on relabel_nodes"
                in (status_of(forbidden, 403, "Forbidden")["message"])
            )
            denied = await finished(http, admin_only, "relabel_nodes", target_nodes=[name])
            text = refusal(denied, "validation")
            assert f"labels of Node {name} (dry run)" in text
            assert 'cannot patch resource "nodes"' in text
            assert step(denied, "relabel")["state"] == "upstream_failed"
            assert "example.com/role" not in (kube.get(Node, name).metadata.labels or {})
            missing = await finished(http, deployer, "relabel_nodes", target_nodes=[name, stray])
            assert f"Node {stray} has no Node document in design revision" in refusal(
                missing, "validation"
            )
            done = await finished(http, deployer, "relabel_nodes", target_nodes=name)
            assert done["action_lifecycle"] == "Complete", done
            notes = [n["note_val"] for n in step(done, "relabel")["notes"]]
            assert any(
                f"Node {name}: design labels applied (example.com/rack=r1, example.com/role=storage)"
                in note
                for note in notes
            ), notes
        labels = kube.get(Node, name).metadata.labels or {}
        assert {
            k: labels.get(k) for k in ("example.com/role", "example.com/rack", "kubelet-own")
        } == {
            "example.com/role": "storage",
            "example.com/rack": "r1",
            "kubelet-own": "yes",
        }
        assert tags(service) == before  # a target action: no tag
        await until(lambda: _none(kube, BareMetalHost, namespace), 30)  # only labels written
