"""Shipyard's API (configdocs and actions, under /shipyard/api/v1.0) against the real API
server: authentication and per-action authorization through the ClusterRoles of
deploy/rbac/serve.yaml, the buffer and its commit, the comparison of versions, the
intermediate-commit guard, and a deploy_site run to its tag by the service's own worker,
with the service stopped in its wait and started again (the steps done are not redone)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.core_v1 import NodeCondition, NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Event, Node, Secret
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding, RoleBinding
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.db import Database
from metalmend.designs.store import DesignStore
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_serve_promenade import bearer, lines, serve_kubeconfig, status_of, token
from tests.support import kubelets, until

__all__ = ["serve_kubeconfig"]

SHIPYARD = "/shipyard/api/v1.0"
YAML = {"Content-Type": "application/x-yaml"}
TIMING = RedeploySettings(provision_timeout=60, node_ready_timeout=60, poll_interval=0.2)


@dataclass
class Service:
    kubeconfig: Path
    url: str
    namespace: str
    timing: RedeploySettings = TIMING

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[httpx.AsyncClient]:
        """One replica of the service, its worker running, until the block ends (then
        stopped as a killed one is: its lease left to expire)."""
        client = AsyncClient(KubeConfig.from_file(self.kubeconfig))
        database = Database.open(self.url)
        database.upgrade()
        root = compose(
            client, database=database, drives=object(),  # type: ignore[arg-type]
            destroy=DestroySettings(lease_seconds=1.5), redeploy=self.timing,
            site_namespaces=(self.namespace,),
        )  # fmt: skip
        app = create_app(root)
        transport = httpx.ASGITransport(app=app)
        base = f"http://serve{SHIPYARD}"
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url=base, timeout=60) as http,
        ):
            yield http
        await client.close()
        database.dispose()


@pytest.fixture
def service(
    serve_kubeconfig: Path, kube: Client, namespace: str, tmp_path: Path
) -> Iterator[Service]:
    # serve reads BMC credentials Secrets only where a RoleBinding lets it (the design's
    # Secrets are checked to exist): bound here as an operator binds it per namespace.
    kube.create(
        RoleBinding(
            metadata=ObjectMeta(name="metalmend-serve-bmc-credentials", namespace=namespace),
            roleRef=RoleRef(
                apiGroup="rbac.authorization.k8s.io", kind="ClusterRole",
                name="metalmend-serve-bmc-credentials",
            ),
            subjects=[Subject(kind="ServiceAccount", name="metalmend-serve",
                              namespace="metalmend-system")],
        )
    )  # fmt: skip
    return Service(serve_kubeconfig, f"sqlite:///{tmp_path / 'serve.sqlite'}", namespace)


def also(kube: Client, namespace: str, account: str, role: str) -> None:
    """Bind ServiceAccount ``namespace/account`` to ClusterRole ``role`` too."""
    kube.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=f"{namespace}-{account}-{role}"),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[Subject(kind="ServiceAccount", name=account, namespace=namespace)],
        )
    )


@pytest.fixture
def admin(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    # A site's deployer: Shipyard's admin, and the Kubernetes writes of a design (applied
    # as the caller: docs/site-actions.md, "Whose permissions apply a design").
    found = bearer(token(control_plane, kube, namespace, "site-admin", "metalmend-shipyard-admin"))
    also(kube, namespace, "site-admin", "metalmend-site-writer")
    return found


@pytest.fixture
def redeployer(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    role = "metalmend-shipyard-redeployer"
    return bearer(token(control_plane, kube, namespace, "site-redeployer", role))


def design(namespace: str, hosts: list[str], labels: str = "role: worker") -> str:
    text = ""
    for name in hosts:
        text += f"""---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: baremetalhost.{namespace}.{name}}}
data:
  apiVersion: metal3.io/v1alpha1
  kind: BareMetalHost
  metadata: {{name: {name}, namespace: {namespace}, labels: {{site: lab}}}}
  spec:
    online: true
    bmc: {{address: "redfish://127.0.0.1:8000/redfish/v1/Systems/{name}",
          credentialsName: {name}-bmc}}
    image: {{url: "http://images.lab/os.qcow2", checksum: "http://images.lab/os.sha256"}}
---
schema: metalmend/KubernetesObject/v1
metadata: {{schema: metadata/Document/v1, name: node..{name}}}
data:
  apiVersion: v1
  kind: Node
  metadata: {{name: {name}, labels: {{{labels}}}}}
