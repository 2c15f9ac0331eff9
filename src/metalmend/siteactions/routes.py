"""Shipyard's API under ``/shipyard/api/v1.0`` (docs/site-actions.md): configdocs (a
buffer over the design store, committed, read and compared by version) and actions
(stored, run by ``metalmend.siteactions.worker``). Shipyard's API reference:
https://airship-shipyard.readthedocs.io/en/latest/API.html.

The router reads requests, asks permissions and answers; what configdocs and the admission
of an action are (the buffer and its writers, validation, the committed revision and the
guard, the action as created) is ``metalmend.siteactions.configdocs``.

Configdocs answer YAML as Shipyard does; everything else JSON; errors are Status bodies.
Each endpoint's permission is a verb on a resource of ``shipyard.metalmend.dev``
(deploy/rbac/serve.yaml); creating an action is ``create actions`` on the action's NAME,
so RBAC ``resourceNames`` can let an operator redeploy servers without deploying sites.
A redeploy_server is also ``create nodes/redeploy`` on each target node (checked again
when the action starts), and a commit with ``force=true`` is ``create
configdocs/commit-force``. The action keeps who created it: its design is applied as
that caller (docs/site-actions.md, "Whose permissions apply a design").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from lightkube import AsyncClient

from metalmend.api.resources import BareMetalHost
from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.designs import documents
from metalmend.designs.access import checked_name, documents_answer, run
from metalmend.designs.documents import DocumentsRejected
from metalmend.designs.store import DesignStore
from metalmend.errors import NotFound, Refused, ValidationMessage
from metalmend.log import fields
from metalmend.siteactions import configdocs, model, redeploy
from metalmend.siteactions.policy import actions as siteactions
from metalmend.siteactions.policy import statuses
from metalmend.siteactions.policy.actions import ActionName, Version
from metalmend.siteactions.store import ActionStore
from metalmend.siteactions.worker import ActionWorker
from metalmend.web import auth, bodies, context, conventions, deps, status
from metalmend.web.status import Message, StatusError, documented, errors, notes

log = logging.getLogger(__name__)

PREFIX = "/shipyard/api/v1.0"
GROUP = "shipyard.metalmend.dev"

CREATE_CONFIGDOCS = auth.Permission("configdocs", "", "create", GROUP)
GET_CONFIGDOCS = auth.Permission("configdocs", "", "get", GROUP)
LIST_CONFIGDOCS = auth.Permission("configdocs", "", "list", GROUP)
COMMIT_CONFIGDOCS = auth.Permission("configdocs", "commit", "create", GROUP)
GET_RENDERED = auth.Permission("renderedconfigdocs", "", "get", GROUP)
CREATE_ACTION = auth.Permission("actions", "", "create", GROUP)
LIST_ACTIONS = auth.Permission("actions", "", "list", GROUP)
GET_ACTION = auth.Permission("actions", "", "get", GROUP)
CONTROL_ACTION = auth.Permission("actions", "control", "create", GROUP)
GET_STEP_LOGS = auth.Permission("actions", "logs", "get", GROUP)
GET_SITE_STATUSES = auth.Permission("sitestatuses", "", "get", GROUP)
# A commit past validation: its own permission, since it lets a design no action would
# accept be committed (and redeploy_server's default revision be one).
FORCE_COMMIT = auth.Permission("configdocs", "commit-force", "create", GROUP)
# redeploy_server wipes the target's drives (destroy) and stops its kubelet (decommission):
# per node, as Drydock's nodes/destroy and Promenade's per-node permissions are
# (siteactions.redeploy asks it again when the action starts).
REDEPLOY_NODE = redeploy.REDEPLOY_NODE

VERSION_QUERY = "Query: version=buffer (default)|committed|last_site_action|successful_site_action."
router = APIRouter(tags=["shipyard"])


def body(code: int, reason: str, message: str, messages: Sequence[Message] = ()) -> dict[str, Any]:
    """A Status body as Shipyard answers one: ``code`` its status line ("201 Created")."""
    return conventions.shaped(PREFIX, status.body(code, reason, message, messages))


@dataclass
class Shipyard:
    store: ActionStore
    worker: ActionWorker
    namespaces: tuple[str, ...]
    clock: Clock = SYSTEM_CLOCK
    label_prefixes: tuple[str, ...] = ()  # serve.site_label_prefixes


def install(app: FastAPI, served: Shipyard | None) -> None:
    app.include_router(router, prefix=PREFIX)
    deps.provide(app, Shipyard, served)


def _shipyard(request: Request) -> Shipyard:
    served = deps.find(request.app, Shipyard)
    if served is None:
        raise StatusError(503, "ServiceUnavailable", "metalmend serve has no database")
    return served


def _query(request: Request, name: str) -> str | None:
    """A query parameter given at most once (None: not given). Given twice it is refused,
    as the Deckhand routes refuse theirs, rather than read as its last value."""
    given = request.query_params.getlist(name)
    if len(given) > 1:
        text = f"query parameter {name!r} is given more than once"
        raise StatusError(400, "BadRequest", text, errors(text))
    return given[0] if given else None


def _flag(request: Request, name: str) -> bool:
    found = siteactions.boolean_parameter(name, _query(request, name), False)
    if isinstance(found, str):
        raise StatusError(400, "BadRequest", found, errors(found))
    return found


def _version(request: Request, default: Version = Version.BUFFER) -> Version:
    raw = _query(request, "version")
    found = siteactions.version_named(raw) if raw is not None else default
    if not isinstance(found, Version):  # a Version is a str too: ask for what it is
        raise StatusError(400, "BadRequest", found, errors(found))
    return found


# ---- configdocs -----------------------------------------------------------------------------


@router.post(
    "/configdocs/{collection}",
    status_code=201,
    summary="Put a collection of documents (multi-document YAML) into the buffer",
    description="Query: buffermode=rejectoncontents (default: 409 when the buffer holds"
    " changes)|append|replace (discard the buffer first); empty-collection=true with an"
    " empty body deletes the collection. 201: a Status listing what validation found.",
    responses=documented((201, "Success"), (409, "Conflict"), (413, "RequestEntityTooLarge")),
    dependencies=[auth.Admit(CREATE_CONFIGDOCS, "collection")],
)
async def create_configdocs(collection: str, request: Request) -> JSONResponse:
    name = checked_name(collection, "collection")
    served = _shipyard(request)
    mode = (_query(request, "buffermode") or "rejectoncontents").lower()
    if mode not in configdocs.BUFFER_MODES:
        text = f"buffermode must be one of {', '.join(configdocs.BUFFER_MODES)}"
        raise StatusError(400, "BadRequest", text, errors(text))
    empty = _flag(request, "empty-collection")
    text = await bodies.read_design(request)
    async with bodies.design_gate(request):
        return await _store_configdocs(request, served, name, text, mode, empty)


async def _store_configdocs(
    request: Request, served: Shipyard, name: str, text: str, mode: str, empty: bool
) -> JSONResponse:
    try:
        parsed = await asyncio.to_thread(documents.parse, text, bodies.limits_of(request).yaml)
    except DocumentsRejected as error:
        what = f"collection {name}: the documents cannot be read; nothing stored"
        raise StatusError(400, "BadRequest", what, errors(*error.problems)) from None
    if bool(parsed) == empty:
        problem = (
            "empty-collection=true deletes the collection: send no documents with it"
            if empty
            else "no documents: send empty-collection=true to delete the collection"
        )
        raise StatusError(400, "BadRequest", problem, errors(problem))
    revision = await run(request, lambda store: configdocs.put_in_buffer(store, name, parsed, mode))
    buffer = await run(request, lambda store: configdocs.documents_of(store, revision, None))
    problems = configdocs.site_problems(buffer, served.namespaces, served.label_prefixes)
    log.info("shipyard: configdocs put", extra=fields(collection=name, revision=revision))
    message = f"collection {name} is in the buffer (design revision {revision})"
    lines = [ValidationMessage(p, True) for p in problems]
    answer = body(201, "Created", message, lines or notes("validations succeeded"))
    return JSONResponse(answer, status_code=201)


@router.get(
    "/configdocs/{collection}",
    summary="A collection's documents at a version (YAML)",
    description=VERSION_QUERY,
    responses=documented((200, "documents"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_CONFIGDOCS, "collection")],
)
async def get_configdocs(collection: str, request: Request) -> Response:
    name = checked_name(collection, "collection")
    version = _version(request)

    def read(store: DesignStore) -> list[dict[str, Any]]:
        revision = configdocs.revision_of(store, version)
        found = configdocs.documents_of(store, revision, name, status=True)
        if not found and name not in store.revision(revision).buckets:
            raise NotFound(
                f"collection {name} is not in the {version} version (revision {revision})"
            )
        return found

    return await documents_answer(await run(request, read))


@router.get(
    "/configdocs",
    summary="Each collection's status between two versions",
    description="Query: versions=A&versions=B (or version=A,B), or base-version=A&diff-version=B;"
    " default committed and buffer. The older version (Shipyard's order) is the base.",
    responses=documented((200, "list"), (404, "NotFound")),
    dependencies=[auth.Admit(LIST_CONFIGDOCS)],
)
async def configdocs_status(request: Request) -> JSONResponse:
    query = request.query_params
    raw = [*query.getlist("versions"), *query.getlist("version")]
    if "base-version" in query or "diff-version" in query:  # the spec's names for the two
        if raw:
            text = "give versions (Shipyard's) or base-version/diff-version (the spec's), not both"
            raise StatusError(400, "BadRequest", text, errors(text))
        raw = [_query(request, "base-version") or "committed",
               _query(request, "diff-version") or "buffer"]  # fmt: skip
    wanted = siteactions.compared_versions(raw)
    if isinstance(wanted, siteactions.BadRequest):
        raise StatusError(400, "BadRequest", wanted.message, errors(wanted.message))

    def compare(store: DesignStore) -> list[dict[str, Any]]:
        found = siteactions.compare(configdocs.history(store), *wanted)
        if isinstance(found, siteactions.NotFound):
            raise NotFound(found.message)
        diff = store.diff(found.base_revision, found.new_revision)
        return siteactions.configdocs_status(found, {k: str(v) for k, v in diff.items()})

    return JSONResponse(await run(request, compare))


@router.post(
    "/commitconfigdocs",
    summary="Commit the buffer: validate it and tag it committed",
    description="Query: force=true commits despite validation problems;"
    " dryrun=true only validates.",
    responses=documented((200, "Success"), (409, "Conflict")),
    dependencies=[auth.Admit(COMMIT_CONFIGDOCS)],
)
async def commit_configdocs(request: Request) -> JSONResponse:
    served = _shipyard(request)
    force, dryrun = _flag(request, "force"), _flag(request, "dryrun")
    if force and not dryrun:
        gate = deps.of(request, auth.Gate)
        await gate.authorize(request.state.caller, FORCE_COMMIT, "")

    revision, docs = await run(request, configdocs.buffered)
    problems = configdocs.site_problems(docs, served.namespaces, served.label_prefixes)
    lines = [ValidationMessage(p, True) for p in problems]
    if dryrun and problems and not force:  # Shipyard: a dry run answers 200 with the problems
        text = f"dry run: the buffer (revision {revision}) does not validate; nothing committed"
        return JSONResponse(body(200, "Success", text, lines))
    if problems and not force:
        text = f"the buffer (revision {revision}) does not validate; nothing committed"
        raise StatusError(400, "BadRequest", text, lines)
    if dryrun:
        return JSONResponse(
            body(200, "Success", f"dry run: revision {revision} would be committed", lines)
        )
    await run(request, lambda store: store.tag(revision, siteactions.COMMITTED_TAG, {}))
    log.info(
        "shipyard: configdocs committed", extra=fields(revision=revision, forced=bool(problems))
    )
    text = f"configdocs committed: design revision {revision}"
    return JSONResponse(body(200, "Success", text, lines or notes("validations succeeded")))


@router.get(
    "/renderedconfigdocs",
    summary="Every document at a version (YAML)",
    description=VERSION_QUERY,
    responses=documented((200, "documents"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_RENDERED)],
)
async def rendered_configdocs(request: Request) -> Response:
    version = _version(request)
    return await documents_answer(
        await run(
            request,
            lambda store: configdocs.documents_of(
                store, configdocs.revision_of(store, version), None, status=True
            ),
        )
    )


# ---- actions --------------------------------------------------------------------------------


ACTION_KEYS = ("name", "parameters")  # Shipyard's POST /actions body (its client sends these)


async def _action_body(request: Request) -> tuple[ActionName, dict[str, Any]]:
    raw = await bodies.read_json(request)
    if not isinstance(raw, dict):
        raise StatusError(400, "BadRequest", "the body is not a JSON object")
    unknown = [key for key in raw if key not in ACTION_KEYS]
    if unknown:  # a misplaced parameter is refused, not ignored (the action not created)
        shown = ", ".join(repr(str(k)[:64]) for k in unknown[:5])
        text = (
            f"unknown key {shown} in the action's body: it holds {' and '.join(ACTION_KEYS)}"
            " only (an action's parameters go under parameters); nothing created"
        )
        raise StatusError(400, "BadRequest", text, errors(text))
    why = siteactions.UNSUPPORTED_ACTIONS.get(str(raw.get("name")))
    if why is not None:  # as Shipyard answers an action it does not have, saying why
        reason = f"Unsupported Action: {raw.get('name')}"
        raise StatusError(400, reason, siteactions.UNSUPPORTED, errors(why))
    try:
        name = ActionName(str(raw.get("name")))
    except ValueError:
        known = ", ".join(ActionName)
        text = f"{str(raw.get('name'))[:64]!r} is not a supported action; supported: {known}"
        raise StatusError(400, "BadRequest", text, errors(text)) from None
    parameters = raw.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise StatusError(400, "BadRequest", "parameters must be a JSON object")
    return name, parameters


def _targets(name: ActionName, parameters: dict[str, Any]) -> tuple[str, ...]:
    if name is ActionName.RELABEL_NODES:
        nodes = siteactions.relabel_parameters(parameters)
        if isinstance(nodes, siteactions.BadParameters):
            raise StatusError(400, "BadRequest", "; ".join(nodes.problems), errors(*nodes.problems))
        return nodes
    if name is not ActionName.REDEPLOY_SERVER:
        problem = siteactions.site_parameters(str(name), parameters)
        if problem is not None:
            raise StatusError(400, "BadRequest", problem, errors(problem))
        return ()
    found = siteactions.redeploy_parameters(parameters)
    if isinstance(found, siteactions.BadParameters):
        raise StatusError(400, "BadRequest", "; ".join(found.problems), errors(*found.problems))
    return found.target_nodes


def _url(action_id: str) -> str:
    return f"{PREFIX}/actions/{action_id}"


@router.post(
    "/actions",
    status_code=201,
    summary="Create an action: deploy_site, update_site, redeploy_server or relabel_nodes",
    description="Body: {name, parameters}. Query: allow-intermediate-commits=true. 201 with"
    " the action; it runs in the background: GET /actions/{id}.",
    responses=documented((201, "action"), (409, "Conflict")),
)
async def create_action(request: Request, credentials: auth.Credentials) -> JSONResponse:
    gate = deps.of(request, auth.Gate)
    caller = await auth.authenticate(request, credentials)
    name, parameters = await _action_body(request)
    await gate.authorize(caller, CREATE_ACTION, str(name))
    served = _shipyard(request)
    allow = _flag(request, "allow-intermediate-commits")
    targets = _targets(name, parameters)
    if name is ActionName.REDEPLOY_SERVER:  # each target: nodes/redeploy (again at the start)
        for node in targets:
            await gate.authorize(caller, REDEPLOY_NODE, node)
    asked = configdocs.ActionRequest(
        name, parameters, allow, caller.username, caller.who().to_wire(), context.of(request.scope)
    )
    admission = configdocs.Admission(served.store, served.worker.plans, served.clock)
    # the design store's checks, then the check that no action not finished is in its way
    # (409 naming it) and the insert: one transaction, serialized across replicas
    # (ActionStore.create)
    action, skipped = await run(request, lambda store: admission.create(store, asked))
    if skipped:
        log.warning(skipped, extra=fields(action=action.id))
    served.worker.wake()
    log.info(
        "shipyard: action created",
        extra=fields(
            action=action.id,
            name=str(name),
            by=caller.username,
            revision=action.committed_rev_id,
        ),
    )
    headers = {"Location": _url(action.id)}
    return JSONResponse(action.to_wire(_url(action.id)), status_code=201, headers=headers)


@router.get(
    "/actions",
    summary="Every action, newest first",
    responses=documented((200, "list")),
    dependencies=[auth.Admit(LIST_ACTIONS)],
)
async def list_actions(request: Request) -> JSONResponse:
    served = _shipyard(request)
    found = await asyncio.to_thread(served.store.newest)
    return JSONResponse([a.listed() for a in found])


async def _found(request: Request, action_id: str) -> model.Action:
    served = _shipyard(request)
    found = (
        await asyncio.to_thread(served.store.get, action_id)
        if siteactions.is_action_id(action_id)
        else None
    )
    if found is None:
        text = f"no action {action_id[:64]!r}"
        raise StatusError(404, "NotFound", text, errors(text))
    return found


@router.get(
    "/actions/{action_id}",
    summary="One action, its steps and their notes",
    responses=documented((200, "action"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_ACTION, "action_id", limit=64)],
)
async def get_action(action_id: str, request: Request) -> JSONResponse:
    found = await _found(request, action_id)
    return JSONResponse(found.to_wire(_url(found.id)))


@router.get(
    "/actions/{action_id}/steps/{step}",
    summary="One step of an action",
    responses=documented((200, "step"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_ACTION, "action_id", limit=64)],
)
async def get_step(action_id: str, step: str, request: Request) -> JSONResponse:
    found = (await _found(request, action_id)).step(step)
    if found is None:
        text = f"action {action_id} has no step {step[:64]!r}"
        raise StatusError(404, "NotFound", text, errors(text))
    return JSONResponse(found.detail(action_id))


@router.post(
    "/actions/{action_id}/control/{verb}",
    status_code=202,
    summary="Stop an action: the running step ends at its next wait, no further step starts",
    responses=documented((202, "Accepted"), (404, "NotFound"), (409, "Conflict")),
    dependencies=[auth.Admit(CONTROL_ACTION, "action_id", limit=64)],
)
async def control_action(action_id: str, verb: str, request: Request) -> JSONResponse:
    if verb != "stop":
        text = f"{verb[:32]!r} is not an action control; the one control is stop"
        raise StatusError(400, "BadRequest", text, errors(text))
    found = await _found(request, action_id)
    served = _shipyard(request)
    user = request.state.caller.username
    audit = {
        "action_id": found.id,
        "datetime": model.iso(served.clock.now()),
        "user": user,
        "command": "stop",
    }
    if not await asyncio.to_thread(served.store.request_stop, found.id, user, audit):
        text = f"action {found.id} is {found.lifecycle}: it cannot be stopped"
        raise StatusError(409, "Conflict", text, errors(text))
    served.worker.stopping(found.id)
    text = (
        f"action {found.id}: stop requested; the running step ends at its next wait (or when"
        " it ends), no further step starts"
    )
    return JSONResponse(body(202, "Accepted", text, notes(text)), status_code=202)


@router.get(
    "/actions/{action_id}/steps/{step}/logs",
    summary="A step's log (text): what serve recorded of it, its notes and its record",
    description="Query: try (Shipyard's; try_number read too; serve keeps the latest try only).",
    responses=documented((200, "text"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_STEP_LOGS, "action_id", limit=64)],
)
async def step_logs(action_id: str, step: str, request: Request) -> PlainTextResponse:
    # Shipyard's API and client name it `try`; `try_number` is what serve first read: one
    # of them, once (checked before anything is read)
    tries = [v for v in (_query(request, "try"), _query(request, "try_number")) if v is not None]
    if len(tries) > 1:
        text = "give the try as try or as try_number, not both"
        raise StatusError(400, "BadRequest", text, errors(text))
    raw = tries[0] if tries else None
    found = (await _found(request, action_id)).step(step)
    if found is None:
        text = f"action {action_id} has no step {step[:64]!r}"
        raise StatusError(404, "NotFound", text, errors(text))
    if raw is not None and raw != str(found.try_number):
        text = (
            f"step {found.name} of action {action_id} has no log of try {raw[:16]!r}: serve"
            f" keeps the latest try, {found.try_number}"
        )
        raise StatusError(404, "NotFound", text, errors(text))
    log_text = statuses.step_log(
        action_id, found.name, str(found.state), found.try_number,
        [(model.iso(n.at), n.text) for n in found.notes], found.record,
    )  # fmt: skip
    return PlainTextResponse(log_text)


NOTE_ID_LENGTH = 26


@router.get(
    "/notedetails/{note_id}",
    summary="A note's further details (Shipyard's): serve's notes carry none",
    description="400 for an id that is not 26 characters; 404 'No note found' for a note"
    " not among the newest actions' notes; 404 'No further note details are available' for"
    " one that is (no note carries a URL to resolve: resolved_url_value is null).",
    responses=documented((400, "BadRequest"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_ACTION)],
)
async def note_details(note_id: str, request: Request) -> Response:
    # Shipyard's notedetails answers, by its words: it checks the id's length, looks the
    # note up, and answers 404 for a note with no URL; here no note has one.
    if len(note_id) != NOTE_ID_LENGTH:
        text = "Notes ID values are 26 character ULID values"
        raise StatusError(400, "BadRequest", text, errors(f"Invalid note_id: {note_id[:64]!r}"))
    served = _shipyard(request)
    found = await asyncio.to_thread(served.store.newest)
    if not any(note_id in a.note_ids() for a in found):
        text = "No note found"
        raise StatusError(404, "NotFound", text, errors(f"Note {note_id} is not found"))
    text = "No further note details are available"
    detail = f"Note {note_id} has no additional information to return"
    raise StatusError(404, "NotFound", text, errors(detail))


@router.get(
    "/site_statuses",
    summary="The site's hosts: provisioning state and power (Shipyard's site statuses)",
    description="Query: filters=nodes-provision-status,machines-power-state (default both).",
    responses=documented((200, "statuses"), (400, "BadRequest")),
    dependencies=[auth.Admit(GET_SITE_STATUSES)],
)
async def site_statuses(request: Request) -> JSONResponse:
    served = _shipyard(request)
    wanted = statuses.filters(request.query_params.getlist("filters"))
    if isinstance(wanted, statuses.BadFilter):
        raise StatusError(400, "BadRequest", wanted.message, errors(wanted.message))
    client = deps.of(request, AsyncClient)
    hosts: list[dict[str, Any]] = []
    for namespace in served.namespaces or ("*",):
        async for host in client.list(BareMetalHost, namespace=namespace):
            found: Any = host  # a generic resource: its to_dict is untyped
            hosts.append(found.to_dict())
    seen = (
        await _actions_seen(request, served) if statuses.NODES_PROVISION_STATUS in wanted else None
    )
    return JSONResponse(statuses.site_statuses(wanted, hosts, seen))


async def _actions_seen(request: Request, served: Shipyard) -> list[statuses.ActionSeen] | None:
    """The stored actions (the newest store.LIST_LIMIT), for a caller who may list actions
    (``GET /actions``); None for one who may not: their last actions are not shown."""
    try:
        await deps.of(request, auth.Gate).authorize(request.state.caller, LIST_ACTIONS, "")
    except Refused:
        return None
    found = await asyncio.to_thread(served.store.newest)
    return [
        statuses.ActionSeen(
            a.id, a.name, str(a.lifecycle), model.iso(a.created) or "",
            siteactions.action_targets(a.name, a.parameters),
        )
        for a in found
    ]  # fmt: skip
