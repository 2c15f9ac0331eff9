"""redeploy_server's steps (docs/site-actions.md, "redeploy_server"), run by the action
worker through ``metalmend.siteactions.steps``.

Airship's node teardown spec ("Shipyard node teardown Process", airship-specs
``specs/approved/workflow_node-teardown.rst``): preflight, design lookup, validation, then
Promenade's decommission, Drydock's destroy (``preserve-local-storage`` passed on) and
Promenade's remove-from-cluster, each done here in-process exactly as the HTTP endpoints
do it; then ``deploy_server`` (beyond the spec: operators expect the server back) deploys
it again from the same design revision.

Each step is idempotent given its record (``ctx.record``): the worker runs it again after
a restart with what it last saved. What must never happen twice is recorded BEFORE it is
done and looked up again after a restart: the Drydock task's id before the task is
created; "member add requested" before an etcd MemberAdd, the member then found by its
peer URLs. The rules are ``metalmend.siteactions.policy.redeploy``'s and ``policy.etcd.decide_add``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Secret

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.bmc import address as bmc_address
from metalmend.bmc import credentials as bmc_credentials
from metalmend.bmc.errors import BadAddress, CredentialsError
from metalmend.db.leased import in_thread
from metalmend.destroy.model import DESTROY_NODES, Task
from metalmend.destroy.policy.destroy import NodeState, ResultStatus, TaskStatus, task_result
from metalmend.destroy.store import NodesBusy
from metalmend.errors import MetalmendError, NotFound, Refused
from metalmend.kube import errors, writes
from metalmend.kube.impersonate import Who
from metalmend.kube.rbac import Caller, Permission
from metalmend.policy import interlock as claims
from metalmend.siteactions.policy import actions as siteactions
from metalmend.siteactions.policy import deploysite
from metalmend.siteactions.policy import redeploy as policy
from metalmend.siteactions.steps import MissingPrecondition, StepContext, StepFailed, StepRunner
from metalmend.teardown import params, removal
from metalmend.teardown.decommission import Decommission
from metalmend.teardown.etcd import access, members
from metalmend.teardown.etcd import design as designs
from metalmend.teardown.policy import decommission as decommissioning

log = logging.getLogger(__name__)

FIELD_MANAGER = "metalmend-shipyard"
# The permission redeploy_server asks per node when the action is created (siteactions.routes)
# and again here at the start.
REDEPLOY_NODE = Permission("nodes", "redeploy", "create", "shipyard.metalmend.dev")
DESIGN_HREF = "deckhand+https://metalmend-serve/deckhand/api/v1.0/revisions/{}/rendered-documents"


# ---- what every step reads ------------------------------------------------------------------


def parameters(ctx: StepContext) -> siteactions.RedeployParameters:
    found = siteactions.redeploy_parameters(ctx.action.parameters)
    if isinstance(
        found, siteactions.BadParameters
    ):  # checked at creation; a stored action is input too
        raise StepFailed("; ".join(found.problems))
    return found


def revision(ctx: StepContext) -> int:
    if ctx.action.revision is None:
        raise StepFailed("no design revision was looked up for this action (design_lookup)")
    return int(ctx.action.revision)


def settings(ctx: StepContext) -> policy.RedeploySettings:
    found = getattr(ctx.services, "redeploy", None)
    return found if isinstance(found, policy.RedeploySettings) else policy.RedeploySettings()


async def documents(ctx: StepContext) -> list[Any]:
    """The revision's documents, as the design store holds them (rendered = stored:
    metalmend's design store does no layering)."""
    store = ctx.services.design_store
    entries = await in_thread(store.entries, revision(ctx))
    return [
        {
            "schema": e.document.schema,
            "metadata": dict(e.document.metadata),
            "data": e.document.data,
        }
        for e in entries
    ]


async def etcd_design(ctx: StepContext) -> designs.Design | None:
    """The revision's EtcdClusters (None: the design declares no etcd cluster)."""
    source = f"design revision {revision(ctx)}"
    try:
        return designs.from_documents(await documents(ctx), source)
    except designs.DesignError as error:
        if error.missing:
            return None
        raise StepFailed(error.message) from None


