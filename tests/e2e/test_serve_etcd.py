"""remove-etcd and etcd health against the lab's real site etcd: three upstream etcd
members living on three lab hosts (a hung host freezes its member), the lab's design put
into serve's own design store (a design reference names its revision, as a Shipyard's
would), and ``metalmend serve``'s app running as the ServiceAccount of
deploy/rbac/serve.yaml, called with a real token.

The tests share one lab and run in file order: the first ones leave the cluster whole,
then one member is removed (the leader, handing over first), and the last ones work
with the two members left."""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend_lab import lab, siteetcd
from tests.support import Deadline, started

SERVE_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "serve.yaml"
PROMENADE = "/promenade/api/v1.0"


@pytest.fixture(scope="module")
def site_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("etcdlab"), hosts=3, bmc="ipmi", boot_delay=0.5,
        controllers="", serve=False,
    )  # fmt: skip
    with lab.started(options) as running:
        client = Client(KubeConfig.from_file(running.kubeconfig), field_manager="metalmend-tests")
        for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
            client.apply(obj, force=True)
        started(  # the kubelets register the Nodes
            lambda: len(list(client.list(Node))) >= 3, "the lab's 3 kubelets to register Nodes"
        )
        yield running


@pytest.fixture(scope="module")
def site(site_lab: lab.RunningLab) -> siteetcd.SitePlan:
    plan = siteetcd.SitePlan.read(siteetcd.plan_path(site_lab.plane.workdir.parent))
    assert plan is not None
    return plan


@pytest.fixture(scope="module")
def admin_token(site_lab: lab.RunningLab) -> str:
    """The teardown admin, who may also read the design revisions (deckhand viewer)."""
    plane, client = site_lab.plane, site_lab.client()
    path = plane.service_account_kubeconfig("default", "etcd-admin")
    for role in ("metalmend-promenade-admin", "metalmend-deckhand-viewer"):
        client.create(
            ClusterRoleBinding(
                metadata=ObjectMeta(name=f"etcd-admin-{role}"),
                roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
                subjects=[Subject(kind="ServiceAccount", name="etcd-admin", namespace="default")],
            )
        )  # fmt: skip
    value: str = yaml.safe_load(path.read_text())["users"][0]["user"]["token"]
    return value


@pytest.fixture(scope="module")
def database(site_lab: lab.RunningLab) -> Iterator[Database]:
    """serve's design store, in the lab's directory."""
    found = Database.open(f"sqlite:///{site_lab.plane.workdir.parent / 'serve.sqlite'}")
    found.upgrade()
    yield found
    found.dispose()


def stored(database: Database, text: str, bucket: str = "etcd") -> str:
    """A design reference naming a new revision of serve's store that holds ``text`` in
    ``bucket``, filtered to that bucket (Deckhand's ``status.bucket``: a revision holds
    every bucket's documents)."""
    revision = DesignStore(database).put(bucket, parse(text)).revision
    return (
        f"deckhand+https://deckhand/api/v1.0/revisions/{revision}/rendered-documents"
        f"?status.bucket={bucket}"
    )


@pytest.fixture(scope="module")
def site_ref(database: Database, site: siteetcd.SitePlan) -> str:
    """The lab's site etcd design, as serve's store holds it."""
    return stored(database, siteetcd.design_documents(site), "lab-site-etcd")


@pytest.fixture
async def http(
    site_lab: lab.RunningLab, admin_token: str, database: Database
) -> AsyncIterator[httpx.AsyncClient]:
    kubeconfig = site_lab.plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")
    client = AsyncClient(KubeConfig.from_file(kubeconfig))
    transport = httpx.ASGITransport(app=create_app(compose(client, database=database)))
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://serve", timeout=120, headers=headers
    ) as h:
        yield h
    await client.close()


# ---- helpers ----------------------------------------------------------------------------


