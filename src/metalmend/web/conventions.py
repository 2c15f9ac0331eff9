"""Airship's per-service conventions that every API of serve answers alike (Airship's API
conventions, https://airship-in-a-bottle.readthedocs.io, "Health Check API" and the
services' ``GET /versions``): ``GET /{service}/api/v1.0/health`` is 204 with no body and
``GET /{service}/versions`` names the one API version served. Neither needs a token (as
upstream, where both are unauthenticated) and neither says anything about the site."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

import yaml
from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import JSONResponse

VERSION = "v1.0"


def install(app: FastAPI, service: str, *, health: bool = True) -> None:
    """Mount health (unless the component's router already has it) and versions for
    ``service`` (promenade, deckhand, drydock, shipyard)."""
    router = APIRouter(tags=[service])
    api = f"/{service}/api/{VERSION}"

    if health:

        @router.get(
            f"{api}/health",
            status_code=204,
            response_class=Response,
            summary=f"Is {service}'s API up",
            description="204 No Content, no body, no token needed (Airship's convention).",
            responses={204: {"description": "the service answers requests"}},
        )
        async def healthy() -> Response:
            return Response(status_code=204)

    @router.get(
        f"/{service}/versions",
        summary=f"The API versions {service} serves",
        description="No token needed: the one version and its path, as upstream answers it.",
        responses={200: {"description": '{"v1.0": {"path": ..., "status": "stable"}}'}},
    )
    async def versions() -> JSONResponse:
        return JSONResponse({VERSION: {"path": api, "status": "stable"}})

    app.include_router(router)


# Shipyard writes ``code`` as falcon's status line ("409 Conflict"), on its failures and on
# the Status bodies it answers on success (configdocs, commitconfigdocs). The lines of the
# codes serve answers, spelt as falcon spells them; any other: Python's phrase.
STATUS_LINES = {
    200: "200 OK",
    201: "201 Created",
    202: "202 Accepted",
    400: "400 Bad Request",
    401: "401 Unauthorized",
    403: "403 Forbidden",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    409: "409 Conflict",
    413: "413 Payload Too Large",
    415: "415 Unsupported Media Type",
    429: "429 Too Many Requests",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


def status_line(code: int) -> str:
    """``409`` -> ``"409 Conflict"``, as Shipyard's ``code``."""
    found = STATUS_LINES.get(code)
    if found is not None:
        return found
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def shaped(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A Status body as the route's family writes it, the Status fields kept where they
    do not clash. Shipyard's routes: ``code`` as Shipyard's string (every Status body,
    success too, as Shipyard's own), and on a refusal Shipyard's ``details.errorType``
    (``ApiError`` for a refused request, ``AppError`` for a failure of its own, also at
    the top, where earlier versions of serve put it) and ``retry``. Drydock's routes, on
    a refusal: Drydock's ``type`` (``error``) and ``retry``. Every other route (Deckhand,
    Promenade, serve's own): the UCP Status body as it is, ``code`` a number, which
    metalmend's CLI and the other APIs' callers read. ``retry``: whether the same request
    may succeed later unchanged (429, 503)."""
    code = answer.get("code")
    if not isinstance(code, int):
        return answer
    retry = code in (429, 503)
    if path.startswith("/shipyard/"):
        shaped_answer = {**answer, "code": status_line(code)}
        if code >= 400:
            error_type = "ApiError" if code < 500 else "AppError"
            details = answer.get("details")
            shaped_answer["details"] = {
                **(details if isinstance(details, dict) else {}),
                "errorType": error_type,
            }
            shaped_answer |= {"errorType": error_type, "retry": retry}
        return shaped_answer
    if path.startswith("/drydock/") and code >= 400:
        return {**answer, "type": "error", "retry": retry}
    return answer


YAML = "application/x-yaml"
# The APIs whose refusals are YAML: Deckhand's, which answers every error as YAML
# (airshipit/deckhand ``deckhand/errors.py``, ``format_error_resp``: ``yaml.safe_dump``
# of the Status body; its functional tests expect ``application/x-yaml`` on a bucket
# conflict and on an illegal ``limit``). Shipyard's configdocs take and give YAML but
# Shipyard's errors are JSON, as every other API's.
YAML_ERRORS = ("/deckhand/",)


class YamlStatus(JSONResponse):
    """A Status body written as YAML (block style, keys in the body's order), for the APIs
    of ``YAML_ERRORS``. A ``JSONResponse`` to the application's handlers, which build
    every Status answer alike; only the bytes and the media type differ."""

    media_type = YAML

    def render(self, content: Any) -> bytes:
        return yaml.safe_dump(content, sort_keys=False, allow_unicode=True).encode("utf-8")


def status_answer(
    path: str, answer: dict[str, Any], code: int, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """The response carrying a Status body ``answer`` (already ``shaped``) for ``path``:
    YAML on Deckhand's API, JSON everywhere else."""
    kind = YamlStatus if path.startswith(YAML_ERRORS) else JSONResponse
    return kind(answer, status_code=code, headers=dict(headers or {}))
