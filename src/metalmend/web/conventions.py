"""Airship's per-service conventions that every API of serve answers alike (Airship's API
conventions, https://airship-in-a-bottle.readthedocs.io, "Health Check API" and the
services' ``GET /versions``): ``GET /{service}/api/v1.0/health`` is 204 with no body and
``GET /{service}/versions`` names the one API version served. Neither needs a token (as
upstream, where both are unauthenticated) and neither says anything about the site."""

from __future__ import annotations

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


def error_fields(path: str, code: int) -> dict[str, object]:
    """What Shipyard's and Drydock's own error bodies carry beyond the Status fields, for
    a refusal on their routes: Shipyard's ``errorType`` (its ``ApiError`` for a refused
    request, ``AppError`` for a failure of its own) and ``retry``; Drydock's ``type``
    (``error``) and ``retry``. ``retry``: whether the same request may succeed later
    unchanged (429, 503). Nothing for other routes or for success."""
    if code < 400:
        return {}
    retry = code in (429, 503)
    if path.startswith("/shipyard/"):
        return {"errorType": "ApiError" if code < 500 else "AppError", "retry": retry}
    if path.startswith("/drydock/"):
        return {"type": "error", "retry": retry}
    return {}
