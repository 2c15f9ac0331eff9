"""What ``metalmend serve`` reports on its own /metrics (docs/observability.md): requests by
API, route template and status class; site actions and their steps; destroy tasks, the
nodes they destroy and their drive erases; teardown steps; the interlock's refusals; the
database's latency and errors.

Everything is here, in one module, so that the code it watches calls it with one line per
place (``servemetrics.action_finished(...)``), and serve's metrics go wherever that code
goes. /metrics is served on its own address (``serve.metrics_bind``, the chart's
``serve.metricsPort``), without the API's authentication: nothing in it names a node, a
host, a token, a user or a design. Every label has a fixed set of values: a route is its
template (``/promenade/api/v1.0/nodes/{node_id}/drain``, never the node), a status is its
class (``2xx``), an action or step one of the plans' names; anything else is ``other``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from sqlalchemy.exc import SQLAlchemyError

from metalmend.policy import destroy as destroy_policy

OTHER = "other"
UNMATCHED = "unmatched"  # no route: an unknown path (404) or a method a path does not take
APIS = ("promenade", "deckhand", "drydock", "shipyard")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
TEARDOWN_API = "promenade"
TEARDOWN_ROUTE = "/nodes/{node_id}/"  # promenade's node steps: drain, remove-etcd, ...

# Steps of site actions and teardown last from a second to hours (a drain, a redeploy's
# deploy_server); requests from milliseconds to a step's length.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
STEP_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
ERASE_BUCKETS = (10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)
DATABASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

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
ACTION_SECONDS = Histogram(
    "metalmend_serve_action_duration_seconds",
    "Site actions (Shipyard) that ended, by action and outcome (complete, failed), from"
    " their creation.",
    ["action", "outcome"],
    buckets=STEP_BUCKETS,
)
ACTION_STEP_SECONDS = Histogram(
    "metalmend_serve_action_step_duration_seconds",
    "Steps of site actions run by this process, by action, step and outcome (success;"
    " failed: the step failed or was stopped; interrupted: the process lost its lease, the"
    " database or was stopped, and the step is taken again from its record).",
    ["action", "step", "outcome"],
    buckets=STEP_BUCKETS,
)
TASKS_STARTED = Counter(
    "metalmend_serve_destroy_tasks_started_total",
    "Destroy tasks (Drydock's destroy_nodes) this process started or took up again.",
)
TASK_SECONDS = Histogram(
    "metalmend_serve_destroy_task_duration_seconds",
    "Destroy tasks that completed (every node finished, whatever its outcome), from their"
    " creation.",
    buckets=STEP_BUCKETS,
)
DESTROY_STEPS = Counter(
    "metalmend_serve_destroy_steps_entered_total",
    "Steps of a node's destroy entered (claim, power-off, wipe, release, done).",
    ["step"],
)
NODE_SECONDS = Histogram(
    "metalmend_serve_destroy_node_duration_seconds",
    "Nodes of destroy tasks that finished, by outcome (success, failure), from their first record.",
    ["outcome"],
    buckets=STEP_BUCKETS,
)
ERASES_STARTED = Counter(
    "metalmend_serve_drive_erases_started_total", "Drive erases requested of a BMC."
)
ERASE_SECONDS = Histogram(
    "metalmend_serve_drive_erase_duration_seconds",
    "Drive erases that ended, by outcome (erased: the BMC reported it finished; failed:"
    " refused, failed, or past destroy.erase_timeout), from their request.",
    ["outcome"],
    buckets=ERASE_BUCKETS,
)
ERASES_RUNNING = Gauge(
    "metalmend_serve_drive_erases_running",
    "Drive erases requested and not yet ended, of the destroys this process runs.",
)
ERASE_OLDEST = Gauge(
    "metalmend_serve_drive_erase_oldest_age_seconds",
    "Age of the oldest drive erase under way (0: none).",
)
REFUSALS = Counter(
    "metalmend_serve_interlock_refusals_total",
    "Teardown claims the interlock refused (a remediation holds the Node's host), by step.",
    ["step"],
)
DATABASE_SECONDS = Histogram(
    "metalmend_serve_database_duration_seconds",
    "Database transactions of serve's stores, by operation (read, write) and outcome (ok;"
    " error: the database failed or could not be reached; aborted: our own code ended the"
    " transaction with an error, rolled back).",
    ["operation", "outcome"],
    buckets=DATABASE_BUCKETS,
)

# What alerts watch (docs/runbooks.md) exists from the start at 0: increase() sees the first.
for _outcome in (str(destroy_policy.Outcome.SUCCESS), str(destroy_policy.Outcome.FAILURE)):
    NODE_SECONDS.labels(_outcome)
for _outcome in ("erased", "failed"):
    ERASE_SECONDS.labels(_outcome)
for _operation in ("read", "write"):
    DATABASE_SECONDS.labels(_operation, "error")


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


# ---- site actions (shipyard/worker.py) --------------------------------------------------


def action_finished(action: str, lifecycle: str, created: dt.datetime, now: dt.datetime) -> None:
    outcome = lifecycle.lower()
    ACTION_SECONDS.labels(action, outcome).observe(max((now - created).total_seconds(), 0.0))


async def timed_step(action: str, step: str, run: Any) -> bool:
    """Await ``run`` (a step to its end: True when it succeeded), timed by its outcome."""
    started = time.monotonic()
    ACTION_STEP_SECONDS.labels(action, step, "failed")  # at 0: increase() sees a first failure
    outcome = "interrupted"
    try:
        succeeded = bool(await run)
        outcome = "success" if succeeded else "failed"
        return succeeded
    finally:
        ACTION_STEP_SECONDS.labels(action, step, outcome).observe(time.monotonic() - started)


# ---- destroy tasks (serve/tasks.py, drydock/destroy.py) ---------------------------------


def task_started() -> None:
    TASKS_STARTED.inc()


def task_completed(created: dt.datetime, now: dt.datetime) -> None:
    TASK_SECONDS.observe(max((now - created).total_seconds(), 0.0))


def _age(since: dt.datetime | None, now: dt.datetime) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


Transition = tuple[str, str, float]
"""(what, label, seconds): ("step", step, 0), ("node", outcome, s), ("erase", outcome, s),
("erase-started", "", 0)."""


def destroy_transitions(
    before: destroy_policy.NodeState, after: destroy_policy.NodeState, now: dt.datetime
) -> list[Transition]:
    """What changed between two records of one node's destroy (pure)."""
    found: list[Transition] = []
    if after.step is not before.step:
        found.append(("step", str(after.step), 0.0))
    if after.finished and not before.finished:
        first = after.messages[0].ts if after.messages else None
        found.append(("node", str(after.outcome), _age(first, now)))
    erases = {d.id: d.erase for d in before.drives}
    ended = {destroy_policy.Erase.ERASED: "erased", destroy_policy.Erase.FAILED: "failed"}
    for drive in after.drives:
        was = erases.get(drive.id)
        if drive.erase is was:
            continue
        if drive.erase is destroy_policy.Erase.REQUESTED:
            found.append(("erase-started", "", 0.0))
        elif drive.erase in ended:
            found.append(("erase", ended[drive.erase], _age(drive.since, now)))
    return found


