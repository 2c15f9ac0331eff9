"""Airship's API conventions in ``metalmend serve``: ``GET /promenade/api/v1.0/health``
(204, no token) and the ``X-Context-Marker`` header (checked, made when absent, echoed on
every answer, on every log line of its request). No API server is contacted by any of
these: the application points at an address where nothing listens."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from lightkube import AsyncClient, KubeConfig

from metalmend.log import FieldsFormatter
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from tests.unit.test_serve_app import assert_status

UNREACHABLE = "https://127.0.0.1:9"
HEALTH = "/promenade/api/v1.0/health"
DRAIN = "/promenade/api/v1.0/nodes/n1/drain"
MARKER = "X-Context-Marker"


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
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
        yield client


def generated(answer: httpx.Response) -> str:
    """The marker metalmend made for an answer: a random (version 4) UUID."""
    value = answer.headers[MARKER]
    assert uuid.UUID(value).version == 4
    return value


# ---- /health ---------------------------------------------------------------------------


async def test_health_is_204_no_content_without_a_token(http: httpx.AsyncClient) -> None:
    answer = await http.get(HEALTH)
    assert answer.status_code == 204
    assert answer.content == b""
    generated(answer)


async def test_health_is_documented_as_open_to_anyone(app: FastAPI) -> None:
    document = app.openapi()
    health = document["paths"][HEALTH]["get"]
    assert "204" in health["responses"]
    assert "security" not in health  # the steps name HTTPBearer; health asks for nothing


async def test_health_takes_only_get(http: httpx.AsyncClient) -> None:
    assert_status(await http.post(HEALTH), 405, "MethodNotAllowed")


# ---- X-Context-Marker ------------------------------------------------------------------


@pytest.mark.parametrize(
    "marker", ["6f1c2b3a-9d4e-4f5a-8b6c-7d8e9f0a1b2c", "6F1C2B3A-9D4E-1F5A-8B6C-7D8E9F0A1B2C"]
)
async def test_a_callers_marker_is_echoed_as_sent(http: httpx.AsyncClient, marker: str) -> None:
    answer = await http.get(HEALTH, headers={MARKER: marker})
    assert answer.status_code == 204
    assert answer.headers[MARKER] == marker


async def test_a_marker_is_echoed_on_refusals_too(http: httpx.AsyncClient) -> None:
    marker = str(uuid.uuid4())
    refused = await http.post(DRAIN, headers={MARKER: marker})
    assert_status(refused, 401, "Unauthorized")
    assert refused.headers[MARKER] == marker
    unknown = await http.get("/promenade/api/v1.0/nowhere", headers={MARKER: marker})
    assert_status(unknown, 404, "NotFound")
    assert unknown.headers[MARKER] == marker


async def test_without_a_marker_each_request_gets_its_own(http: httpx.AsyncClient) -> None:
    first = generated(await http.post(DRAIN))
    second = generated(await http.post(DRAIN))
    assert first != second


@pytest.mark.parametrize(
    "value",
    [
        "not-a-uuid",
        "6f1c2b3a9d4e4f5a8b6c7d8e9f0a1b2c",  # no hyphens
        "{6f1c2b3a-9d4e-4f5a-8b6c-7d8e9f0a1b2c}",
        "urn:uuid:6f1c2b3a-9d4e-4f5a-8b6c-7d8e9f0a1b2c",
        "6f1c2b3a9-d4e-4f5a-8b6c-7d8e9f0a1b2c",  # hyphens misplaced
        "6f1c2b3a-9d4e-4f5a-8b6c-7d8e9f0a1b2g",
        "",
        "x" * 5000,
    ],
)
async def test_a_marker_that_is_not_a_uuid_is_a_status_400(
    http: httpx.AsyncClient, value: str
) -> None:
    answer = await http.post(DRAIN, headers={MARKER: value})
    document = assert_status(answer, 400, "BadRequest")
    assert (
        document["message"] == "X-Context-Marker must be one UUID (8-4-4-4-12 hexadecimal digits)"
    )
    assert document["details"]["errorCount"] == 1
    if value:
        assert value not in answer.text  # whatever it was, it is not repeated back
    generated(answer)  # the refusal has a marker of its own, to find it in the log


async def test_two_markers_are_a_status_400(http: httpx.AsyncClient) -> None:
    headers = [(MARKER, str(uuid.uuid4())), (MARKER, str(uuid.uuid4()))]
    answer = await http.get(HEALTH, headers=headers)
    document = assert_status(answer, 400, "BadRequest")
    assert document["message"] == "X-Context-Marker given 2 times: give one UUID"


async def test_every_log_line_of_a_request_carries_its_marker(
    app: FastAPI, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    probe_log = logging.getLogger("metalmend.test.probe")

    @app.get("/probe")
    async def probe() -> None:
        probe_log.info("working")

    marker = str(uuid.uuid4())
    with caplog.at_level(logging.INFO):
        await http.get("/probe", headers={MARKER: marker})
        await http.get("/probe")
    lines = [FieldsFormatter().format(r) for r in caplog.records if r.name == probe_log.name]
    assert len(lines) == 2
    assert lines[0].endswith(f"working context_marker={marker}")
    assert "context_marker=" in lines[1]
    assert marker not in lines[1]


async def test_a_line_logged_outside_any_request_has_no_marker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        logging.getLogger("metalmend.test.probe").info("idle")
    assert "context_marker" not in FieldsFormatter().format(caplog.records[-1])


async def test_an_unexpected_failure_carries_the_marker_in_answer_and_log(
    app: FastAPI, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    marker = str(uuid.uuid4())
    with caplog.at_level(logging.ERROR):
        answer = await http.get("/boom", headers={MARKER: marker})
    assert_status(answer, 500, "InternalError")
    assert answer.headers[MARKER] == marker
    failed = [r for r in caplog.records if r.getMessage() == "request failed: GET /boom"]
    assert f"context_marker={marker}" in FieldsFormatter().format(failed[0])
