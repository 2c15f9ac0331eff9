"""Promenade's node-teardown endpoints (Airship's node teardown spec, airship-specs
``specs/approved/workflow_node-teardown.rst``), under ``/promenade/api/v1.0``.

Here: drain, clear-labels, shutdown-kubelet, remove-from-cluster and decommission (its
steps in ``metalmend.teardown.decommission``); remove-etcd and etcd-cluster-health-statuses
in ``metalmend.teardown.etcd.routes``.

Each request is synchronous, as in the spec: the answer comes when the step has finished
or failed. Order of checks: the token (401), the permission (403), the request (400), the
Node (404), then the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx2
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from lightkube import ApiError, AsyncClient

from metalmend.kube import errors
from metalmend.teardown import drain as nodes
from metalmend.teardown import http, params, removal
from metalmend.teardown import shutdown as kubelet
from metalmend.teardown.decommission import Decommission
from metalmend.teardown.etcd import access
from metalmend.teardown.etcd import routes as etcd
from metalmend.teardown.interlock import Interlock
from metalmend.web import auth, deps
from metalmend.web.status import Message, StatusError, body, documented
from metalmend.web.status import errors as error_lines

PREFIX = "/promenade/api/v1.0"

router = APIRouter(tags=["promenade"])


def _documented(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    return documented(*answers, (404, "NotFound"))  # every node step names a Node


@contextlib.asynccontextmanager
async def _failing_as(reason: str) -> AsyncIterator[None]:
    """An API server refusal or outage inside a step is that step's failure (the spec's
    500 with the step's reason), with the API server's words."""
    try:
        yield
    except ApiError as error:
        text = f"the API server answered {errors.code(error)} {error.status.message}"
        raise StatusError(500, reason, text, error_lines(text)) from None
    except (httpx2.HTTPError, OSError) as error:
        text = f"cannot reach the API server: {error}"
        raise StatusError(500, reason, text, error_lines(text)) from None


def _query(request: Request) -> params.Query:
    return request.query_params.multi_items()


def _success(message: str, messages: list[Message]) -> JSONResponse:
    return JSONResponse(body(200, "Success", message, messages))


@router.get(
    "/health",
    status_code=204,
    response_class=Response,
    summary="Is the service up",
    description="204 No Content, no body, no token needed: Airship's health convention, as"
    " Promenade answers it (it checks nothing further either). A load balancer or a"
    " kubelet probe may call it.",
    responses={204: {"description": "the service answers requests"}},
)
async def health() -> Response:
    return Response(status_code=204)


@router.post(
    "/nodes/{node_id}/drain",
    summary="Drain a Node",
    description="Cordon the Node and evict its pods through the Eviction API, as `kubectl drain"
    " --force --delete-emptydir-data --ignore-daemonsets` (DaemonSet and mirror pods stay)."
    " No body. 500 DrainNodeError names every pod left and why.",
    responses=_documented((200, "Success"), (500, "DrainNodeError")),
    dependencies=[auth.Admit(auth.DRAIN, "node_id")],
)
async def drain(
    request: Request,
    node_id: str,
    timeout: Annotated[  # noqa: ASYNC109 (a query parameter, documented for OpenAPI)
        str | None, Query(description="Whole seconds for the whole drain (default 3600).")
    ] = None,
    grace_period: Annotated[
        str | None,
        Query(
            alias="grace-period",
            description="Whole seconds each pod is given to stop (default 1800); less than"
            " timeout.",
        ),
    ] = None,
) -> JSONResponse:
    del timeout, grace_period  # documented above; read with their checks from the query
    name = params.node_name(node_id)
    wanted = params.drain(_query(request))
    drainer = deps.of(request, nodes.Drainer)
    async with _failing_as("DrainNodeError"):
        await http.claim_for(request, name, "drain")
        messages = await drainer.drain(name, wanted)
    return _success(f"Node {name} drained", messages)


@router.post(
    "/nodes/{node_id}/clear-labels",
    summary="Remove the labels of a Node",
    description="Remove every label of the Node but promenade-decomission, then wait for the"
    " DaemonSet pods that no longer fit it to be removed. No body. 500 ClearLabelsError names"
    " the pods that did not settle within the timeout.",
    responses=_documented((200, "Success"), (500, "ClearLabelsError")),
    dependencies=[auth.Admit(auth.CLEAR_LABELS, "node_id")],
)
async def clear_labels(
    request: Request,
    node_id: str,
    timeout: Annotated[  # noqa: ASYNC109 (a query parameter, documented for OpenAPI)
        str | None,
        Query(description="Whole seconds allowed for pods to settle (default 1800)."),
    ] = None,
) -> JSONResponse:
    del timeout  # documented above; read with its checks from the query
    name = params.node_name(node_id)
    wanted = params.clear_labels(_query(request))
    async with _failing_as("ClearLabelsError"):
        await http.claim_for(request, name, "clear-labels")
        messages = await removal.clear_labels(deps.of(request, AsyncClient), name, wanted)
    return _success(f"Node {name} labels cleared", messages)


@router.post(
    "/nodes/{node_id}/remove-from-cluster",
    summary="Delete a drained Node from the cluster",
    description="409 Conflict unless the Node is cordoned, drained, and has no label other"
    " than promenade-decomission. No body.",
    responses=_documented((200, "Success"), (409, "Conflict"), (500, "DeleteNodeError")),
    dependencies=[auth.Admit(auth.REMOVE_FROM_CLUSTER, "node_id")],
)
async def remove_from_cluster(request: Request, node_id: str) -> JSONResponse:
    name = params.node_name(node_id)
    params.no_parameters(_query(request))
    async with _failing_as("DeleteNodeError"):
        await http.claim_for(request, name, "remove-from-cluster")
        messages = await removal.remove_from_cluster(deps.of(request, AsyncClient), name)
    return _success(f"Node {name} removed from the cluster", messages)


@router.post(
    "/nodes/{node_id}/shutdown-kubelet",
    summary="Stop and disable the kubelet of a Node",
    description="Label the Node promenade-decomission=enabled, which the shutdown-kubelet"
    " DaemonSet (deploy/teardown/shutdown-kubelet.yaml) selects to stop and disable the"
    " kubelet there, then wait until the kubelet is seen stopped (its Lease no longer"
    " renewed). No body. 500 ShutdownKubeletError says what the cluster shows.",
    responses=_documented((200, "Success"), (500, "ShutdownKubeletError")),
    dependencies=[auth.Admit(auth.SHUTDOWN_KUBELET, "node_id")],
)
async def shutdown_kubelet(request: Request, node_id: str) -> JSONResponse:
    name = params.node_name(node_id)
    params.no_parameters(_query(request))
    shutdown = deps.of(request, kubelet.KubeletShutdown)
    async with _failing_as(kubelet.REASON):
        await http.claim_for(request, name, "shutdown-kubelet")
        messages = await shutdown.shutdown(name)
    return _success(f"Node {name} kubelet shut down", messages)


@router.post(
    "/nodes/{node_id}/decommission",
    summary="Disassociate a Node from Kubernetes and etcd, ready for its server to be destroyed",
    description="Body: the design reference. Drain, clear labels, remove the Node's etcd"
    " members, wait for the etcd clusters to be stable (not counting this Node), shut the"
    " kubelet down. 500 DisassociateStepFailure with one message per step when a step"
    " fails; a kubelet that is not seen stopped is reported but does not fail it.",
    responses=documented((200, "Success"), (404, "NotFound"), (500, "DisassociateStepFailure")),
    dependencies=[auth.Admit(auth.DECOMMISSION, "node_id")],
)
async def decommission(
    request: Request,
    node_id: str,
    drain_node_timeout: Annotated[
        str | None, Query(alias="drain-node-timeout", description="The drain's timeout (3600).")
    ] = None,
    drain_node_grace_period: Annotated[
        str | None,
        Query(alias="drain-node-grace-period", description="The drain's grace period (1800)."),
    ] = None,
    clear_labels_timeout: Annotated[
        str | None, Query(alias="clear-labels-timeout", description="clear-labels' (1800).")
    ] = None,
    remove_etcd_timeout: Annotated[
        str | None, Query(alias="remove-etcd-timeout", description="remove-etcd's (1800).")
    ] = None,
    etcd_ready_timeout: Annotated[
        str | None,
        Query(alias="etcd-ready-timeout", description="How long etcd may take to be stable (600)."),
    ] = None,
) -> JSONResponse:
    # Documented above for OpenAPI; read with their checks from the query.
    del drain_node_timeout, drain_node_grace_period, clear_labels_timeout
    del remove_etcd_timeout, etcd_ready_timeout
    name = params.node_name(node_id)
    wanted = params.decommission(request.query_params.multi_items(), await etcd.read_body(request))
    client = deps.of(request, AsyncClient)
    drainer = deps.of(request, nodes.Drainer)
    await nodes.get_node(client, name)
    design = await etcd.load_design(request, wanted.design_ref, "DisassociateStepFailure")
    await http.claim_for(request, name, "decommission")  # 409 before any step
    secrets = access.secret_reader(client, etcd.access_of(request).etcd_credentials_secrets)
    verdict = await Decommission(
        client, drainer, deps.of(request, kubelet.KubeletShutdown), drainer.settings,
        design, name, wanted, claims=deps.of(request, Interlock), by=auth.caller_of(request),
        secrets=secrets,
    ).run()  # fmt: skip
    messages = [Message(text, error) for text, error in verdict.lines]
    return JSONResponse(
        body(verdict.code, verdict.reason, verdict.message, messages), status_code=verdict.code
    )