UNDER_WAY = (destroy_policy.Erase.REQUESTED, destroy_policy.Erase.RUNNING)
_seen: weakref.WeakKeyDictionary[Any, destroy_policy.NodeState] = weakref.WeakKeyDictionary()
_running: weakref.WeakKeyDictionary[Any, tuple[dt.datetime, ...]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()  # /metrics reads _running from its own thread


def destroy_seen(runner: Any, state: destroy_policy.NodeState, now: dt.datetime) -> None:
    """A node's destroy ``runner`` holds ``state`` now: count what changed since it was
    seen last (nothing the first time: a destroy taken up again after a restart is not
    counted twice), and keep its erases under way for the gauges (forgotten with the
    runner)."""
    with _lock:
        before = _seen.get(runner)
        _seen[runner] = state
        running = tuple(
            d.since for d in state.drives if d.erase in UNDER_WAY and d.since is not None
        )
        if running and not state.finished:
            _running[runner] = running
        else:
            _running.pop(runner, None)
    if before is None:
        return
    for what, label, seconds in destroy_transitions(before, state, now):
        if what == "step":
            DESTROY_STEPS.labels(label).inc()
        elif what == "node":
            NODE_SECONDS.labels(label).observe(seconds)
        elif what == "erase":
            ERASE_SECONDS.labels(label).observe(seconds)
        else:
            ERASES_STARTED.inc()


def _erases_running() -> float:
    with _lock:
        return float(sum(len(v) for v in _running.values()))


def _erase_oldest() -> float:
    now = dt.datetime.now(dt.UTC)
    with _lock:
        oldest = min((s for v in _running.values() for s in v), default=None)
    return _age(oldest, now)


ERASES_RUNNING.set_function(_erases_running)
ERASE_OLDEST.set_function(_erase_oldest)


# ---- the interlock (serve/interlock.py) and the database (db/database.py) ---------------


def interlock_refused(step: str) -> None:
    REFUSALS.labels(step).inc()


@contextlib.contextmanager
def transaction(writing: bool) -> Iterator[None]:
    """Time one database transaction by its outcome."""
    started = time.monotonic()
    outcome = "ok"
    try:
        yield
    except SQLAlchemyError:
        outcome = "error"
        raise
    except BaseException:
        outcome = "aborted"
        raise
    finally:
        operation = "write" if writing else "read"
        DATABASE_SECONDS.labels(operation, outcome).observe(time.monotonic() - started)


# ---- the listener ---------------------------------------------------------------------------


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
