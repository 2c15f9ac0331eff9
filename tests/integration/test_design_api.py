"""The design revisions endpoints (Deckhand's API under /deckhand/api/v1.0) against the
real API server for authentication and authorization (the service's ServiceAccount and
the ClusterRoles of deploy/rbac/serve.yaml), on a SQLite file and on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import AsyncClient, Client, KubeConfig

from metalmend.db import Database
from metalmend.designs.store import DesignStore
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_serve_promenade import bearer, lines, serve_kubeconfig, status_of, token

__all__ = ["serve_kubeconfig"]  # a fixture this module uses

DECKHAND = "/deckhand/api/v1.0"
YAML = {"Content-Type": "application/x-yaml"}


def doc(name: str, value: object = 1, schema: str = "promenade/Node/v1", extra: str = "") -> str:
    return (
        f"---\nschema: {schema}\nmetadata: {{schema: metadata/Document/v1, name: {name}{extra}}}\n"
        f"data: {{value: {value}}}\n"
    )


@pytest.fixture
async def http(serve_kubeconfig: Path, database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    database = Database.open(database_url)
    database.upgrade()
    app = create_app(compose(client, database=database))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url=f"http://serve{DECKHAND}", timeout=60
    ) as h:
        yield h
    await client.close()
    database.dispose()


@pytest.fixture
def admin(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    return bearer(token(control_plane, kube, namespace, "design-admin", "metalmend-deckhand-admin"))


@pytest.fixture
def editor(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    return bearer(
        token(control_plane, kube, namespace, "design-editor", "metalmend-deckhand-editor")
    )


@pytest.fixture
def viewer(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    return bearer(
        token(control_plane, kube, namespace, "design-viewer", "metalmend-deckhand-viewer")
    )


async def put(
    http: httpx.AsyncClient, who: dict[str, str], bucket: str, body: str
) -> httpx.Response:
    return await http.put(f"/buckets/{bucket}/documents", content=body, headers={**who, **YAML})


def documents_of(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.headers["content-type"].startswith("application/x-yaml")
    return [d for d in yaml.safe_load_all(answer.text) if d is not None]


async def test_a_put_answers_the_bucket_as_yaml_and_an_unchanged_put_makes_no_revision(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    answer = await put(http, admin, "site", doc("a") + doc("b"))
    assert answer.status_code == 200
    assert answer.headers["X-Revision-Created"] == "true"
    found = documents_of(answer)
    assert [(d["metadata"]["name"], d["status"]) for d in found] == [
        ("a", {"bucket": "site", "revision": 1}), ("b", {"bucket": "site", "revision": 1}),
    ]  # fmt: skip
    again = await put(http, admin, "site", answer.text)  # what was answered goes back as is
    assert again.headers["X-Revision-Created"] == "false"
    listed = yaml.safe_load((await http.get("/revisions", headers=admin)).text)
    assert listed["count"] == 1
    assert listed["results"][0]["buckets"] == ["site"]


async def test_a_bad_body_is_400_naming_the_document_and_nothing_is_stored(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    body = (
        doc("a")
        + "---\nschema: promenade/Node/v1\nmetadata: {schema: metadata/Document/v1}\ndata: {}\n"
        + doc("a")
    )
    answer = await put(http, admin, "site", body)
    document = status_of(answer, 400, "BadRequest")
    assert "nothing stored" in document["message"]
    problems = lines(document)
    assert any(p.startswith("document 2 (line 6)") and "no metadata.name" in p for p in problems)
    assert any(p.startswith("document 3") and "is also document 1" in p for p in problems)
    malformed = status_of(await put(http, admin, "site", "schema: [oops\n"), 400, "BadRequest")
    assert "not valid YAML" in lines(malformed)[0]
    assert yaml.safe_load((await http.get("/revisions", headers=admin)).text)["count"] == 0


async def test_a_document_of_another_bucket_is_409(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    await put(http, admin, "global", doc("shared"))
    document = status_of(await put(http, admin, "site", doc("shared")), 409, "Conflict")
    assert "lives in bucket global" in lines(document)[0]
    assert document["message"] == (
        "Document [promenade/Node/v1, None] shared already exists in bucket: global"
    )
    # Emptied from its bucket, it may move to another (Deckhand's own test of this).
    assert (await put(http, admin, "global", "")).status_code == 200
    moved = documents_of(await put(http, admin, "site", doc("shared")))
    assert [d["status"] for d in moved] == [{"bucket": "site", "revision": 3}]


async def test_documents_and_rendered_documents_with_filters(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    await put(http, admin, "site", doc("n1", extra=", labels: {role: worker}")
              + doc("base", schema="promenade/Genesis/v1", extra=", layeringDefinition: {abstract: true, layer: global}")
              + doc("r1", schema="prometheus/Rule/v1"))  # fmt: skip

    async def names(kind: str, params: list[tuple[str, str]]) -> list[str]:
        answer = await http.get(f"/revisions/1/{kind}", params=params, headers=admin)
        assert answer.status_code == 200, answer.text
        return [d["metadata"]["name"] for d in documents_of(answer)]

    assert await names("documents", [("schema", "promenade")]) == ["base", "n1"]
    assert await names("documents", [("schema", "prom")]) == []
    assert await names("documents", [("metadata.label", "role=worker")]) == ["n1"]
    assert await names("documents", [("metadata.name", "r1")]) == ["r1"]
    assert await names("rendered-documents", [("status.bucket", "site")]) == ["n1", "r1"]
    assert await names("documents", [("status.bucket", "elsewhere")]) == []
    assert await names("documents", []) == await names("documents", [("sort", "status.bucket")])
    bad = await http.get("/revisions/1/documents", params={"schmea": "x"}, headers=admin)
    assert "unknown query parameter 'schmea'" in lines(status_of(bad, 400, "BadRequest"))[0]
    assert (await http.get("/revisions/0/documents", headers=admin)).text.strip() in ("", "[]")


# Deckhand's own functional tests (deckhand/tests/functional/gabbits/revision-documents/
# and revision/revision-filters.yaml) put a three-layer sample and query it; the same
# questions, asked here in our words of a sample of the same shape.
LAYERED = (
    "---\nschema: deckhand/LayeringPolicy/v1\n"
    "metadata: {schema: metadata/Control/v1, name: layering-policy}\n"
    "data: {layerOrder: [global, region, site]}\n"
    + doc("global-1234", schema="example/Kind/v1",
          extra=", labels: {key1: value1}, layeringDefinition: {abstract: true, layer: global}")
    + doc("region-1234", schema="example/Kind/v1",
          extra=", labels: {key1: value1}, layeringDefinition: {abstract: true, layer: region}")
    + doc("site-1234", schema="example/Kind/v1",
          extra=", labels: {foo: bar, baz: qux}, layeringDefinition: {abstract: false, layer: site}")
)  # fmt: skip


async def test_document_filters_as_deckhands_reference_and_code_read_them(
    http: httpx.AsyncClient, admin: dict[str, str], viewer: dict[str, str]
) -> None:
    """Asked by a viewer (get revisions), the narrowest role that reads documents."""
    assert (await put(http, admin, "mop", LAYERED)).status_code == 200

    async def names(params: list[tuple[str, str]]) -> list[str]:
        answer = await http.get("/revisions/1/documents", params=params, headers=viewer)
        assert answer.status_code == 200, answer.text
        return [d["metadata"]["name"] for d in documents_of(answer)]

    by_name = [("sort", "metadata.name")]
    layer, abstract = "metadata.layeringDefinition.layer", "metadata.layeringDefinition.abstract"
    # One filter repeated: any of its values (layer), all of them (labels).
    assert await names([(layer, "site"), (layer, "region"), *by_name]) == [
        "region-1234",
        "site-1234",
    ]
    assert await names([("metadata.label", "foo=bar"), ("metadata.label", "baz=qux")]) == [
        "site-1234"
    ]
    assert await names([("metadata.label", "foo=bar"), ("metadata.label", "key1=value1")]) == []
    # Several different filters together: all apply.
    assert await names([(layer, "site"), (abstract, "false")]) == ["site-1234"]
    assert await names([(layer, "region"), (abstract, "true")]) == ["region-1234"]
    assert await names([(layer, "site"), (abstract, "true")]) == []
    # Filters that must match nothing: 200, no document.
    for schema in ("exam", "example/Ki", "example/Kind/v2"):
        assert await names([("schema", schema)]) == []
    assert await names([("schema", "example"), *by_name]) == [
        "global-1234",
        "region-1234",
        "site-1234",
    ]
    # Sorting by several keys, then limit.
    sorted_twice = [("sort", "metadata.name"), ("sort", "schema")]
    assert await names([*sorted_twice, ("limit", "2")]) == ["global-1234", "layering-policy"]
    assert await names([*sorted_twice, ("order", "desc"), ("limit", "1")]) == ["site-1234"]
    assert await names([("limit", "0")]) == []
    # limit's illegal values: 400 naming the value (Deckhand: 400 for a non-integer).
    for bad in ("illegal", "-2", "1.5"):
        answer = await http.get("/revisions/1/documents", params={"limit": bad}, headers=viewer)
        problem = lines(status_of(answer, 400, "BadRequest"))[0]
        assert problem.startswith("limit is the number of documents")
        assert repr(bad) in problem
    twice = await http.get(
        "/revisions/1/documents", params=[("limit", "1"), ("limit", "2")], headers=viewer
    )
    assert "'limit' is given more than once" in lines(status_of(twice, 400, "BadRequest"))[0]


async def test_revision_list_tag_filters_sort_and_order_as_deckhand(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    for bucket in ("bucket_a", "bucket_b", "bucket_c"):
        await put(http, admin, bucket, doc(f"in-{bucket}"))
    for tag in ("foo", "bar"):
        assert (await http.post(f"/revisions/1/tags/{tag}", headers=admin)).status_code == 201
    await http.post("/revisions/3/tags/bar", headers=admin)

    async def listed(params: list[tuple[str, str]]) -> tuple[int, list[int]]:
        answer = await http.get("/revisions", params=params, headers=admin)
        assert answer.status_code == 200, answer.text
        found = yaml.safe_load(answer.text)
        return found["count"], [r["id"] for r in found["results"]]

    assert await listed([("tag", "foo")]) == (1, [1])
    assert await listed([("tag", "foo"), ("tag", "bar")]) == (2, [1, 3])  # any of them
    assert await listed([("tag", "baz")]) == (0, [])
    assert await listed([("sort", "id")]) == (3, [1, 2, 3])
    assert await listed([("sort", "id"), ("order", "desc")]) == (3, [3, 2, 1])
    assert await listed([("sort", "createdAt"), ("order", "desc"), ("tag", "bar")]) == (2, [3, 1])
    one = yaml.safe_load((await http.get("/revisions", params={"tag": "foo"}, headers=admin)).text)
    assert (one["results"][0]["buckets"], one["results"][0]["tags"]) == (
        ["bucket_a"],
        ["bar", "foo"],
    )
    for bad, problem in (
        ({"sort": "name"}, "sort revisions by id or createdAt, not 'name'"),
        ({"order": "up"}, "order is asc or desc, not 'up'"),
        ({"limit": "2"}, "unknown query parameter 'limit' (known: tag, sort, order)"),
    ):
        answer = await http.get("/revisions", params=bad, headers=admin)
        assert lines(status_of(answer, 400, "BadRequest")) == [problem]


async def test_tags_created_listed_read_replaced_and_deleted(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    await put(http, admin, "site", doc("a"))
    created = await http.post(
        "/revisions/1/tags/reviewed", content="by: alice\n", headers={**admin, **YAML}
    )
    assert (created.status_code, yaml.safe_load(created.text)) == (
        201,
        {"reviewed": {"by": "alice"}},
    )
    await http.post("/revisions/1/tags/reviewed", content="by: bob\n", headers={**admin, **YAML})
    await http.post("/revisions/1/tags/approved", headers=admin)
    listed = yaml.safe_load((await http.get("/revisions/1/tags", headers=admin)).text)
    assert listed == {"reviewed": {"by": "bob"}, "approved": {}}
    one = await http.get("/revisions/1/tags/reviewed", headers=admin)
    assert yaml.safe_load(one.text) == {"reviewed": {"by": "bob"}}
    revision = yaml.safe_load((await http.get("/revisions/1", headers=admin)).text)
    assert revision["tags"] == listed
    assert revision["url"].endswith(f"{DECKHAND}/revisions/1")
    tagged = yaml.safe_load(
        (await http.get("/revisions", params={"tag": "reviewed"}, headers=admin)).text
    )
    assert [r["id"] for r in tagged["results"]] == [1]
    assert (await http.delete("/revisions/1/tags/reviewed", headers=admin)).status_code == 204
    status_of(await http.get("/revisions/1/tags/reviewed", headers=admin), 404, "NotFound")
    assert (await http.delete("/revisions/1/tags", headers=admin)).status_code == 204
    assert yaml.safe_load((await http.get("/revisions/1/tags", headers=admin)).text) == {}
    bad = await http.post("/revisions/1/tags/x", content="- a list\n", headers={**admin, **YAML})
    status_of(bad, 400, "BadRequest")


async def test_shipyards_tags_are_not_set_or_removed_through_deckhand(
    http: httpx.AsyncClient, admin: dict[str, str], editor: dict[str, str], database_url: str
) -> None:
    # An editor may tag revisions, but not with the tags Shipyard's rules read: set by
    # hand, "committed" would commit past validation and "site-action-success" would be
    # the revision redeploy_server deploys by default.
    await put(http, admin, "site", doc("a"))
    for tag in ("committed", "rollback_commit", "site-action-success", "site-action-failure"):
        for who in (editor, admin):
            refused = status_of(
                await http.post(f"/revisions/1/tags/{tag}", headers=who), 403, "Forbidden"
            )
            assert f"tag(s) {tag} of revision 1 are Shipyard's" in refused["message"]
            gone = await http.delete(f"/revisions/1/tags/{tag}", headers=who)
            assert "cannot be removed" in status_of(gone, 403, "Forbidden")["message"]
    assert yaml.safe_load((await http.get("/revisions/1/tags", headers=admin)).text) == {}
    # Shipyard's own commit tagged it: Deckhand's "remove every tag" leaves it alone
    database = Database.open(database_url)
    DesignStore(database).tag(1, "committed", {})
    database.dispose()
    await http.post("/revisions/1/tags/reviewed", headers=editor)
    every = await http.delete("/revisions/1/tags", headers=editor)
    assert "committed" in status_of(every, 403, "Forbidden")["message"]
    assert set(yaml.safe_load((await http.get("/revisions/1/tags", headers=admin)).text)) == {
        "committed", "reviewed"
    }  # fmt: skip


async def test_diff_rollback_and_deleting_every_revision(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    await put(http, admin, "site", doc("a"))
    await put(http, admin, "global", doc("g"))
    await put(http, admin, "site", doc("a", value=2))
    diff = yaml.safe_load((await http.get("/revisions/3/diff/1", headers=admin)).text)
    assert diff == {"global": "created", "site": "modified"}
    assert yaml.safe_load((await http.get("/revisions/0/diff/1", headers=admin)).text) == {
        "site": "created"
    }
    rolled = await http.post("/rollback/1", headers=admin)
    assert (rolled.status_code, yaml.safe_load(rolled.text)["id"]) == (201, 4)
    assert yaml.safe_load((await http.get("/revisions/1/diff/4", headers=admin)).text) == {
        "site": "unmodified"
    }
    assert (await http.delete("/revisions", headers=admin)).status_code == 204
    assert yaml.safe_load((await http.get("/revisions", headers=admin)).text) == {
        "count": 0,
        "results": [],
    }
    status_of(await http.get("/revisions/1", headers=admin), 404, "NotFound")


async def test_unknown_or_malformed_revisions(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    assert (
        "revision 9 not found"
        in status_of(await http.get("/revisions/9", headers=admin), 404, "NotFound")["message"]
    )
    status_of(await http.get("/revisions/abc/documents", headers=admin), 400, "BadRequest")
    status_of(await put(http, admin, "bad%20name", doc("a")), 400, "BadRequest")
    status_of(await http.get("/revisions/99999999999", headers=admin), 404, "NotFound")
    status_of(await http.get("/revisions/\u0663", headers=admin), 400, "BadRequest")


async def test_callers_need_a_token_and_the_permission(
    http: httpx.AsyncClient, admin: dict[str, str], viewer: dict[str, str]
) -> None:
    status_of(await http.get("/revisions"), 401, "Unauthorized")
    await put(http, admin, "site", doc("a"))
    refused = status_of(await put(http, viewer, "site", doc("b")), 403, "Forbidden")
    assert "update buckets/documents (deckhand.metalmend.dev) on site" in refused["message"]
    assert (await http.get("/revisions/1/documents", headers=viewer)).status_code == 200
    status_of(await http.post("/revisions/1/tags/committed", headers=viewer), 403, "Forbidden")
    status_of(await http.delete("/revisions", headers=viewer), 403, "Forbidden")


async def test_a_database_that_is_down_is_503_without_its_password(
    serve_kubeconfig: Path, admin: dict[str, str]
) -> None:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    database = Database.open("postgresql+psycopg://design:hunter2@127.0.0.1:1/design")
    transport = httpx.ASGITransport(app=create_app(compose(client, database=database)))
    async with httpx.AsyncClient(transport=transport, base_url=f"http://serve{DECKHAND}") as h:
        answer = await h.get("/revisions", headers=admin)
    await client.close()
    document = status_of(answer, 503, "ServiceUnavailable")
    assert "hunter2" not in answer.text
    assert "is unavailable" in document["message"]


# ---- Deckhand's own functional tests (airshipit/deckhand, deckhand/tests/functional/gabbits)
# The last differences from them (issue 39, point 7): each test names its gabbit.

THREE_LAYERS = """\
---
schema: deckhand/LayeringPolicy/v1
metadata: {schema: metadata/Control/v1, name: layering-policy}
data: {layerOrder: [global, region, site]}
---
schema: example/Kind/v1
metadata:
  schema: metadata/Document/v1
  name: global-1234
  storagePolicy: cleartext
  labels: {key1: value1}
  layeringDefinition: {abstract: true, layer: global}