async def event(ctx: StepContext, obj: Any, message: str, warning: bool = False) -> None:
    """An Event on ``obj`` naming the action (never raises: EventRecorder's contract)."""
    recorder = ctx.services.events
    reason = policy.event_reason(ctx.step)
    text = f"action {ctx.action.id} ({ctx.action.name}): {message}"
    await (recorder.warning if warning else recorder.normal)(obj, reason, text)


async def node_named(client: AsyncClient, name: str) -> Node | None:
    try:
        return await client.get(Node, name)
    except ApiError as error:
        if errors.is_not_found(error):
            return None
        raise


async def host_of(client: AsyncClient, key: tuple[str, str] | None) -> Any | None:
    if key is None:
        return None
    try:
        return await client.get(BareMetalHost, key[1], namespace=key[0])
    except ApiError as error:
        if errors.is_not_found(error):
            return None
        raise


async def tell(
    ctx: StepContext, node: Node | None, name: str, message: str, warning: bool = False
) -> None:
    """The Event on the Node (when it exists) and on its BareMetalHost of the design, which
    outlives the Node: ``kubectl describe baremetalhost`` tells the whole redeploy."""
    if node is not None:
        await event(ctx, node, message, warning)
    key = policy.host_documents(await documents(ctx), name).host_key
    host = await host_of(ctx.services.client, key)
    if host is not None:
        await event(ctx, host, f"{name}: {message}", warning)


def _by(ctx: StepContext) -> str:
    return f"shipyard action {ctx.action.id} ({ctx.action.user})"


# ---- acting as the caller ------------------------------------------------------------------


def caller(ctx: StepContext) -> Who:
    """Who created the action: the design is applied as them. An action stored before
    metalmend kept it has none, and fails rather than act as metalmend serve."""
    who = ctx.action.caller
    if who is None:
        raise StepFailed(
            f"action {ctx.action.id} does not record who created it (it was stored by an"
            " older metalmend): it is not run with metalmend serve's own permissions;"
            " create it again"
        )
    return who


@contextlib.asynccontextmanager
async def as_caller(ctx: StepContext, dry_run: bool = False) -> AsyncIterator[AsyncClient]:
    """An API client acting as the action's caller (``kube.impersonate``): RBAC and every
    admission policy judge the caller's writes, not serve's."""
    client: AsyncClient = ctx.services.impersonate(caller(ctx), dry_run=dry_run)
    try:
        yield client
    finally:
        await client.close()


def refused(error: ApiError, what: str, ctx: StepContext) -> StepFailed | None:
    """A write the API server refused for the caller (RBAC, an admission policy, a bad
    object): the step fails at once with the server's own words. None for what may pass
    (the server away, throttled): the worker tries again."""
    code = errors.code(error)
    if 400 <= code < 500 and code != 429:
        who = ctx.action.caller.username if ctx.action.caller else "?"
        return StepFailed(f"{what}: the API server refused it for {who}: {error.status.message}")
    return None


async def apply_as_caller(
    ctx: StepContext, client: AsyncClient, obj: Any, what: str, **options: Any
) -> Any:
    try:
        return await client.apply(obj, field_manager=FIELD_MANAGER, force=True, **options)
    except ApiError as error:
        failed = refused(error, what, ctx)
        if failed is None:
            raise
        raise failed from None


async def node_host_problem(ctx: StepContext, node: Node, host: tuple[str, str]) -> str | None:
    """Whether ``node`` in the cluster is the server of the design's host ``host``
    (namespace, name): the host its providerID names, or the one its Machine names
    (``Interlock.host_keys``, as a teardown finds it). A design acts on its own Nodes only."""
    name = str(node.metadata.name) if node.metadata else "?"
    keys = await ctx.services.interlock.host_keys(node)
    wanted = f"{host[0]}/{host[1]}"
    if keys == [wanted]:
        return None
    found = ", ".join(keys) if keys else "no BareMetalHost (not a metal3 server)"
    return (
        f"Node {name} in the cluster is the server of {found}, not of the design's"
        f" BareMetalHost {wanted}: a design acts on its own hosts' Nodes only"
    )


