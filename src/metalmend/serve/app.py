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
from dataclasses import dataclass, field

import httpx2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from lightkube import ApiError, AsyncClient
from starlette.exceptions import HTTPException

from metalmend import __version__
from metalmend.clock import SYSTEM_CLOCK
from metalmend.db import Database, DatabaseUnavailable
from metalmend.designs import routes as deckhand
from metalmend.designs.store import DesignStore
from metalmend.destroy import routes as drydock
from metalmend.destroy.destroy import DrivePool
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.errors import MetalmendError
from metalmend.kube import errors, impersonate
from metalmend.kube.events import EventRecorder
from metalmend.log import fields
from metalmend.siteactions import routes as shipyard
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.siteactions.redeploy import FIELD_MANAGER
from metalmend.siteactions.steps import SiteServices
from metalmend.siteactions.store import ActionStore
from metalmend.siteactions.worker import ActionWorker
from metalmend.teardown import routes as promenade
from metalmend.teardown.drain import Drainer
from metalmend.teardown.etcd import routes as etcd
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.params import RequestRejected
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.shutdown import KubeletShutdown
from metalmend.web import auth, context, conventions, deps
from metalmend.web import metrics as webmetrics
from metalmend.web.auth import Gate
from metalmend.web.bodies import BodyLimits
from metalmend.web.status import Message, StatusError, body, reason_for, status_of

log = logging.getLogger(__name__)


@dataclass
class Services:
    """What the endpoints use, built once per application."""

    client: AsyncClient
    gate: Gate
    drainer: Drainer
    kubelet: KubeletShutdown
    interlock: Interlock  # the teardown claim on a Node's host (docs/design.md, invariant 7)
    # Design revisions, tasks (docs/design-store.md), upgraded before serving; None only
    # in tests of other endpoints: the store's endpoints then answer 503 (serve.database).
    database: Database | None = None
    bodies: BodyLimits = field(default_factory=BodyLimits)  # web.bodies
    design_gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))


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


def create_app(
    client: AsyncClient,
    teardown: TeardownSettings | None = None,
    *,
    database: Database | None = None,
    drives: DrivePool | None = None,
    destroy: DestroySettings | None = None,
    redeploy: RedeploySettings | None = None,
    site_namespaces: tuple[str, ...] = (),
    limits: auth.Limits | None = None,
    etcd_access: etcd.EtcdAccess | None = None,
    bodies: BodyLimits | None = None,
    site_label_prefixes: tuple[str, ...] = (),
) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        drydock.start(app)  # the task worker (docs/destroy.md)
        shipyard.start(app)  # the action worker (docs/site-actions.md)
        yield
        await shipyard.stop(app)
        await drydock.stop(app)

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
    teardown = teardown or TeardownSettings()
    app_services = Services(
        client=client,
        gate=Gate(client, limits),
        drainer=Drainer(client, teardown),
        kubelet=KubeletShutdown(client, teardown),
        interlock=Interlock(client),
        database=database,
        bodies=bodies or BodyLimits(),
    )
    _provide(app, app_services)
    # Allowed design URLs and etcd credentials Secrets (serve settings; none by default)
    deps.provide(app, etcd.EtcdAccess, etcd_access or etcd.EtcdAccess())
    app.include_router(promenade.router, prefix=promenade.PREFIX)
    app.include_router(etcd.router, prefix=promenade.PREFIX)  # remove-etcd, etcd health
    app.include_router(deckhand.router, prefix=deckhand.PREFIX)  # design revisions
    # destroy_nodes tasks: they need the database and the BMCs (their drives)
    interlock = app_services.interlock
    destroy = destroy or DestroySettings()
    drydock.install(app, client, interlock, database, drives, destroy)
    # Site actions (Shipyard): they need the database and the task worker (destroy).
    shipyard.install(
        app,
        _shipyard(
            app, app_services, teardown, destroy, redeploy, site_namespaces, site_label_prefixes
        ),
    )
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


def _shipyard(
    app: FastAPI,
    services: Services,
    teardown: TeardownSettings,
    destroy: DestroySettings,
    redeploy: RedeploySettings | None,
    namespaces: tuple[str, ...],
    label_prefixes: tuple[str, ...],
) -> shipyard.Shipyard | None:
    """The action store and worker, and what the steps are given (``siteactions.steps``)."""
    tasks = deps.find(app, drydock.Drydock)
    if services.database is None or tasks is None:
        return None
    steps = SiteServices(
        client=services.client, design_store=DesignStore(services.database),
        task_store=tasks.store, task_worker=tasks.worker, interlock=services.interlock,
        events=EventRecorder(services.client, component="metalmend-shipyard"),
        drainer=services.drainer, kubelet=services.kubelet, teardown=teardown,
        clock=SYSTEM_CLOCK, redeploy=redeploy or RedeploySettings(), site_namespaces=namespaces,
        etcd_credentials_secrets=etcd.access_of_app(app).etcd_credentials_secrets,
        site_label_prefixes=label_prefixes, gate=services.gate,
        impersonate=impersonate.impersonator(services.client, FIELD_MANAGER),
    )  # fmt: skip
    store = ActionStore(services.database)
    worker = ActionWorker(store, steps, destroy.lease_seconds)
    return shipyard.Shipyard(store, worker, namespaces, label_prefixes=label_prefixes)