data: {a: {x: 1, y: 2}}
---
schema: example/Kind/v1
metadata:
  schema: metadata/Document/v1
  name: region-1234
  storagePolicy: cleartext
  labels: {key1: value1}
  layeringDefinition: {abstract: true, layer: region, parentSelector: {key1: value1}}
data: {a: {z: 3}}
---
schema: example/Kind/v1
metadata:
  schema: metadata/Document/v1
  name: site-1234
  labels: {foo: bar, baz: qux}
  layeringDefinition: {layer: site, parentSelector: {key1: value1}}
data: {b: 4}
"""  # the sample design-doc-layering-sample-3-layers.yaml, site-1234's storagePolicy left out


async def test_refusals_are_yaml_as_deckhands(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    """document-crud-error-bucket-conflict (409 on a put) and
    revision-documents-filters-negative (``limit=illegal``, 400): ``application/x-yaml``,
    a Status body written as YAML (Deckhand's ``format_error_resp``)."""
    assert documents_of(await put(http, admin, "a", THREE_LAYERS))
    conflict = await put(http, admin, "b", THREE_LAYERS)
    assert conflict.headers["content-type"] == "application/x-yaml"
    assert not conflict.text.startswith("{")
    assert "already exists in bucket: a" in status_of(conflict, 409, "Conflict")["message"]
    illegal = await http.get("/revisions/1/documents", params={"limit": "illegal"}, headers=admin)
    assert illegal.headers["content-type"] == "application/x-yaml"
    assert "'illegal'" in lines(status_of(illegal, 400, "BadRequest"))[0]


async def test_documents_are_answered_with_deckhands_metadata_defaults(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    """revision-documents-multiple-filters: different filters all apply (layer=site and
    abstract=false is site-1234 alone), one repeated matches any of its values, labels
    repeated must all match; and site-1234, put without ``abstract`` or
    ``storagePolicy``, is stored and answered with Deckhand's defaults (``abstract: false``,
    ``storagePolicy: cleartext``), as Deckhand stores every document."""
    revision = documents_of(await put(http, admin, "mop", THREE_LAYERS))[0]["status"]["revision"]

    async def found(params: list[tuple[str, str]]) -> list[dict[str, Any]]:
        answer = await http.get(f"/revisions/{revision}/documents", params=params, headers=admin)
        return documents_of(answer)

    layer, abstract = "metadata.layeringDefinition.layer", "metadata.layeringDefinition.abstract"
    site = await found([(layer, "site"), (abstract, "false")])
    assert [d["metadata"]["name"] for d in site] == ["site-1234"]
    assert site[0]["metadata"]["layeringDefinition"] == {
        "layer": "site", "parentSelector": {"key1": "value1"}, "abstract": False,
    }  # fmt: skip
    assert site[0]["metadata"]["storagePolicy"] == "cleartext"
    region = await found([(layer, "region"), (abstract, "True")])  # gabbi writes True
    assert [d["metadata"]["name"] for d in region] == ["region-1234"]
    both = await found([(layer, "site"), (layer, "region")])
    assert sorted(d["metadata"]["name"] for d in both) == ["region-1234", "site-1234"]
    labelled = await found([("metadata.label", "foo=bar"), ("metadata.label", "baz=qux")])
    assert [d["metadata"]["name"] for d in labelled] == ["site-1234"]
    policy = (await found([("schema", "deckhand/LayeringPolicy")]))[0]["metadata"]
    assert (policy["storagePolicy"], policy["layeringDefinition"]) == (
        "cleartext",
        {"abstract": False},
    )
    # Filled in at the put, as Deckhand: the same put again, or its answer put back,
    # changes nothing.
    again = await put(http, admin, "mop", THREE_LAYERS)
    assert again.headers["X-Revision-Created"] == "false"
    echoed = await put(http, admin, "mop", again.text)
    assert echoed.headers["X-Revision-Created"] == "false"
    rendered = await http.get(f"/revisions/{revision}/rendered-documents", headers=admin)
    names = {d["metadata"]["name"]: d["metadata"] for d in documents_of(rendered)}
    assert set(names) == {"layering-policy", "site-1234"}
    assert names["site-1234"]["layeringDefinition"]["abstract"] is False


async def test_revision_numbers_go_on_after_deleting_every_revision(
    http: httpx.AsyncClient, admin: dict[str, str]
) -> None:
    """revision-filters (sort by id) expects 1, 2, 3 after ``DELETE /revisions``:
    Deckhand restarts its numbering (``TRUNCATE ... RESTART IDENTITY``). Here numbers are
    never reused (docs/design-store.md, "Deviations"): a design reference to revision 2
    taken before the purge, held by a Drydock task, a Shipyard action or a caller, must
    not name other documents after it. It answers 404; the next put is 4."""
    for bucket in ("bucket_a", "bucket_b", "bucket_c"):
        await put(http, admin, bucket, doc(bucket))
    assert (await http.delete("/revisions", headers=admin)).status_code == 204
    for bucket in ("bucket_a", "bucket_b", "bucket_c"):
        await put(http, admin, bucket, doc(f"{bucket}-2"))
    listed = yaml.safe_load(
        (await http.get("/revisions", params={"sort": "id"}, headers=admin)).text
    )
    assert [r["id"] for r in listed["results"]] == [4, 5, 6]
    status_of(await http.get("/revisions/2/documents", headers=admin), 404, "NotFound")