async def bmc_problems(ctx: StepContext, hosts: tuple[deploysite.SiteObject, ...]) -> list[str]:
    """The one check of the hosts' BMCs that deploy_site, update_site and redeploy_server
    make at validation, before anything is written: each address parsed as host-power
    parses it, each Secret read now and judged as host-power judges it
    (``policy.deploysite.bmc_problems``)."""
    seen = []
    for host in hosts:
        bmc = host.body["spec"]["bmc"]  # read_site: a mapping with the two strings
        seen.append(
            deploysite.HostBmcSeen(
                host, _address_problem(str(bmc["address"])),
                await _credentials_problem(ctx, host, str(bmc["credentialsName"])),
            )
        )  # fmt: skip
    return deploysite.bmc_problems(seen)


def _address_problem(raw: str) -> str:
    try:
        bmc_address.parse(raw)
    except BadAddress as error:  # (not a ValueError: deploy_site's check once caught that)
        return str(error)
    return ""


async def _credentials_problem(ctx: StepContext, host: deploysite.SiteObject, name: str) -> str:
    try:
        secret = await ctx.services.client.get(Secret, name, namespace=host.namespace)
    except ApiError as error:
        if errors.code(error) == 403:
            return (
                f"metalmend serve may not read Secrets in {host.namespace} (bind ClusterRole"
                " metalmend-serve-bmc-credentials there)"
            )
        if not errors.is_not_found(error):
            raise
        secret = None
    try:
        bmc_credentials.lookup_read(host.namespace, host.name, name, secret)
    except CredentialsError as error:
        return str(error)
    return ""


# ---- preflight, design lookup, validation ---------------------------------------------------


async def preflight(ctx: StepContext) -> str:
    """The parameters read again; the caller's ``nodes/redeploy`` on each target node
    asked again (a binding revoked since the action was created stops it here); and no
    Drydock task destroying a target node already (two destroys of one node would race
    on its host)."""
    wanted = parameters(ctx)
    who = caller(ctx)
    gate = ctx.services.gate
    for node in wanted.target_nodes:
        try:
            await gate.authorize(Caller.of(who), REDEPLOY_NODE, node)
        except Refused as error:  # else serve could not ask (the API server away): tried again
            raise StepFailed(f"at the action's start: {error.message}") from None
    busy = await in_thread(ctx.services.task_store.busy, list(wanted.target_nodes))
    if busy:
        raise StepFailed(
            "; ".join(f"Node {n} is being destroyed by Drydock task {t}" for n, t in busy.items())
        )
    return (
        f"redeploy {', '.join(wanted.target_nodes)}: preserve-local-storage="
        f"{str(wanted.preserve_local_storage).lower()}, target-revision={wanted.target_revision}"
    )


async def design_lookup(ctx: StepContext) -> str:
    """The revision ``target-revision`` names, or a missing precondition (nothing touched)."""
    wanted = parameters(ctx)
    saved = ctx.record.get("revision")
    if isinstance(saved, int) and not isinstance(saved, bool):
        # Run again after a restart: the revision found then is the action's, even if a
        # site action has tagged another one since (every step must use one revision).
        return f"design revision {saved} ({wanted.target_revision})"
    store = ctx.services.design_store
    summaries = await in_thread(store.revisions)
    history = siteactions.History.of((s.id, s.tags) for s in summaries)
    found = siteactions.redeploy_design(history, wanted.target_revision)
    if isinstance(found, siteactions.MissingPrecondition):
        raise MissingPrecondition(found.message)
    await ctx.save({"revision": found})
    return f"design revision {found} ({wanted.target_revision})"


def site_design(ctx: StepContext, docs: list[Any]) -> deploysite.SiteDesign:
    """The revision read by the one set of rules every site action uses
    (``policy.deploysite.read_site``)."""
    namespaces = tuple(getattr(ctx.services, "site_namespaces", ()) or ())
    prefixes = tuple(getattr(ctx.services, "site_label_prefixes", ()) or ())
    return deploysite.read_site(docs, namespaces, prefixes)