"""
    return text


async def put(
    http: httpx.AsyncClient, who: dict[str, str], collection: str, body: str, **query: str
) -> httpx.Response:
    return await http.post(
        f"/configdocs/{collection}", content=body, headers={**who, **YAML}, params=query
    )


def docs(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    return [d for d in yaml.safe_load_all(answer.text) if d is not None]


async def test_the_buffer_commit_and_versions(
    service: Service, admin: dict[str, str], namespace: str
) -> None:
    async with service.running() as http:
        first = await http.get("/configdocs/site", headers=admin)
        assert first.status_code == 404, first.text
        answer = await put(http, admin, "site", design(namespace, ["h1"]))
        created = status_of(answer, 201, "Created")
        assert "design revision 1" in created["message"]
        # rejectoncontents: the buffer holds changes not committed
        refused = status_of(
            await put(http, admin, "other", design(namespace, ["h2"])), 409, "Conflict"
        )
        assert "buffermode=append" in refused["message"]
        status_of(
            await put(http, admin, "other", design(namespace, ["h2"]), buffermode="append"),
            201,
            "Created",
        )
        # append onto a collection the buffer already holds: 409, as Shipyard answers it
        held = await put(http, admin, "other", design(namespace, ["h2"]), buffermode="append")
        assert "already in the buffer" in status_of(held, 409, "Conflict")["message"]
        assert [d["data"]["kind"] for d in docs(await http.get("/configdocs/site", headers=admin))] == [
            "BareMetalHost", "Node"
        ]  # fmt: skip
        committed = await http.get(
            "/configdocs/site", headers=admin, params={"version": "committed"}
        )
        assert "no committed version" in status_of(committed, 404, "NotFound")["message"]
        compared = (await http.get("/configdocs", headers=admin)).json()
        assert {(r["collection_name"], r["base_status"], r["new_status"]) for r in compared} == {
            ("site", "not present", "created"), ("other", "not present", "created")
        }  # fmt: skip
        # commit: the buffer becomes the committed version; nothing left to commit
        done = status_of(await http.post("/commitconfigdocs", headers=admin), 200, "Success")
        assert done["message"] == "configdocs committed: design revision 2"
        again = await http.post("/commitconfigdocs", headers=admin)
        assert "no documents in the buffer" in status_of(again, 409, "Conflict")["message"]
        assert (
            len(
                docs(
                    await http.get(
                        "/renderedconfigdocs", headers=admin, params={"version": "committed"}
                    )
                )
            )
            == 4
        )
        unchanged = await put(http, admin, "other", design(namespace, ["h2"]))
        assert "nothing changed" in status_of(unchanged, 400, "BadRequest")["message"]
        # replace: the buffer discarded first, then the collection put
        await put(http, admin, "site", design(namespace, ["h1"], "role: storage"))
        await put(
            http, admin, "site", design(namespace, ["h1"], "role: edge"), buffermode="replace"
        )
        rows = (
            await http.get(
                "/configdocs", headers=admin, params={"versions": ["buffer", "committed"]}
            )
        ).json()
        assert {(r["collection_name"], r["new_status"]) for r in rows} == {
            ("site", "modified"), ("other", "unmodified")
        }  # fmt: skip
        assert rows[0]["base_version"] == "committed"  # older first, whatever order was asked
        spec = await http.get(
            "/configdocs", headers=admin,
            params={"base-version": "committed", "diff-version": "buffer"},
        )  # fmt: skip
        assert spec.json() == rows  # the spec's names for the same comparison
        bad = await http.get(
            "/configdocs", headers=admin, params={"versions": ["buffer", "buffer"]}
        )
        assert "unique" in status_of(bad, 400, "BadRequest")["message"]
        missing = await http.get(
            "/configdocs", headers=admin, params={"version": "last_site_action,committed"}
        )
        assert "does not exist" in status_of(missing, 404, "NotFound")["message"]


async def test_a_design_that_reaches_outside_its_namespaces_does_not_commit(
    service: Service, admin: dict[str, str], namespace: str
) -> None:
    async with service.running() as http:
        answer = await put(http, admin, "site", design("kube-system", ["h1"]))
        found = status_of(answer, 201, "Created")
        assert any("namespace 'kube-system' is not one" in line for line in lines(found))
        refused = status_of(await http.post("/commitconfigdocs", headers=admin), 400, "BadRequest")
        assert "nothing committed" in refused["message"]
        dry = await http.post(
            "/commitconfigdocs", headers=admin, params={"force": "true", "dryrun": "true"}
        )
        assert "would be committed" in status_of(dry, 200, "Success")["message"]


async def test_actions_are_authorized_per_name_and_checked_before_they_are_stored(
    service: Service, admin: dict[str, str], redeployer: dict[str, str], namespace: str,
    control_plane: ControlPlane, kube: Client,
) -> None:  # fmt: skip
    nobody = bearer(token(control_plane, kube, namespace, "site-nobody", None))
    async with service.running() as http:
        unknown = await http.post("/actions", headers=admin, json={"name": "rm_rf_site"})
        assert "not a supported action" in status_of(unknown, 400, "BadRequest")["message"]
        # a key beside name and parameters: refused naming it, not ignored (issue 36,
        # point 8), before any permission is asked (any authenticated caller reaches it)
        misplaced = {"name": "redeploy_server", "parameters": {"target_nodes": "n1"},
                     "preserve-local-storage": False}  # fmt: skip
        for who in (nobody, redeployer):
            extra = status_of(
                await http.post("/actions", headers=who, json=misplaced), 400, "BadRequest"
            )
            assert extra["message"] == (
                "unknown key 'preserve-local-storage' in the action's body: it holds name and"
                " parameters only (an action's parameters go under parameters); nothing created"
            )
        assert (await http.get("/actions", headers=admin)).json() == []
        site = await http.post("/actions", headers=redeployer, json={"name": "deploy_site"})
        assert "create actions" in status_of(site, 403, "Forbidden")["message"]
        nothing = await http.post("/actions", headers=admin, json={"name": "deploy_site"})
        assert "needs committed configdocs" in status_of(nothing, 400, "BadRequest")["message"]
        typo = {
            "name": "redeploy_server",
            "parameters": {"target_nodes": "n1", "preserve_local_storage": "true"},
        }
        bad = status_of(
            await http.post("/actions", headers=redeployer, json=typo), 400, "BadRequest"
        )
        assert "preserve_local_storage" in bad["message"]
        # redeploy_server is the redeployer's: stored, then it fails as a missing precondition
        ok = {"name": "redeploy_server", "parameters": {"target_nodes": "n1"}}
        answer = await http.post("/actions", headers=redeployer, json=ok)
        assert answer.status_code == 201, answer.text
        action = answer.json()
        assert answer.headers["Location"] == f"{SHIPYARD}/actions/{action['id']}"
        assert len(action["id"]) == 26
        assert action["action_lifecycle"] == "Pending"
        assert action["command_audit"][0]["command"] == "invoke"
        twice = await http.post("/actions", headers=redeployer, json=ok)
        assert "already redeploying n1" in status_of(twice, 409, "Conflict")["message"]
        found = await wait_for(http, admin, action["id"])
        assert found["action_lifecycle"] == "Failed"
        lookup = next(s for s in found["steps"] if s["id"] == "design_lookup")
        assert lookup["state"] == "failed"
        assert lookup["notes"][-1]["note_val"].startswith("missing precondition:")
        assert {s["id"]: s["state"] for s in found["steps"]}["decommission"] == "upstream_failed"
        step = (await http.get(f"/actions/{action['id']}/steps/preflight", headers=admin)).json()
        assert (step["state"], step["try_number"]) == ("success", 1)
        listed = (await http.get("/actions", headers=redeployer)).json()
        assert [a["id"] for a in listed] == [action["id"]]
        stop = await http.post(f"/actions/{action['id']}/control/stop", headers=admin)
        assert "cannot be stopped" in status_of(stop, 409, "Conflict")["message"]
        assert (await http.get("/actions/NOTANID", headers=admin)).status_code == 404


@contextlib.asynccontextmanager
async def replica(
    kubeconfig: Path, database: Database, namespace: str
) -> AsyncIterator[httpx.AsyncClient]:
    """One replica of the service with its own connections to ``database``, its action
    worker not started (httpx's transport runs no lifespan): what it stores stays Pending."""
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    root = compose(
        client, database=database, drives=object(),  # type: ignore[arg-type]
        redeploy=TIMING, site_namespaces=(namespace,),
    )  # fmt: skip
    app = create_app(root)
    transport = httpx.ASGITransport(app=app)
    try:
        base = f"http://serve{SHIPYARD}"
        async with httpx.AsyncClient(transport=transport, base_url=base, timeout=60) as http:
            yield http
    finally:
        await client.close()


async def test_a_burst_of_actions_on_one_node_through_two_replicas_stores_one(
    serve_kubeconfig: Path, database_url: str, admin: dict[str, str],
    redeployer: dict[str, str], namespace: str,
) -> None:  # fmt: skip
    """Issue 36, point 2: four redeploy_server of one node, two with target-revision
    committed, and two relabel_nodes of it, sent together through two replicas with their
    own connections to one database (each from its narrowest role: the redeployer's, the
    admin's for relabel_nodes): one 201, five 409 naming the action that holds the node
    (the check and the insert are one transaction: ActionStore.create), one action
    stored. Then a deploy_site is refused while it is not finished."""
    node = f"{namespace[:40]}-w0"
    redeploy = {"name": "redeploy_server", "parameters": {"target_nodes": [node]}}
    committed = {
        "name": "redeploy_server",
        "parameters": {"target_nodes": [node], "target-revision": "committed"},
    }
    relabel = {"name": "relabel_nodes", "parameters": {"target_nodes": [node]}}
    one_db, two_db = Database.open(database_url), Database.open(database_url)
    one_db.upgrade()
    try:
        async with (
            replica(serve_kubeconfig, one_db, namespace) as one,
            replica(serve_kubeconfig, two_db, namespace) as two,
        ):
            await put(one, admin, "site", design(namespace, [node]))
            status_of(await one.post("/commitconfigdocs", headers=admin), 200, "Success")
            sent = [(one, redeployer, redeploy), (two, redeployer, committed),
                    (one, admin, relabel), (two, redeployer, redeploy),
                    (one, redeployer, committed), (two, admin, relabel)]  # fmt: skip
            answers = await asyncio.gather(
                *(http.post("/actions", headers=who, json=body) for http, who, body in sent)
            )
            listed = (await two.get("/actions", headers=admin)).json()
            site = await one.post("/actions", headers=admin, json={"name": "deploy_site"})
    finally:
        one_db.dispose()
        two_db.dispose()
    codes = sorted(a.status_code for a in answers)
    assert codes == [201, 409, 409, 409, 409, 409], [a.text for a in answers]
    won = next(a.json() for a in answers if a.status_code == 201)
    doing = "relabelling" if won["name"] == "relabel_nodes" else "redeploying"
    for refused in (a for a in answers if a.status_code == 409):
        document = status_of(refused, 409, "Conflict")
        assert (
            document["message"] == f"action {won['id']} ({won['name']}) is already {doing} {node}"
        )
    assert [a["id"] for a in listed] == [won["id"]]
    waits = status_of(site, 409, "Conflict")["message"]
    assert (
        waits == f"action {won['id']} ({won['name']}) is running: deploy_site waits until it ends"
    )


async def wait_for(
    http: httpx.AsyncClient, who: dict[str, str], action_id: str, step: str | None = None,
    within: float = 60,
) -> dict[str, Any]:  # fmt: skip
    """The action once it has finished (or once ``step`` is running); the wait stretched by
    the machine's load, as every wait of the suite (tests/support.py)."""
    found: dict[str, Any] = {}

    async def there() -> bool:
        nonlocal found
        found = (await http.get(f"/actions/{action_id}", headers=who)).json()
        states = {s["id"]: s["state"] for s in found["steps"]}
        if step is not None and states.get(step) == "running":
            return True
        return found["action_lifecycle"] in ("Complete", "Failed")

    awaited = f"step {step} of action {action_id} running" if step else f"action {action_id} ended"
    await until(there, within, what=awaited, state=lambda: found)
    return found


def story(action: dict[str, Any]) -> str:
    """An action as its steps and their notes: what a failed assertion should show."""
    lines = [f"action {action.get('id')} {action.get('action_lifecycle')}"]
    for step in action.get("steps", []):
        notes = [n.get("note_val") for n in step.get("notes", [])]
        lines.append(f"  {step.get('id')}: {step.get('state')} {notes}")
    return "\n".join(lines)


def host_up(kube: Client, namespace: str, name: str) -> None:
    """What baremetal-operator and host-power would report: provisioned and on."""
    status = {"provisioning": {"state": "provisioned"}, "poweredOn": True}
    kube.patch(
        BareMetalHost.Status, name, {"status": status}, namespace=namespace,
        patch_type=PatchType.MERGE,
    )  # fmt: skip


def node_up(kube: Client, name: str, namespace: str) -> None:
    """The host's Node, registered by its kubelet: its providerID names the host."""
    kube.create(
        Node(
            metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name}),
            spec=NodeSpec(providerID=f"metal3://{namespace}/{name}"),
        )
    )
    now = dt.datetime.now(dt.UTC)
    ready = NodeCondition(
        type="Ready", status="True", lastHeartbeatTime=now, lastTransitionTime=now
    )
    kube.patch(Node.Status, name, {"status": {"conditions": [ready.to_dict()]}})


