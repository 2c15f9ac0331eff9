"""``metalmend serve`` answers every request with a UCP Status body, whatever went wrong
before an endpoint ran: an unknown path, a wrong method, a request FastAPI cannot read
(400, not FastAPI's 422), no token. No API server is contacted by any of these."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI
from lightkube import AsyncClient, KubeConfig

from metalmend.serve.app import create_app
from metalmend.serve.root import compose

# Nothing listens there: a request that reached the API server would fail loudly.
UNREACHABLE = "https://127.0.0.1:9"


@pytest.fixture
def app() -> FastAPI:
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": UNREACHABLE}}],
        "users": [{"name": "u", "user": {"token": "unused"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    })  # fmt: skip
    return create_app(compose(AsyncClient(config)))


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
        yield client


def assert_status(answer: httpx.Response, code: int, reason: str) -> dict[str, Any]:
    """The Status body of ``answer``: YAML on Deckhand's API (as Deckhand's errors), JSON
    on every other."""
    assert answer.status_code == code
    document: dict[str, Any]
    if answer.request.url.path.startswith("/deckhand/"):
        assert answer.headers["content-type"] == "application/x-yaml"
        assert not answer.text.lstrip().startswith("{")  # YAML's block style, as Deckhand's
        document = yaml.safe_load(answer.text)
    else:
        assert answer.headers["content-type"] == "application/json"
        document = answer.json()
    assert set(document) == {
        "kind",
        "apiVersion",
        "metadata",
        "status",
        "message",
        "reason",
        "details",
        "code",
    }
    assert document["kind"] == "Status"
    assert document["apiVersion"] == "v1.0"
    assert document["metadata"] == {}
    assert document["status"] == ("Success" if code < 400 else "Failure")
    assert (document["code"], document["reason"]) == (code, reason)
    details = document["details"]
    assert details["errorCount"] == sum(1 for m in details["messageList"] if m["error"])
    return document


@pytest.mark.parametrize(
    ("method", "path", "headers", "code", "reason"),
    [
        ("GET", "/deckhand/api/v1.0/nowhere", {}, 404, "NotFound"),
        ("GET", "/deckhand/api/v1.0/revisions", {}, 401, "Unauthorized"),
        ("DELETE", "/deckhand/api/v1.0/buckets/a/documents", {}, 405, "MethodNotAllowed"),
        ("GET", "/deckhand/api/v1.0/revisions", {"X-Context-Marker": "x"}, 400, "BadRequest"),
        ("GET", "/deckhand/versions", {"X-Context-Marker": "x"}, 400, "BadRequest"),
    ],
    ids=["unknown-path", "no-token", "wrong-method", "bad-marker", "bad-marker-versions"],
)
async def test_deckhands_refusals_are_yaml_as_deckhands(
    http: httpx.AsyncClient,
    method: str,
    path: str,
    headers: dict[str, str],
    code: int,
    reason: str,
) -> None:
    """Issue 39, point 7: Deckhand answers its errors as YAML (``application/x-yaml``,
    its ``format_error_resp``); so does serve on Deckhand's API, whatever refused."""
    answer = await http.request(method, path, headers=headers)
    assert_status(answer, code, reason)


async def test_the_other_apis_refusals_stay_json(http: httpx.AsyncClient) -> None:
    for path in ("/shipyard/api/v1.0/nowhere", "/drydock/api/v1.0/nowhere", "/nowhere"):
        answer = await http.get(path)
        assert (answer.status_code, answer.headers["content-type"]) == (404, "application/json")


async def test_an_unknown_path_is_a_status_404(http: httpx.AsyncClient) -> None:
    answer = await http.get("/promenade/api/v1.0/nowhere")
    document = assert_status(answer, 404, "NotFound")
    assert document["message"] == "no such endpoint: GET /promenade/api/v1.0/nowhere"


@pytest.mark.parametrize(
    "step",
    [
        "drain", "clear-labels", "remove-etcd", "shutdown-kubelet", "remove-from-cluster",
        "decommission",
    ],
)  # fmt: skip
async def test_every_step_of_the_spec_is_mounted_and_asks_for_a_token_first(
    http: httpx.AsyncClient, step: str
) -> None:
    assert_status(await http.post(f"/promenade/api/v1.0/nodes/n1/{step}"), 401, "Unauthorized")