async def validation(ctx: StepContext) -> str:
    """The revision holds nothing deploy_site would refuse (``policy.deploysite``, the same
    rules); each target node has exactly one BareMetalHost in it, with an image; the Node
    in the cluster is that host's server; the host's BMC address and Secret are ones
    host-power would use (``bmc_problems``, deploy_site's check: the server is not wiped
    to be deployed as a host nothing could power); the caller may write the host's documents (a
    server-side dry run as the caller: RBAC and admission policies, the ``spec.bmc`` one
    included, judge them before anything is written); the revision's EtcdClusters, if
    any, reads."""
    wanted = parameters(ctx)
    docs = await documents(ctx)
    design = site_design(ctx, docs)
    problems = deploysite.redeploy_problems(design, wanted.target_nodes)
    if not problems:
        for node in wanted.target_nodes:
            problems += await _ownership(ctx, node, design)
        problems += await bmc_problems(ctx, deploysite.bmc_hosts(design, wanted.target_nodes))
    if not problems:
        async with as_caller(ctx, dry_run=True) as client:
            for node in wanted.target_nodes:
                for obj in policy.host_documents(docs, node).objects:
                    what = f"{obj.get('kind')} {_named(obj)} of the design (dry run)"
                    await apply_as_caller(ctx, client, _applied(obj), what)
    if problems:
        raise StepFailed(f"design revision {revision(ctx)}: " + "; ".join(problems[:20]))
    etcd = await etcd_design(ctx)
    clusters = sorted(
        {c.name for n in wanted.target_nodes for c in (etcd.clusters_on(n) if etcd else [])}
    )
    return (
        f"design revision {revision(ctx)}: {len(wanted.target_nodes)} host(s) found;"
        f" etcd member(s) in {', '.join(clusters) or 'no cluster'}"
    )


