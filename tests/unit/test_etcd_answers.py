"""What the etcd client and the design reader make of hostile or broken input: answers
are capped, deadlines hold, fields are checked, and every problem is a message naming it
(metalmend.teardown.etcd.client, metalmend.teardown.etcd.design; docs/teardown.md)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from metalmend.teardown.etcd import access, design
from metalmend.teardown.etcd import client as etcd

pytestmark = pytest.mark.unit

ENDPOINT = "http://etcd:2379"


def answering(handler: object) -> etcd.EtcdClient:
    transport = httpx.MockTransport(handler)  # type: ignore[arg-type]
    return etcd.EtcdClient(httpx.AsyncClient(transport=transport), deadline=0.5)


async def test_member_ids_are_read_from_the_gateways_decimal_strings() -> None:
    body = {"members": [
        {"ID": "11518302943782432259", "name": "a", "peerURLs": ["http://a:2380"], "clientURLs": ["http://a:2379"]},
        {"ID": "42", "peerURLs": ["http://b:2380"], "isLearner": True},
    ]}  # fmt: skip
    client = answering(lambda request: httpx.Response(200, json=body))
    listed = await client.member_list(ENDPOINT)
    assert listed == [
        etcd.Member(11518302943782432259, "a", ("http://a:2380",), ("http://a:2379",)),
        etcd.Member(42, "", ("http://b:2380",), (), is_learner=True),
    ]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(httpx.Response(200, content=b"<html>"), id="not JSON"),
        pytest.param(httpx.Response(200, json=[1, 2]), id="not an object"),
        pytest.param(httpx.Response(200, json={"members": {"x": 1}}), id="members not a list"),
        pytest.param(httpx.Response(200, json={"members": [{"ID": "-1"}]}), id="negative id"),
        pytest.param(httpx.Response(200, json={"members": [{"ID": True}]}), id="id a boolean"),
        pytest.param(
            httpx.Response(200, json={"members": [{"ID": "1", "peerURLs": "x"}]}),
            id="urls not a list",
        ),
        pytest.param(
            httpx.Response(200, content=b" " * (etcd.MAX_ANSWER + 10)), id="larger than the cap"
        ),
    ],
)
async def test_an_answer_that_is_not_etcds_is_invalid(answer: httpx.Response) -> None:
    with pytest.raises(etcd.EtcdInvalid):
        await answering(lambda request: answer).member_list(ENDPOINT)


async def test_an_endpoint_that_never_answers_costs_the_deadline_and_no_more() -> None:
    async def silent(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        raise AssertionError("unreachable")

    began = time.monotonic()
    with pytest.raises(etcd.EtcdUnreachable, match=r"within 0\.5s"):
        await answering(silent).status(ENDPOINT)
    assert time.monotonic() - began < 2


@pytest.mark.parametrize(
    ("status", "message", "retryable"),
    [
        (503, "etcdserver: unhealthy cluster", True),
        (400, "etcdserver: re-configuration failed due to not enough started members", False),
        (400, "etcdserver: not leader", True),
        (404, "etcdserver: member not found", False),
    ],
)
async def test_etcds_refusals_say_whether_asking_again_may_work(
    status: int, message: str, retryable: bool
) -> None:
    client = answering(lambda request: httpx.Response(status, json={"code": 9, "message": message}))
    with pytest.raises(etcd.EtcdRefused) as refused:
        await client.member_remove(ENDPOINT, 7)
    assert refused.value.retryable is retryable
    assert refused.value.text == message


async def test_an_error_answer_that_is_not_etcds_is_not_shown() -> None:
    """An endpoint a design names may be any server: its answer is not the caller's."""
    inside = answering(lambda r: httpx.Response(403, text="internal: admin-token=abc"))
    with pytest.raises(etcd.EtcdRefused) as refused:
        await inside.member_list(ENDPOINT)
    assert "admin-token" not in str(refused.value)
    assert "an answer that is not etcd's (not shown)" in str(refused.value)


async def test_a_client_with_credentials_contacts_no_http_endpoint() -> None:
    asked: list[str] = []
    client = answering(lambda r: asked.append(str(r.url)) or httpx.Response(200, json={}))
    client.secure_only = True
    with pytest.raises(etcd.EtcdUnreachable, match="credentials are sent over https only"):
        await client.authenticate(ENDPOINT, "root", "pw")
    client.secure_only, client.headers["Authorization"] = False, "token"
    with pytest.raises(etcd.EtcdUnreachable, match="not contacted"):
        await client.health(ENDPOINT)
    assert asked == []


