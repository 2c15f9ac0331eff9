"""What ``metalmend serve``'s web layer reports (docs/observability.md): requests by API,
route template and status class, the node-teardown steps asked through them, and the
listener of serve's /metrics.

/metrics is served on its own address (``serve.metrics_bind``, the chart's
``serve.metricsPort``), without the API's authentication: nothing in it names a node, a
host, a token, a user or a design. Every label has a fixed set of values: a route is its
template (``/promenade/api/v1.0/nodes/{node_id}/drain``, never the node), a status is its
class (``2xx``); anything else is ``other``. Each component keeps its own metrics beside
its code (``siteactions.metrics``, ``destroy.metrics``, ``teardown.metrics``,
``db.metrics``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import Counter, Histogram, start_http_server

OTHER = "other"
UNMATCHED = "unmatched"  # no route: an unknown path (404) or a method a path does not take
APIS = ("promenade", "deckhand", "drydock", "shipyard")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
TEARDOWN_API = "promenade"
TEARDOWN_ROUTE = "/nodes/{node_id}/"  # promenade's node steps: drain, remove-etcd, ...

# Requests last from milliseconds to a step's length; teardown steps up to hours.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)

REQUESTS = Counter(
    "metalmend_serve_requests_total",
    "Requests answered, by API (promenade, deckhand, drydock, shipyard, health, other),"
    " route template, method and status class (2xx, 4xx, 5xx).",
    ["api", "route", "method", "status"],
)
REQUEST_SECONDS = Histogram(
    "metalmend_serve_request_duration_seconds",
    "Time from a request's arrival to the end of its answer, by API, route template and"
    " status class.",
    ["api", "route", "status"],
    buckets=REQUEST_BUCKETS,
)
TEARDOWN_STEP_SECONDS = Histogram(
    "metalmend_serve_teardown_step_duration_seconds",
    "Teardown steps asked of the node-teardown API (drain, clear-labels, shutdown-kubelet,"
    " remove-etcd, remove-from-cluster, decommission, ...), by step and outcome (success:"
    " 2xx; refused: 4xx, e.g. the interlock's 409; failed: 5xx).",
    ["step", "outcome"],
    buckets=STEP_BUCKETS,
)


def bounded(value: str, known: frozenset[str] | tuple[str, ...]) -> str:
    return value if value in known else OTHER


def status_class(code: int) -> str:
    return f"{code // 100}xx" if 100 <= code < 600 else OTHER


def route_labels(template: str | None) -> tuple[str, str]:
    """(api, route) of a request whose route template is ``template`` (None: no route)."""
    if template is None:
        return OTHER, UNMATCHED
    if template in ("/healthz", "/metrics"):
        return "health", template
    first = template.strip("/").split("/", 1)[0]
    return bounded(first, APIS), template


def teardown_step(api: str, route: str) -> str | None:
    """The teardown step a request asks (promenade's node routes), None for other routes."""
    if api != TEARDOWN_API or TEARDOWN_ROUTE not in route:
        return None
    return route.rsplit("/", 1)[-1]


def step_outcome(status: str) -> str:
    return {"2xx": "success", "4xx": "refused"}.get(status, "failed")


def observe_request(template: str | None, method: str, code: int, seconds: float) -> None:
    api, route = route_labels(template)
    status = status_class(code)
    REQUESTS.labels(api, route, bounded(method, METHODS), status).inc()
    REQUEST_SECONDS.labels(api, route, status).observe(seconds)
    step = teardown_step(api, route)
    if step is not None:
        TEARDOWN_STEP_SECONDS.labels(step, step_outcome(status)).observe(seconds)


class Requests:
    """ASGI middleware: each HTTP request counted and timed by its route template, read
    from the scope once the router has matched it (``scope["route"]``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        code = 500  # no answer started: the error handler outside answers 500

        async def sending(message: Mapping[str, Any]) -> None:
            nonlocal code
            if message.get("type") == "http.response.start":
                code = int(message.get("status", 500))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None)
            observe_request(
                template, str(scope.get("method", "")), code, time.monotonic() - started
            )


def listen(bind: str) -> Callable[[], None]:
    """Serve /metrics on ``bind`` (host:port; "": nowhere) in a thread; returns what stops
    it. OSError when the address cannot be bound."""
    if not bind:
        return lambda: None
    host, _, port = bind.rpartition(":")
    server, thread = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1")

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