def _named(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


async def _ownership(ctx: StepContext, node: str, design: deploysite.SiteDesign) -> list[str]:
    host = deploysite.host_named(design, node)
    assert host is not None  # redeploy_problems found exactly one
    found = await node_named(ctx.services.client, node)
    if found is None:
        return [
            f"Node {node} is not in the cluster: which server it is cannot be confirmed"
            " (redeploy_server redeploys a registered Node's own host)"
        ]
    problem = await node_host_problem(ctx, found, (host.namespace, host.name))
    return [problem] if problem else []


# ---- decommission, destroy, remove from cluster ----------------------------------------------


def _secrets(ctx: StepContext) -> access.SecretReader:
    """teardown.etcd.access's reader: labelled Secrets bound to the cluster, or named in
    the settings."""
    named = getattr(ctx.services, "etcd_credentials_secrets", ())
    return access.secret_reader(ctx.services.client, tuple(named))


async def decommission(ctx: StepContext) -> str:
    """teardown/decommission.py's steps for each node, the design read in-process from the
    revision, every step claiming the host through the interlock (invariant 7). A node
    recorded done is not decommissioned again; one interrupted is asked again (each step
    finds its work done)."""
    wanted = parameters(ctx)
    saved = ctx.record.get("done")
    done = [n for n in saved if isinstance(n, str)] if isinstance(saved, list) else []
    design = await etcd_design(ctx) or designs.Design(f"design revision {revision(ctx)}", ())
    services = ctx.services
    request = params.decommission([], {"href": DESIGN_HREF.format(revision(ctx))})
    for node in wanted.target_nodes:
        if node in done:
            continue
        found = await node_named(services.client, node)
        if found is None:  # removed by hand, or by an earlier attempt's later steps
            await ctx.note(f"Node {node} is not in the cluster: nothing to decommission")
        else:
            await ctx.note(f"decommissioning {node}: drain, clear labels, etcd, kubelet")
            steps = Decommission(
                services.client, services.drainer, services.kubelet, services.teardown,
                design, node, request, clock=services.clock, claims=services.interlock,
                by=_by(ctx), secrets=_secrets(ctx),
            )  # fmt: skip
            verdict = await _decommission(ctx, steps)
            if verdict.code != 200:
                await tell(ctx, found, node, f"decommission failed: {verdict.message}", True)
                raise StepFailed(f"{node}: {verdict.reason}: {verdict.message}")
            await tell(ctx, found, node, "decommissioned: drained, labels cleared, etcd, kubelet")
        done.append(node)
        await ctx.save({"done": done})
    return f"decommissioned {', '.join(wanted.target_nodes)}"


async def _decommission(ctx: StepContext, steps: Decommission) -> decommissioning.Verdict:
    """``Decommission.run``, with a note as each of its steps ends (the CLI shows them
    live: a drain may take an hour)."""
    done: list[decommissioning.StepResult] = []
    while (step := decommissioning.next_step(done)) is not None:
        done.append(await steps.attempt(step))
        await ctx.note(f"{steps.node}: {step}: {done[-1].summary}")
    return decommissioning.verdict(steps.node, done)


def _outcome(task: Task | None) -> tuple[policy.TaskOutcome | None, str]:
    if task is None:
        return None, ""
    result = task_result(task.nodes)
    if task.status is not TaskStatus.COMPLETE or not result.complete:
        where = ", ".join(f"{node} at {state.step}" for node, state in task.nodes.items())
        return policy.TaskOutcome.RUNNING, f"{task.status}: {where}"
    summary = task.to_wire()["result"]["message"]
    ok = result.status is ResultStatus.SUCCESS
    return (policy.TaskOutcome.DESTROYED if ok else policy.TaskOutcome.FAILED), summary


async def destroy(ctx: StepContext) -> str:
    """As Shipyard invokes Drydock: a destroy_nodes task for the target nodes in the task
    store, its id recorded before it is created (a restart finds it, never creating a
    second), waited for through the store; its outcome is the step's."""
    wanted = parameters(ctx)
    store, clock, timing = ctx.services.task_store, ctx.services.clock, settings(ctx)
    record = policy.DestroyRecord.from_wire(ctx.record)
    said = ""
    while True:
        task = await in_thread(store.get, record.task_id) if record.task_id else None
        outcome, summary = _outcome(task)
        view = policy.DestroyView(record, task is not None, outcome, summary)
        now = clock.now()
        decision = policy.decide_destroy(
            view, now, timing, str(uuid.uuid4()), ", ".join(wanted.target_nodes)
        )
        for action in decision.actions:
            match action:
                case policy.RecordTask(record=record):
                    await ctx.save(record.to_wire())
                case policy.CreateTask(task_id=task_id):
                    await _create_task(ctx, task_id, wanted, now)
                case policy.Succeed(note=note):
                    await _tell_outcome(ctx, wanted, f"destroyed: {note}")
                    return note
                case policy.Fail(message=message):
                    await _tell_outcome(ctx, wanted, f"destroy failed: {message}", warning=True)
                    raise StepFailed(message)
        if summary and summary != said:
            await ctx.note(f"Drydock task {record.task_id}: {summary}")
            said = summary
        if decision.requeue_at is not None:
            # Interruptible: a stop ends the wait; the Drydock task goes on to its end.
            await ctx.pause(max(0.0, (decision.requeue_at - clock.now()).total_seconds()))


async def _tell_outcome(
    ctx: StepContext, wanted: siteactions.RedeployParameters, message: str, warning: bool = False
) -> None:
    """The task's end on each Node and host: told at the end too, not only at the task's
    creation, which a restart between creating the task and telling would leave untold."""
    for node in wanted.target_nodes:
        found = await node_named(ctx.services.client, node)
        await tell(ctx, found, node, message, warning)


async def _create_task(
    ctx: StepContext, task_id: str, wanted: siteactions.RedeployParameters, now: dt.datetime
) -> None:
    names = list(wanted.target_nodes)
    task = Task(
        task_id=task_id, action=DESTROY_NODES, design_ref=DESIGN_HREF.format(revision(ctx)),
        node_filter={"filter_set_type": "union",
                     "filter_set": [{"filter_type": "union", "node_names": names}]},
        preserve_local_storage=wanted.preserve_local_storage, status=TaskStatus.REQUESTED,
        created=now, created_by=_by(ctx), updated=now, context_marker=ctx.action.context_marker,
        nodes={n: NodeState() for n in names},
    )  # fmt: skip
    try:
        await in_thread(ctx.services.task_store.create, task)
    except NodesBusy as busy:  # a Drydock task took a node since preflight
        raise StepFailed(busy.message.replace("by task", "by Drydock task")) from None
    worker = getattr(ctx.services, "task_worker", None)
    if worker is not None:
        worker.wake()
    wipe = "the OS drive only" if wanted.preserve_local_storage else "every drive"
    await ctx.note(f"Drydock task {task_id} created: destroy {', '.join(names)}, wiping {wipe}")
    for node in names:
        found = await node_named(ctx.services.client, node)
        await tell(ctx, found, node, f"Drydock destroy_nodes task {task_id} created ({wipe})")


async def remove_from_cluster(ctx: StepContext) -> str:
    """What POST /nodes/{id}/remove-from-cluster does, in-process, the host claimed first;
    a Node already gone is done."""
    wanted = parameters(ctx)
    services = ctx.services
    for node in wanted.target_nodes:
        found = await node_named(services.client, node)
        if found is None:
            await ctx.note(f"Node {node} is not in the cluster (already removed)")
            continue
        try:
            await services.interlock.claim(node, "remove-from-cluster", _by(ctx))
            messages = await removal.remove_from_cluster(services.client, node)
        except NotFound:
            continue
        except MetalmendError as error:
            detail = "; ".join(error.problems)
            raise StepFailed(
                f"{node}: {error.message}" + (f": {detail}" if detail else "")
            ) from None
        await tell(ctx, found, node, "removed from the cluster")
        for message in messages:
            await ctx.note(message.message)
    return f"removed {', '.join(wanted.target_nodes)} from the cluster"


# ---- deploy the server again ------------------------------------------------------------


def node_ready(node: Node | None) -> bool | None:
    if node is None:
        return None
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def host_facts(host: Any | None) -> policy.HostFacts | None:
    if host is None:
        return None
    status = host.status if isinstance(host.status, Mapping) else {}
    provisioning = status.get("provisioning")
    state = provisioning.get("state") if isinstance(provisioning, Mapping) else None
    powered = status.get("poweredOn")
    error = status.get("errorMessage")
    return policy.HostFacts(
        str(host.metadata.name),
        state if isinstance(state, str) else "",
        powered if isinstance(powered, bool) else None,
        error[:200] if isinstance(error, str) else "",
        policy.host_error(status),
    )


def _applied(obj: Mapping[str, Any]) -> Any:
    body = {k: v for k, v in obj.items() if k != "status"}
    meta = {
        k: v
        for k, v in (body.get("metadata") or {}).items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    body["metadata"] = meta
    kind = BareMetalHost if body.get("kind") == "BareMetalHost" else Machine
    return kind.from_dict(body)


async def deploy_server(ctx: StepContext) -> str:
    """Each target node deployed again from the revision, one after the other; each
    node's record (``policy.redeploy.DeployRecord``) saved as its phases are reached."""
    wanted = parameters(ctx)
    docs = await documents(ctx)
    design = await etcd_design(ctx)
    saved = ctx.record.get("nodes")
    records = dict(saved) if isinstance(saved, Mapping) else {}
    notes = []
    for node in wanted.target_nodes:
        notes.append(await ServerDeploy(ctx, node, docs, design, records).run())
    return "; ".join(notes)


class ServerDeploy:
    """observe -> policy.redeploy.decide_deploy -> act, for one node, until it succeeds or
    fails."""

    def __init__(
        self, ctx: StepContext, node: str, docs: list[Any], design: designs.Design | None,
        records: dict[str, Any],
    ) -> None:  # fmt: skip
        self.ctx, self.node, self.design, self.records = ctx, node, design, records
        self.wanted = policy.host_documents(docs, node)
        saved = records.get(node)
        self.record = policy.DeployRecord.from_wire(saved if isinstance(saved, Mapping) else {})
        self.client: AsyncClient = ctx.services.client
        self.settings = settings(ctx)

    async def observe(self) -> tuple[policy.DeployView, Any, Node | None]:
        host = await host_of(self.client, self.wanted.host_key)
        found = await node_named(self.client, self.node)
        present = dict((found.metadata.labels if found and found.metadata else None) or {})
        clusters = tuple(c.name for c in self.design.clusters_on(self.node)) if self.design else ()
        view = policy.DeployView(
            self.node, self.record, len(self.wanted.objects), host_facts(host), node_ready(found),
            policy.labels_missing(self.wanted.labels, present), clusters,
        )  # fmt: skip
        return view, host, found

    async def run(self) -> str:
        clock = self.ctx.services.clock
        while True:
            view, host, found = await self.observe()
            decision = policy.decide_deploy(view, clock.now(), self.settings)
            for action in decision.actions:
                outcome = await self.act(action, host, found)
                if outcome is not None:
                    return outcome
            if decision.requeue_at is not None:  # waiting for the host or its Node: a stop ends it
                await self.ctx.pause(max(0.0, (decision.requeue_at - clock.now()).total_seconds()))

    async def act(self, action: Any, host: Any, found: Node | None) -> str | None:
        match action:
            case policy.ApplyHostDocuments():
                async with as_caller(self.ctx) as acting:
                    for obj in self.wanted.objects:
                        what = f"{obj.get('kind')} {_named(obj)} of the design"
                        await apply_as_caller(self.ctx, acting, _applied(obj), what)
                applied = await host_of(self.client, self.wanted.host_key)
                if applied is not None:
                    await event(
                        self.ctx, applied, "the design's BareMetalHost applied (image, online)"
                    )
            case policy.ApplyNodeLabels(keys=keys):
                labels = {k: self.wanted.labels[k] for k in keys}
                patch = Node(metadata=ObjectMeta(name=self.node, labels=labels))
                async with as_caller(self.ctx) as acting:
                    await apply_as_caller(self.ctx, acting, patch, f"labels of Node {self.node}")
                if found is not None:
                    await event(self.ctx, found, f"the design's labels applied: {', '.join(keys)}")
            case policy.BringEtcdBack():
                await self.etcd_back(found)
            case policy.ReleaseTeardownClaim():
                if host is not None:
                    await writes.patch_metadata_map(
                        self.client, BareMetalHost, host, "annotations",
                        {claims.TEARDOWN_ANNOTATION: None},
                    )  # fmt: skip
            case policy.SetRecord(record=record, note=note):
                self.record = record
                self.records[self.node] = record.to_wire()
                await self.ctx.save({"nodes": self.records})
                await self.ctx.note(note)
            case policy.Succeed(note=note):
                if found is not None:
                    await event(self.ctx, found, note)
                return note
            case policy.Fail(message=message):
                if host is not None:
                    await event(self.ctx, host, message, warning=True)
                raise StepFailed(message)
        return None

    async def etcd_back(self, found: Node | None) -> None:
        assert self.design is not None  # the view named clusters from it

        async def requested(cluster: str) -> None:
            self.record = self.record.add_requested(cluster)
            self.records[self.node] = self.record.to_wire()
            await self.ctx.save({"nodes": self.records})
            await self.ctx.note(f"etcd cluster {cluster}: member add requested for {self.node}")

        hooks = members.AddHooks(requested, self.ctx.note)
        outcomes = await members.add_member(
            self.design, self.node, hooks, timeout=self.settings.etcd_timeout,
            poll=min(self.settings.poll_interval, 1.0),
            secrets=_secrets(self.ctx),
        )  # fmt: skip
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise StepFailed(
                "; ".join(f"{o.cluster}: {o.lines[-1] if o.lines else o.result}" for o in failed)
            )
        if found is not None:
            back = ", ".join(o.cluster for o in outcomes)
            await event(self.ctx, found, f"etcd member back in {back}")


STEPS: dict[str, StepRunner] = {
    policy.PREFLIGHT: preflight,
    policy.DESIGN_LOOKUP: design_lookup,
    policy.VALIDATION: validation,
    policy.DECOMMISSION: decommission,
    policy.DESTROY: destroy,
    policy.REMOVE_FROM_CLUSTER: remove_from_cluster,
    policy.DEPLOY_SERVER: deploy_server,
}