async def test_health_reads_etcds_answer_and_nothing_else() -> None:
    healthy = answering(lambda r: httpx.Response(200, json={"health": "true", "reason": ""}))
    assert (await healthy.health(ENDPOINT)).healthy
    sick = answering(
        lambda r: httpx.Response(503, json={"health": "false", "reason": "RAFT NO LEADER"})
    )
    assert await sick.health(ENDPOINT) == etcd.EndpointHealth(ENDPOINT, False, "RAFT NO LEADER")
    with pytest.raises(etcd.EtcdInvalid):
        await answering(lambda r: httpx.Response(200, text="ok")).health(ENDPOINT)


# ---- the design ------------------------------------------------------------------------------

GOOD = """
schema: promenade/Genesis/v1
metadata: {name: genesis}
data: {}
---
schema: promenade/EtcdClusters/v1
metadata: {schema: metadata/Document/v1, name: etcd-clusters}
data:
  clusters:
    - name: kubernetes
      minimum_functionality: {healthy_members: 2}
      credentials: {secret: {namespace: kube-system, name: etcd-client}}
      members:
        - {node: n1, client_urls: ["https://10.0.0.1:2379/"], peer_urls: ["https://10.0.0.1:2380"]}
        - {node: n2, name: etcd-n2, client_urls: ["https://10.0.0.2:2379"]}
        - {node: n3, client_urls: ["https://10.0.0.3:2379"]}
"""


def test_a_design_declares_clusters_members_threshold_and_credentials() -> None:
    [cluster] = design.parse(GOOD, "test").clusters
    assert (cluster.name, cluster.threshold) == ("kubernetes", 2)
    assert cluster.credentials == design.SecretRef("kube-system", "etcd-client")
    assert cluster.member_on("n1") == design.MemberDesign(
        "n1", "n1", ("https://10.0.0.1:2379",), ("https://10.0.0.1:2380",)
    )
    assert cluster.member_on("n2").name == "etcd-n2"  # type: ignore[union-attr]
    assert cluster.member_on("n9") is None


BAD = [
    pytest.param("a: [", "not valid YAML", id="not YAML"),
    pytest.param(
        "!!python/object/apply:os.system ['true']", "not valid YAML", id="no object construction"
    ),
    pytest.param("[" * 32_000 + "]" * 32_000, "nested deeper than 100 levels", id="nesting bomb"),
    pytest.param(
        "schema: x/Y/v1\n", "has no promenade/EtcdClusters/v1 document", id="no EtcdClusters"
    ),
    pytest.param(
        GOOD.replace("healthy_members: 2", "healthy_members: 4"),
        "between 1 and the number of members (3), not 4",
        id="threshold above the members",
    ),
    pytest.param(
        GOOD.replace("healthy_members: 2", "healthy_members: two"),
        "healthy_members must be a whole number",
        id="threshold not a number",
    ),
    pytest.param(
        GOOD.replace("node: n3", "node: n2"),
        "node(s) with two members: n2",
        id="two members on one node",
    ),
    pytest.param(
        GOOD.replace("https://10.0.0.3:2379", "ftp://x"),
        "'ftp://x' is not an http(s) URL",
        id="not an http URL",
    ),
    pytest.param(
        GOOD.replace("{secret: {namespace: kube-system, name: etcd-client}}", "hunter2"),
        "credentials must be",
        id="credentials inline",
    ),
]


@pytest.mark.parametrize(("text", "says"), BAD)
def test_a_bad_design_is_refused_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(design.DesignError) as refused:
        design.parse(text, "test")
    assert says in refused.value.message
    assert not refused.value.unavailable


# ---- credentials from a Secret -----------------------------------------------------------

REF = design.SecretRef("kube-system", "etcd-client")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param(
            {"username": b"root"}, "both username and password", id="user without password"
        ),
        pytest.param({"tls.crt": b"x"}, "both tls.crt and tls.key", id="certificate without key"),
        pytest.param(
            {"username": b"\xff", "password": b"p"}, "username is not UTF-8", id="not text"
        ),
    ],
)
def test_credentials_that_cannot_work_are_refused_naming_the_secret(
    data: dict[str, bytes], says: str
) -> None:
    with pytest.raises(access.CredentialsRefused, match="kube-system/etcd-client") as refused:
        access.Credentials.from_secret(REF, data)
    assert says in str(refused.value)


def test_a_ca_that_is_not_pem_is_refused_without_its_content() -> None:
    credentials = access.Credentials.from_secret(REF, {"ca.crt": b"hunter2-not-a-certificate"})
    with pytest.raises(access.CredentialsRefused) as refused:
        credentials.tls("etcd cluster k")
    assert "hunter2" not in str(refused.value)
    assert "hunter2" not in repr(credentials)
