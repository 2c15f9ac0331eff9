"""Drydock's task API under ``/drydock/api/v1.0`` (docs/destroy.md): ``POST /tasks`` with
``action: destroy_nodes``, ``GET /tasks``, ``GET /tasks/{task_id}``.

A task is stored before it is answered (201, Drydock's Task document) and run by the
task worker (``destroy.worker``), which survives restarts of the service and shares the work
among replicas on one database. Errors are UCP Status bodies, like every answer of
``metalmend serve`` (upstream Drydock's own error body is not).

Checks, in order: the token (401); the permission to create tasks (403); the request
(400: a field, the node filter); the permission to destroy each node (403, naming it);
no other task is destroying a node (409); each Node exists (404); no remediation holds a
node's host (409, as every teardown step: docs/teardown.md, "Teardown and remediation").
Then the task is stored, claiming its nodes in the same transaction (``TaskStore.create``:
of requests racing for one node, the database lets one through, the others get the 409):
nothing is changed in the cluster before the answer.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.destroy import model
from metalmend.destroy.model import Task
from metalmend.destroy.policy.destroy import NodeState, TaskStatus
from metalmend.destroy.store import NodesBusy, TaskStore
from metalmend.destroy.worker import TaskWorker
from metalmend.log import fields
from metalmend.policy import interlock as claims
from metalmend.teardown.interlock import Interlock
from metalmend.web import auth, context, deps
from metalmend.web.auth import caller_of
from metalmend.web.bodies import read_json
from metalmend.web.status import Message, StatusError, documented
from metalmend.web.status import errors as error_lines

log = logging.getLogger(__name__)

PREFIX = "/drydock/api/v1.0"
API_GROUP = "drydock.metalmend.dev"

# Permissions, on resources of drydock.metalmend.dev (deploy/rbac/serve.yaml).
CREATE_TASKS = auth.Permission("tasks", "", "create", API_GROUP)
LIST_TASKS = auth.Permission("tasks", "", "list", API_GROUP)
GET_TASK = auth.Permission("tasks", "", "get", API_GROUP)
DESTROY_NODE = auth.Permission("nodes", "destroy", "create", API_GROUP)

router = APIRouter(tags=["drydock"])


@dataclass
class Drydock:
    """The task store and its worker, one per application (``metalmend.serve.root``)."""

    store: TaskStore
    worker: TaskWorker
    interlock: Interlock
    clock: Clock = SYSTEM_CLOCK


def install(app: FastAPI, served: Drydock | None) -> None:
    """Serve the task API on ``app``; without its store and worker (built by
    ``metalmend.serve.root``: none without a database or a BMC pool) it answers 503."""
    app.include_router(router, prefix=PREFIX)
    deps.provide(app, Drydock, served)


def _drydock(request: Request) -> Drydock:
    served = deps.find(request.app, Drydock)
    if served is None:
        raise StatusError(
            503, "ServiceUnavailable",
            "the task store is not configured: metalmend serve runs without a database or"
            " BMC access (serve.database_url)",
        )  # fmt: skip
    return served


def _bad(problem: str) -> StatusError:
    return StatusError(400, "BadRequest", problem, error_lines(problem))


@router.post(
    "/tasks",
    status_code=201,
    summary="Create a task: destroy_nodes (power off, wipe, release the hosts)",
    description="Body: {action: destroy_nodes, design_ref, node_filter: {filter_set_type,"
    " filter_set: [{filter_type, node_names: [...]}]}, preserve-local-storage: false}."
    " 201 with the task (Drydock's Task); it runs in the background: GET /tasks/{task_id}.",
    responses=documented((201, "Task"), (404, "NotFound"), (409, "Conflict")),
    dependencies=[auth.Admit(CREATE_TASKS)],
)
async def create_task(request: Request) -> JSONResponse:
    served = _drydock(request)
    try:
        wanted = model.read_request(await read_json(request))
    except model.RequestProblem as problem:
        raise _bad(str(problem)) from None
    gate = deps.of(request, auth.Gate)
    for node in wanted.nodes:
        await gate.authorize(request.state.caller, DESTROY_NODE, node)
    by = caller_of(request)
    busy = await asyncio.to_thread(served.store.busy, wanted.nodes)
    if busy:  # one destroy per node at a time: two would race on its host
        raise _conflict(NodesBusy(busy))
    await _refuse_held(served, wanted.nodes, by)
    now = served.clock.now()
    task = Task(
        task_id=str(uuid.uuid4()), action=wanted.action, design_ref=wanted.design_ref,
        node_filter=wanted.node_filter, preserve_local_storage=wanted.preserve_local_storage,
        status=TaskStatus.REQUESTED, created=now, created_by=by, updated=now,
        context_marker=context.of(request.scope), nodes={n: NodeState() for n in wanted.nodes},
    )  # fmt: skip
    try:
        await asyncio.to_thread(served.store.create, task)
    except NodesBusy as raced:  # claimed by a request that raced this one
        raise _conflict(raced) from None
    served.worker.wake()
    log.info(
        "drydock: task created",
        extra=fields(task=task.task_id, nodes=",".join(wanted.nodes), by=by,
                     preserve=wanted.preserve_local_storage),
    )  # fmt: skip
    location = f"{PREFIX}/tasks/{task.task_id}"
    return JSONResponse(task.to_wire(), status_code=201, headers={"Location": location})


def _conflict(busy: NodesBusy) -> StatusError:
    return StatusError(409, "Conflict", busy.message, error_lines(*busy.lines))


async def _refuse_held(served: Drydock, nodes: tuple[str, ...], by: str) -> None:
    """404 for a Node that does not exist; 409 while a remediation holds a node's host
    (nothing is claimed yet: the task claims each host when it starts)."""
    refusals: list[str] = []
    for node in nodes:
        view, _ = await served.interlock.observe(node, "destroy", by)
        decision = claims.decide_claims(view, served.clock.now())
        if decision.refused:
            refusals.append(claims.refusal_message(node, decision.refusals))
    if refusals:
        raise StatusError(409, "Conflict", "; ".join(refusals), error_lines(*refusals))


@router.get(
    "/tasks",
    summary="List tasks, newest first",
    responses=documented((200, "list of Tasks")),
    dependencies=[auth.Admit(LIST_TASKS)],
)
async def list_tasks(request: Request) -> JSONResponse:
    served = _drydock(request)
    found = await asyncio.to_thread(served.store.newest)
    return JSONResponse([t.to_wire() for t in found])


@router.get(
    "/tasks/{task_id}",
    summary="One task: its status and result, per node",
    responses=documented((200, "Task"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_TASK, "task_id", limit=64)],
)
async def get_task(request: Request, task_id: str) -> JSONResponse:
    served = _drydock(request)
    found = await asyncio.to_thread(served.store.get, task_id) if len(task_id) <= 36 else None
    if found is None:
        text = f"no task {task_id[:64]!r}"
        raise StatusError(404, "NotFound", text, [Message(text, True)])
    return JSONResponse(found.to_wire())