def status_of(answer: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    document: dict[str, Any] = answer.json()
    assert (answer.status_code, document["reason"]) == (code, reason), document
    assert document["kind"] == "Status"
    assert document["code"] == code
    return document


def lines(document: dict[str, Any]) -> list[str]:
    return [m["message"] for m in document["details"]["messageList"]]


def design_ref(href: str) -> dict[str, str]:
    return {"rel": "design", "href": href, "type": "application/x-yaml"}


def members(site: siteetcd.SitePlan) -> dict[str, str]:
    """etcd's member list, name -> hex id, from the first member that answers."""
    for m in site.members:
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.post(f"{m.client_url}/v3/cluster/member/list", json={}, timeout=3)
            return {x.get("name", ""): f"{int(x['ID']):x}" for x in answer.json()["members"]}
    raise AssertionError("no member answers")


def leader(site: siteetcd.SitePlan) -> str:
    ids = {v: k for k, v in members(site).items()}
    for m in site.members:
        with contextlib.suppress(httpx.HTTPError, KeyError):
            answer = httpx.post(f"{m.client_url}/v3/maintenance/status", json={}, timeout=3)
            return ids[f"{int(answer.json()['leader']):x}"]
    raise AssertionError("no leader")


def wait_for(check: Any, within: float = 30.0) -> None:
    deadline = Deadline(within)
    while not check():
        assert not deadline.expired(), "timed out"
        time.sleep(0.2)


@contextlib.contextmanager
def hung(running: lab.RunningLab, site: siteetcd.SitePlan, *hosts: str) -> Iterator[None]:
    """The hosts' kernels hang (their members freeze) for the block; afterwards every
    member is healthy again and has been connected long enough for etcd to accept a
    membership change (its strict reconfiguration check wants 5 s)."""
    lab_dir = running.plane.workdir.parent
    frozen = [m for m in site.members if m.host in hosts]
    for host in hosts:
        lab.inject_fault(lab_dir, host, "hang")
    wait_for(lambda: not any(siteetcd.member_healthy(m) for m in frozen))
    try:
        yield
    finally:
        for host in hosts:
            lab.inject_fault(lab_dir, host, "recover")
        live = [m for m in site.members if m.host in members(site)]
        wait_for(lambda: all(siteetcd.member_healthy(m) for m in live))


# ---- the whole cluster --------------------------------------------------------------------


def test_the_lab_serves_its_site_etcd_in_its_design(
    site_lab: lab.RunningLab, site: siteetcd.SitePlan
) -> None:
    lab_ca = ssl.create_default_context(cafile=str(site_lab.plane.ca.pair.cert))
    documents = list(yaml.safe_load_all(httpx.get(site_lab.state.design_ref, verify=lab_ca).text))
    assert [d["schema"] for d in documents] == ["promenade/EtcdClusters/v1"]
    cluster = documents[0]["data"]["clusters"][0]
    assert cluster["minimum_functionality"] == {"healthy_members": 2}
    assert [m["node"] for m in cluster["members"]] == ["worker-0", "worker-1", "worker-2"]
    assert sorted(members(site)) == ["worker-0", "worker-1", "worker-2"]
    report = lab.status(site_lab.plane.workdir.parent).site_etcd
    assert report is not None
    assert report.design_ref == site_lab.state.design_ref
    assert [(m.process, m.healthy) for m in report.members] == [("running", True)] * 3


async def test_health_is_healthy_when_every_member_is(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site_ref: str
) -> None:
    answer = await http.get(
        f"{PROMENADE}/etcd-cluster-health-statuses",
        params={"design_ref": site_ref},
    )
    document = status_of(answer, 200, "Success")
    [entry] = document["details"]["messageList"]
    assert entry["kind"] == "HealthMessage"
    assert entry["name"] == "kubernetes"
    assert (entry["message"], entry["error"]) == ("Healthy", False)
    assert "3 of 3 members healthy" in entry["detail"]


async def test_health_without_a_design_ref_is_missing_design_ref(http: httpx.AsyncClient) -> None:
    answer = await http.get(f"{PROMENADE}/etcd-cluster-health-statuses")
    status_of(answer, 400, "MissingDesignRef")


async def test_health_of_a_design_without_etcd_clusters_is_not_found(
    http: httpx.AsyncClient, database: Database
) -> None:
    url = stored(
        database,
        "schema: promenade/Genesis/v1\nmetadata: {schema: metadata/Document/v1, name: g}\ndata: {}\n",
    )
    answer = await http.get(f"{PROMENADE}/etcd-cluster-health-statuses", params={"design_ref": url})
    status_of(answer, 404, "NotFound")


async def test_a_bad_design_is_a_bad_request_naming_the_field(
    http: httpx.AsyncClient, database: Database
) -> None:
    text = "schema: promenade/EtcdClusters/v1\nmetadata: {schema: metadata/Document/v1, name: e}\ndata: {clusters: [{name: k, members: []}]}\n"
    url = stored(database, text, "bad")
    answer = await http.post(f"{PROMENADE}/nodes/worker-0/remove-etcd", json=design_ref(url))
    document = status_of(answer, 400, "BadRequest")
    assert "members must be a non-empty list" in document["message"]


async def test_an_unreachable_cluster_is_etcd_not_accessible(
    http: httpx.AsyncClient, database: Database
) -> None:
    dead = f"http://127.0.0.1:{siteetcd.free_port()}"
    text = yaml.safe_dump({
        "schema": "promenade/EtcdClusters/v1", "metadata": {"schema": "metadata/Document/v1", "name": "gone"},
        "data": {"clusters": [{"name": "gone", "minimum_functionality": {"healthy_members": 1},
                               "members": [{"node": "worker-0", "client_urls": [dead]}]}]},
    })  # fmt: skip
    url = stored(database, text, "gone")
    answer = await http.post(f"{PROMENADE}/nodes/worker-0/remove-etcd", json=design_ref(url))
    health = await http.get(f"{PROMENADE}/etcd-cluster-health-statuses", params={"design_ref": url})
    assert (
        "cannot read the members of etcd cluster gone"
        in lines(status_of(answer, 500, "EtcdNotAccessible"))[0]
    )
    [entry] = status_of(health, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"], entry["name"]) == (
        "Unable to access Etcd",
        True,
        "gone",
    )


async def test_removal_is_refused_while_another_member_is_down_and_nothing_changes(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan, site_ref: str
) -> None:
    before = members(site)
    with hung(site_lab, site, "worker-2"):
        answer = await http.post(
            f"{PROMENADE}/nodes/worker-0/remove-etcd", json=design_ref(site_ref)
        )
        document = status_of(answer, 500, "RemoveEtcdError")
        assert any("would lose quorum" in line for line in lines(document)), document
        assert members(site) == before


async def test_health_is_unhealthy_without_quorum(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan, site_ref: str
) -> None:
    with hung(site_lab, site, "worker-1", "worker-2"):
        answer = await http.get(
            f"{PROMENADE}/etcd-cluster-health-statuses",
            params={"design_ref": site_ref},
        )
        [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
        assert (entry["message"], entry["error"]) == ("Unhealthy", False), entry


# ---- one member leaves ----------------------------------------------------------------------


async def test_the_leader_hands_over_leadership_then_leaves(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan, site_ref: str
) -> None:
    node = leader(site)
    answer = await http.post(f"{PROMENADE}/nodes/{node}/remove-etcd", json=design_ref(site_ref))
    document = status_of(answer, 200, "Success")
    said = lines(document)
    assert any(
        line.startswith("cluster kubernetes: leadership moved from " + node) for line in said
    )
    assert f"etcd member on {node} removed from cluster kubernetes" in said
    left = members(site)
    assert node not in left
    assert len(left) == 2
    assert leader(site) in left
    lab_dir = site_lab.plane.workdir.parent

    def stopped() -> bool:  # a removed member stops itself; the lab does not restart it
        report = lab.status(lab_dir).site_etcd
        return report is not None and any(
            m.host == node and m.process == "exited" for m in report.members
        )

    wait_for(stopped)


async def test_a_retried_removal_is_success(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan, site_ref: str
) -> None:
    gone = next(m.host for m in site.members if m.host not in members(site))
    answer = await http.post(f"{PROMENADE}/nodes/{gone}/remove-etcd", json=design_ref(site_ref))
    document = status_of(answer, 200, "Success")
    assert lines(document) == [f"etcd cluster kubernetes has no member on {gone} (already gone)"]


async def test_removal_below_the_sites_threshold_is_refused(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan, site_ref: str
) -> None:
    before = members(site)
    node = sorted(before)[0]
    answer = await http.post(f"{PROMENADE}/nodes/{node}/remove-etcd", json=design_ref(site_ref))
    document = status_of(answer, 500, "RemoveEtcdError")
    assert any("minimum functionality" in line for line in lines(document)), document
    assert members(site) == before


async def test_health_ignores_the_member_that_left(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site_ref: str
) -> None:
    answer = await http.get(
        f"{PROMENADE}/etcd-cluster-health-statuses",
        params={"design_ref": site_ref},
    )
    [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Healthy", False)
    assert "2 of 2 members healthy" in entry["detail"]


# ---- credentials never travel in cleartext ---------------------------------------------------


def with_credentials(site: siteetcd.SitePlan, namespace: str, name: str) -> str:
    [document] = yaml.safe_load_all(siteetcd.design_documents(site))
    document["data"]["clusters"][0]["credentials"] = {
        "secret": {"namespace": namespace, "name": name}
    }
    document["metadata"]["name"] = "etcd-clusters-with-credentials"  # one name, one bucket
    return yaml.safe_dump(document)


def secret_for_serve(running: lab.RunningLab, name: str, password: str) -> None:
    """An etcd credentials Secret in default, labelled and bound to the lab's cluster, and
    a Role letting metalmend serve read that one Secret (as the chart renders it)."""
    client = Client(KubeConfig.from_file(running.kubeconfig), field_manager="metalmend-tests")
    documents = [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": name, "namespace": "default",
                      "labels": {"metalmend.dev/etcd-credentials": "true"},
                      "annotations": {"metalmend.dev/etcd-clusters": siteetcd.CLUSTER}},
         "stringData": {"username": "root", "password": password}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"read-{name}", "namespace": "default"},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": [name]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"read-{name}", "namespace": "default"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"read-{name}"},
         "subjects": [{"kind": "ServiceAccount", "name": "metalmend-serve", "namespace": "metalmend-system"}]},
    ]  # fmt: skip
    for document in documents:
        client.create(codecs.from_dict(document))


async def test_credentials_are_not_sent_to_the_labs_cleartext_etcd(
    http: httpx.AsyncClient, site_lab: lab.RunningLab, site: siteetcd.SitePlan,
    database: Database, site_ref: str,
) -> None:  # fmt: skip
    """The lab's etcd listens on http: a design giving it credentials is refused before
    anything is sent (a cluster with credentials is reached over https only; the https
    case: tests/integration/test_serve_design_refs.py)."""
    secret_for_serve(site_lab, "etcd-root", "s3cret-root")
    url = stored(database, with_credentials(site, "default", "etcd-root"), "with-credentials")
    answer = await http.get(f"{PROMENADE}/etcd-cluster-health-statuses", params={"design_ref": url})
    [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Unable to access Etcd", True)
    assert "client URL(s) that are not https" in entry["detail"], entry
    assert "s3cret-root" not in answer.text
    without = await http.get(
        f"{PROMENADE}/etcd-cluster-health-statuses", params={"design_ref": site_ref}
    )
    [entry] = status_of(without, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Healthy", False), entry