async def test_the_etcd_endpoints_ask_for_a_token_first(http: httpx.AsyncClient) -> None:
    answer = await http.get(
        "/promenade/api/v1.0/etcd-cluster-health-statuses?design_ref=https://d/x"
    )
    assert_status(answer, 401, "Unauthorized")
    assert_status(await http.post("/promenade/api/v1.0/nodes/n1/remove-etcd"), 401, "Unauthorized")


async def test_a_wrong_method_is_a_status_405(http: httpx.AsyncClient) -> None:
    answer = await http.get("/promenade/api/v1.0/nodes/n1/drain")
    document = assert_status(answer, 405, "MethodNotAllowed")
    assert document["message"] == "/promenade/api/v1.0/nodes/n1/drain does not take GET"


@pytest.mark.parametrize("header", [None, "Basic dXNlcjpwdw==", "Bearer "])
async def test_no_bearer_token_is_a_status_401(http: httpx.AsyncClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    answer = await http.post("/promenade/api/v1.0/nodes/n1/drain", headers=headers)
    document = assert_status(answer, 401, "Unauthorized")
    assert document["message"].startswith("Credentials are not established")
    assert answer.headers["www-authenticate"] == "Bearer"


async def test_a_request_fastapi_cannot_read_is_a_status_400(app: FastAPI) -> None:
    """FastAPI answers 422 with its own body; the Status convention says 400 BadRequest."""

    @app.get("/probe")
    async def probe(count: int) -> dict[str, int]:
        return {"count": count}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
        document = assert_status(await http.get("/probe?count=many"), 400, "BadRequest")
    assert document["details"]["errorCount"] == 1
    assert document["details"]["messageList"][0]["message"].startswith("query.count:")


async def test_an_unexpected_failure_is_a_status_500_without_internals(app: FastAPI) -> None:
    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
        answer = await http.get("/boom")
    document = assert_status(answer, 500, "InternalError")
    assert "secret internals" not in answer.text
    assert document["message"] == "metalmend serve failed: RuntimeError"


async def test_the_openapi_document_names_the_mounted_endpoints_and_bearer_auth(
    app: FastAPI,
) -> None:
    document = app.openapi()
    paths = set(document["paths"])
    assert {"/drydock/api/v1.0/tasks", "/drydock/api/v1.0/tasks/{task_id}"} <= paths
    assert {p for p in paths if p.startswith("/promenade/")} == {
        "/promenade/api/v1.0/health",
        "/promenade/api/v1.0/nodes/{node_id}/drain",
        "/promenade/api/v1.0/nodes/{node_id}/clear-labels",
        "/promenade/api/v1.0/nodes/{node_id}/remove-from-cluster",
        "/promenade/api/v1.0/nodes/{node_id}/shutdown-kubelet",
        "/promenade/api/v1.0/nodes/{node_id}/remove-etcd",
        "/promenade/api/v1.0/etcd-cluster-health-statuses",
        "/promenade/api/v1.0/nodes/{node_id}/decommission",
        "/promenade/versions",  # Airship's convention, as the other three services
    }
    for service in ("shipyard", "deckhand", "drydock"):
        assert {f"/{service}/api/v1.0/health", f"/{service}/versions"} <= paths
    drain = document["paths"]["/promenade/api/v1.0/nodes/{node_id}/drain"]["post"]
    assert {p["name"] for p in drain["parameters"]} == {"node_id", "timeout", "grace-period"}
    assert "HTTPBearer" in document["components"]["securitySchemes"]


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"])
async def test_the_api_description_is_for_authenticated_callers_only(
    http: httpx.AsyncClient, path: str
) -> None:
    """Issue 27, point 9: /docs, /redoc and /openapi.json answered anyone. The document
    asks for a token (checked like every endpoint's); the browsable pages are gone."""
    answer = await http.get(path)
    if path == "/openapi.json":
        assert_status(answer, 401, "Unauthorized")
    else:
        assert_status(answer, 404, "NotFound")


async def test_healthz_answers_ok_to_anyone_and_says_nothing_else(http: httpx.AsyncClient) -> None:
    answer = await http.get("/healthz")
    assert (answer.status_code, answer.text) == (200, "ok")