async def test_deploy_site_to_its_tag_across_a_restart_and_the_guard(
    service: Service, admin: dict[str, str], kube: Client, aclient: AsyncClient, namespace: str
) -> None:
    hosts = [f"{namespace[:40]}-a", f"{namespace[:40]}-b"]
    for name in hosts:
        kube.create(Secret(  # labelled and bound: what host-power (and validation) uses
            metadata=ObjectMeta(name=f"{name}-bmc", namespace=namespace,
                                labels={"metalmend.dev/bmc-credentials": "true"},
                                annotations={"metalmend.dev/bmc-hosts": name}),
            stringData={"username": "u", "password": "p"}))  # fmt: skip
    try:
        async with service.running() as http:
            await put(http, admin, "site", design(namespace, hosts))
            await http.post("/commitconfigdocs", headers=admin)
            answer = await http.post("/actions", headers=admin, json={"name": "deploy_site"})
            assert answer.status_code == 201, answer.text
            action_id = answer.json()["id"]
            waiting = await wait_for(http, admin, action_id, step="wait")
            assert waiting["committed_rev_id"] == 1
        # stopped in its wait (the hosts are not up): a new replica takes the action over
        # once the lease has expired, and finds its hosts applied
        for name in hosts:
            found = kube.get(BareMetalHost, name, namespace=namespace)
            assert found.spec["online"] is True
            assert found.metadata.labels == {"site": "lab"}
            host_up(kube, namespace, name)
            node_up(kube, name, namespace)
        # Their kubelets keep the Nodes Ready (a flow slower than the lifecycle controller's
        # grace on a busy machine otherwise waits for a Ready that cannot come).
        async with kubelets(aclient, hosts), service.running() as http:
            done = await wait_for(http, admin, action_id)
            assert done["action_lifecycle"] == "Complete", story(done)
            steps = {s["id"]: s for s in done["steps"]}
            detail = (await http.get(f"/actions/{action_id}/steps/apply", headers=admin)).json()
            assert detail["try_number"] == 1  # applied once; the wait ran again
            wait = (await http.get(f"/actions/{action_id}/steps/wait", headers=admin)).json()
            assert wait["try_number"] == 2
            assert (
                "tagged site-action-success" in steps["create_action_tag"]["notes"][-1]["note_val"]
            )
            # two commits since the last site action: refused, then allowed
            for labels in ("role: storage", "role: edge"):
                await put(http, admin, "site", design(namespace, hosts, labels))
                await http.post("/commitconfigdocs", headers=admin)
            refused = await http.post("/actions", headers=admin, json={"name": "update_site"})
            guard = status_of(refused, 409, "Intermediate commit detected")
            assert (
                "revision(s) 2 were committed since the last site action (revision 1)"
                in guard["message"]
            )
            allowed = await http.post(
                "/actions", headers=admin, json={"name": "update_site"},
                params={"allow-intermediate-commits": "true"},
            )  # fmt: skip
            assert allowed.status_code == 201, allowed.text
            assert "check is skipped" in allowed.json()["notes"][0]["note_val"]
            again = await wait_for(http, admin, allowed.json()["id"])
            assert again["action_lifecycle"] == "Complete", story(again)
        store = DesignStore(Database.open(service.url))
        assert store.tags(1)["site-action-success"] == {
            "dag_id": "deploy_site",
            "action_id": action_id,
        }
        assert "site-action-success" in store.tags(3)
        assert "site-action-success" not in store.tags(2)
        for name in hosts:
            assert kube.get(Node, name).metadata.labels["role"] == "edge"
        reasons = {e.reason for e in kube.list(Event, namespace=namespace)}
        assert "ShipyardApply" in reasons
    finally:
        for name in hosts:
            with contextlib.suppress(Exception):
                kube.delete(Node, name)
