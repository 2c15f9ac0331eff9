"""Promenade's etcd endpoints (Airship's node teardown spec, "Promenade Remove etcd Node"
and "Promenade Check etcd"), under ``/promenade/api/v1.0``:

- ``POST /nodes/{node_id}/remove-etcd?timeout=`` with the design reference as body: take
  the Node's etcd members out of their clusters, only where the cluster keeps its quorum
  and its threshold of healthy members (``metalmend.teardown.policy.etcd``); 500 RemoveEtcdError
  when refused (nothing changed) or not done in time, 500 EtcdNotAccessible when a
  cluster cannot be reached; 200 when removed, already gone, or the Node holds none.
- ``GET /etcd-cluster-health-statuses?design_ref=``: Healthy or Unhealthy per cluster, as
  HealthMessage entries; 400 MissingDesignRef without ``design_ref``; 404 NotFound when the
  design declares no etcd cluster; 500 EtcdNotAccessible when an endpoint answers something
  that is not etcd's health answer.

Order of checks as for every step: the token (401), the permission (403), the request
(400), the Node (404), then the step (docs/teardown.md).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import yaml
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from lightkube import AsyncClient

from metalmend import yamlsafe
from metalmend.designs import access as deckhand
from metalmend.designs import designref
from metalmend.designs.rules import document_query, select
from metalmend.errors import Failed, Message, NotFound
from metalmend.teardown import drain as nodes
from metalmend.teardown import http, params
from metalmend.teardown.etcd import access, members
from metalmend.teardown.etcd import design as designs
from metalmend.web import auth, bodies, deps
from metalmend.web.status import body, documented

log = logging.getLogger(__name__)
router = APIRouter(tags=["promenade"])

HEALTH_KIND = "HealthMessage"


@dataclass(frozen=True)
class HealthMessage(Message):
    """The spec's per-cluster health entry: the cluster's ``name``, and ``detail`` (what
    the verdict was read from: members healthy, the site's threshold)."""

    name: str = ""
    detail: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {**super().to_wire(), "name": self.name, "detail": self.detail}


async def read_body(request: Request) -> object:
    """The design reference body: JSON, or the YAML flow mapping the spec writes it as
    (read within ``bodies.SMALL_YAML``: a nesting bomb fits in a small body)."""
    text = await bodies.read_text(request, bodies.SMALL_BODY)
    try:
        found = yamlsafe.load_all(text, bodies.SMALL_YAML) if text.strip() else [None]
    except yamlsafe.YamlRefused as error:
        raise params.RequestRejected(f"the body is past a limit of this service: {error}") from None
    except yaml.YAMLError:
        raise params.RequestRejected("the body is not JSON (nor YAML)") from None
    if len(found) != 1:
        raise params.RequestRejected("the body is one design reference, not several documents")
    return found[0]


@dataclass(frozen=True)
class EtcdAccess:
    """What the operator allowed (``serve`` settings): the https URL prefixes a design may
    be fetched from, and the etcd credentials Secrets usable for any cluster."""

    design_url_prefixes: tuple[designref.Prefix, ...] = ()
    etcd_credentials_secrets: tuple[str, ...] = ()  # namespace/name
    design_ca_bundle: Path | None = None  # None: the system's CAs

    @classmethod
    def from_settings(
        cls, prefixes: Sequence[str], secrets: Sequence[str], ca_bundle: Path | None = None
    ) -> EtcdAccess:
        return cls(tuple(designref.prefix(p) for p in prefixes), tuple(secrets), ca_bundle)


def access_of_app(app: Any) -> EtcdAccess:
    return deps.find(app, EtcdAccess) or EtcdAccess()


def access_of(request: Request) -> EtcdAccess:
    return access_of_app(request.app)


async def load_design(
    request: Request, ref: designref.DesignRef, unavailable_reason: str, missing_code: int = 400
) -> designs.Design:
    """The design, or the answer that says why not: a reference neither in serve's design
    store nor under an allowed prefix (400, nothing fetched), a revision the caller may not
    read (403), fetching failed (500 with the step's reason), no EtcdClusters document
    (``missing_code``), a bad document (400). Call after ``auth.admit``."""
    try:
        designref.allowed(ref, access_of(request).design_url_prefixes)
    except designref.ReferenceRefused as error:
        raise params.RequestRejected(str(error)) from None
    try:
        if ref.revision is not None:
            return designs.from_documents(await _revision(request, ref), ref.shown)
        return await _fetched(ref, access_of(request).design_ca_bundle)
    except designs.DesignError as error:
        if error.missing and missing_code == 404:
            lines = [Message(error.message, True)]
            raise NotFound(error.message, lines) from None
        if error.unavailable:
            raise Failed(
                error.message, [Message(error.message, True)], reason=unavailable_reason
            ) from None
        raise params.RequestRejected(error.message) from None


async def _fetched(ref: designref.DesignRef, ca_bundle: Path | None) -> designs.Design:
    """The design at an allowed https URL, verified with ``ca_bundle`` when given."""
    if ca_bundle is None:
        return await designs.load(ref.url, source=ref.shown)
    try:
        verify = ssl.create_default_context(cafile=str(ca_bundle))
    except (OSError, ssl.SSLError) as error:
        text = f"cannot read serve.design_ca_bundle {ca_bundle}: {type(error).__name__}"
        raise designs.DesignError(text, unavailable=True) from None
    async with httpx.AsyncClient(verify=verify, follow_redirects=False) as http:
        return await designs.load(ref.url, source=ref.shown, http=http)


async def _revision(request: Request, ref: designref.DesignRef) -> list[Any]:
    """Revision ``ref.revision`` of serve's own design store, read from its database with
    Deckhand's filters, as ``GET .../rendered-documents`` would answer the caller, who
    must therefore be allowed to read it (``get revisions``, deckhand.metalmend.dev)."""
    assert ref.revision is not None
    number = ref.revision
    gate = deps.of(request, auth.Gate)
    await gate.authorize(request.state.caller, deckhand.GET_REVISION, str(number))
    try:
        entries = await deckhand.run(request, lambda store: store.entries(number))
    except NotFound:
        raise params.RequestRejected(
            f"the design reference names revision {number}, which metalmend serve's design"
            " store does not hold"
        ) from None
    query = document_query(ref.filters, ref.rendered)  # checked when the reference was read
    chosen = select(entries, query, ref.rendered)
    return [e.document.to_wire(e.bucket, e.revision) for e in chosen]


def _lines(outcomes: list[members.Outcome], wanted: set[members.Result]) -> list[Message]:
    return [Message(line, o.result in wanted) for o in outcomes for line in o.lines]


@router.post(
    "/nodes/{node_id}/remove-etcd",
    summary="Take the Node's etcd members out of their clusters",
    description="Body: the design reference. Each member on the Node leaves its cluster only"
    " if the cluster keeps quorum and its threshold of healthy members without it; a leader"
    " hands over leadership first. Already gone: success.",
    responses=documented(
        (200, "Success"), (404, "NotFound"), (500, "RemoveEtcdError"), (500, "EtcdNotAccessible")
    ),
    dependencies=[auth.Admit(auth.REMOVE_ETCD, "node_id")],
)
async def remove_etcd(
    request: Request,
    node_id: str,
    timeout: Annotated[  # noqa: ASYNC109 (a query parameter, documented for OpenAPI)
        str | None, Query(description="Whole seconds allowed for the removal (default 1800).")
    ] = None,
) -> JSONResponse:
    del timeout  # documented above; read with its checks from the query
    name = params.node_name(node_id)
    wanted = params.remove_etcd(request.query_params.multi_items(), await read_body(request))
    await nodes.get_node(deps.of(request, AsyncClient), name)
    design = await load_design(request, wanted.design_ref, "RemoveEtcdError")
    await http.claim_for(request, name, "remove-etcd")
    named = access_of(request).etcd_credentials_secrets
    secrets = access.secret_reader(deps.of(request, AsyncClient), named)
    outcomes = await members.remove_member(design, name, timeout=wanted.timeout, secrets=secrets)
    failed = {members.Result.REFUSED, members.Result.UNREACHABLE, members.Result.TIMED_OUT}
    messages = _lines(outcomes, failed)
    if any(o.result is members.Result.UNREACHABLE for o in outcomes):
        raise Failed("etcd cannot be reached", messages, reason="EtcdNotAccessible")
    if bad := [o for o in outcomes if not o.ok]:
        what = "; ".join(f"cluster {o.cluster}: {o.result}" for o in bad)
        raise Failed(
            f"etcd member on {name} not removed: {what}", messages, reason="RemoveEtcdError"
        )
    summary = f"etcd members removed from Node {name}"
    if not outcomes:
        summary = f"Node {name} holds no etcd member of the design's clusters"
        messages = [Message(summary, False)]
    return JSONResponse(body(200, "Success", summary, messages))


@router.get(
    "/etcd-cluster-health-statuses",
    summary="Health of each etcd cluster of the design",
    description="Healthy when the members healthy now are a quorum and at least the site's"
    " threshold (EtcdClusters' minimum functionality); one HealthMessage per cluster.",
    responses=documented(
        (200, "Success"), (400, "MissingDesignRef"), (404, "NotFound"), (500, "EtcdNotAccessible")
    ),
    dependencies=[auth.Admit(auth.ETCD_HEALTH)],
)
async def etcd_health(
    request: Request,
    design_ref: Annotated[
        str | None, Query(description="The design reference that locates the etcd clusters.")
    ] = None,
) -> JSONResponse:
    del design_ref  # documented above; read with its checks from the query
    ref = params.etcd_health(request.query_params.multi_items())
    design = await load_design(request, ref, "EtcdNotAccessible", missing_code=404)
    named = access_of(request).etcd_credentials_secrets
    secrets = access.secret_reader(deps.of(request, AsyncClient), named)
    report = await members.cluster_health(design, secrets=secrets)
    messages: list[Message] = []
    for cluster in report:
        inaccessible = cluster.state is members.State.INACCESSIBLE
        messages.append(
            HealthMessage(
                cluster.state.value, inaccessible, HEALTH_KIND, cluster.cluster, cluster.detail
            )
        )
    if invalid := [line for c in report for line in c.invalid]:
        messages += [Message(line, True) for line in invalid]
        raise Failed(
            "an etcd endpoint gave an invalid health answer", messages, reason="EtcdNotAccessible"
        )
    counts = {s: sum(1 for c in report if c.state is s) for s in members.State}
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    return JSONResponse(body(200, "Success", f"etcd clusters: {summary}", messages))
