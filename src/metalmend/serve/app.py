"""The application of ``metalmend serve``: every answer a UCP Status body (``status.py``),
whatever went wrong: an unknown path, a method a path does not take, a request FastAPI
could not read (400 BadRequest, where FastAPI would answer 422), a failure of our own.

One path needs no token: ``/healthz`` (200 ``ok`` while the process serves; probes use it,
it says nothing else). The OpenAPI document, ``/openapi.json``, is for authenticated
callers only (it maps every endpoint a caller could try); FastAPI's browsable pages
(``/docs``, ``/redoc``) are not served: they load scripts from a CDN, and a browser
cannot send a bearer token to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

import httpx2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from lightkube import ApiError, AsyncClient
from starlette.exceptions import HTTPException

from metalmend import __version__
from metalmend.db import Database, DatabaseUnavailable
from metalmend.designs import routes as deckhand
from metalmend.destroy import routes as drydock
from metalmend.errors import MetalmendError
from metalmend.kube import errors
from metalmend.log import fields
from metalmend.serve.root import Root, Services
from metalmend.siteactions import routes as shipyard
from metalmend.teardown import routes as promenade
from metalmend.teardown.drain import Drainer
from metalmend.teardown.etcd import routes as etcd
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.params import RequestRejected
from metalmend.teardown.shutdown import KubeletShutdown
from metalmend.web import auth, context, conventions, deps
from metalmend.web import metrics as webmetrics
from metalmend.web.auth import Gate
from metalmend.web.bodies import BodyLimits
from metalmend.web.status import Message, StatusError, body, reason_for, status_of

log = logging.getLogger(__name__)


def response(
    code: int,
    reason: str,
    message: str,
    messages: list[Message],
    headers: Mapping[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    """A Status body, as the route's family writes it (``web.conventions.shaped``:
    Shipyard's ``code`` string and error fields, Drydock's), the Status fields kept; YAML
    on Deckhand's API, as Deckhand's errors (``web.conventions.status_answer``)."""
    sent = dict(headers or {}) | ({"WWW-Authenticate": "Bearer"} if code == 401 else {})
    answer = conventions.shaped(path, body(code, reason, message, messages))
    return conventions.status_answer(path, answer, code, sent)


def create_app(root: Root) -> FastAPI:
    """The application over what the composition root built (``metalmend.serve.root``):
    its routers mounted, its services provided by type, its workers started and stopped
    by its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        root.start()  # the task worker (docs/destroy.md), the action worker (site-actions.md)
        yield
        await root.stop()

    app = FastAPI(
        title="metalmend",
        version=__version__,
        description="Airship's node-teardown API (Promenade) over this cluster:"
        " see docs/teardown.md; the site design revisions (Deckhand): see"
        " docs/design-store.md; destroy tasks (Drydock): docs/destroy.md; configdocs and"
        " site actions (Shipyard): docs/site-actions.md. Every answer is a UCP Status body.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _provide(app, root.services)
    app.include_router(promenade.router, prefix=promenade.PREFIX)
    app.include_router(etcd.router, prefix=promenade.PREFIX)  # remove-etcd, etcd health
    app.include_router(deckhand.router, prefix=deckhand.PREFIX)  # design revisions
    drydock.install(app, root.drydock)  # destroy_nodes tasks (docs/destroy.md)
    shipyard.install(app, root.shipyard)  # configdocs and site actions (site-actions.md)
    for service in ("shipyard", "deckhand", "drydock", "promenade"):  # health and versions
        conventions.install(app, service, health=service != "promenade")
    app.add_middleware(context.ContextMarker)  # X-Context-Marker: checked, echoed, logged
    app.add_middleware(webmetrics.Requests)  # /metrics: by API, route template, status

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request, credentials: auth.Credentials) -> JSONResponse:
        await auth.authenticate(request, credentials)
        return JSONResponse(app.openapi())

    @app.exception_handler(StatusError)
    async def status_error(request: Request, error: StatusError) -> JSONResponse:
        return response(
            error.code,
            error.reason,
            error.message,
            error.messages,
            error.headers,
            request.url.path,
        )

    @app.exception_handler(MetalmendError)
    async def domain_error(request: Request, error: MetalmendError) -> JSONResponse:
        return await status_error(request, status_of(error))

    @app.exception_handler(RequestRejected)
    async def rejected(request: Request, error: RequestRejected) -> JSONResponse:
        return response(
            400,
            error.reason,
            error.message,
            [Message(error.message, True)],
            None,
            request.url.path,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        lines = [
            f"{'.'.join(str(p) for p in problem.get('loc', ()))}: {problem.get('msg', '')}"
            for problem in error.errors()
        ]
        return response(
            400,
            "BadRequest",
            "the request cannot be read",
            [Message(x, True) for x in lines],
            None,
            request.url.path,
        )

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        if error.status_code == 404:
            text = f"no such endpoint: {request.method} {request.url.path}"
        elif error.status_code == 405:
            text = f"{request.url.path} does not take {request.method}"
        else:
            text = str(error.detail)
        return response(
            error.status_code, reason_for(error.status_code), text, [], None, request.url.path
        )

    @app.exception_handler(DatabaseUnavailable)
    async def database_unavailable(request: Request, error: DatabaseUnavailable) -> JSONResponse:
        # Every route's: one line for the caller, without the database's host, name, user
        # or path; the cause is logged once per outage by metalmend.db, not per request.
        text = error.message
        return response(
            503, "ServiceUnavailable", text, [Message(text, True)], None, request.url.path
        )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        text = f"the API server answered {errors.code(error)} {error.status.message}"
        log.warning("request failed: %s", text)
        return response(500, "InternalError", text, [Message(text, True)], None, request.url.path)

    @app.exception_handler(httpx2.HTTPError)
    async def unreachable(request: Request, error: httpx2.HTTPError) -> JSONResponse:
        text = f"cannot reach the API server: {error}"
        return response(
            503, "ServiceUnavailable", text, [Message(text, True)], None, request.url.path
        )

    @app.exception_handler(Exception)
    async def failure(request: Request, error: Exception) -> JSONResponse:
        # Logged with its traceback for the operator; the caller gets one line, no internals.
        # This handler runs outside the ContextMarker middleware: the marker is added here.
        marker = context.of(request.scope)
        log.exception(
            "request failed: %s %s", request.method, request.url.path,
            extra=fields(**{context.FIELD: marker}),
        )  # fmt: skip
        text = f"metalmend serve failed: {type(error).__name__}"
        answer = response(500, "InternalError", text, [Message(text, True)], None, request.url.path)
        if marker is not None:
            answer.headers[context.HEADER] = marker
        return answer

    return app


def _provide(app: FastAPI, services: Services) -> None:
    """What the routers reach by type (``metalmend.web.deps``)."""
    deps.provide(app, AsyncClient, services.client)
    deps.provide(app, Gate, services.gate)
    deps.provide(app, Drainer, services.drainer)
    deps.provide(app, KubeletShutdown, services.kubelet)
    deps.provide(app, Interlock, services.interlock)
    deps.provide(app, Database, services.database)
    deps.provide(app, BodyLimits, services.bodies)
    deps.provide(app, asyncio.Semaphore, services.design_gate)
    deps.provide(app, etcd.EtcdAccess, services.etcd_access)
