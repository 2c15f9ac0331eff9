"""deploy_site and update_site (docs/site-actions.md, "deploy_site and update_site"): bring
the cluster to the committed design revision, then tag it.

Steps: ``validation`` (the revision's documents, ``policy.deploysite``; each host's BMC
address and credentials Secret as host-power would judge them, by the check
redeploy_server makes too, ``redeploy.bmc_problems``; no host held by a teardown or a
power request; each design Node already registered is its design host's server; then
every object applied as a server-side dry run as the caller, so that RBAC and the
admission policies refuse before anything is written), ``apply`` (server-side apply of
the BareMetalHosts, then the Machines, field manager ``metalmend-shipyard``, as the
caller who created the action: docs/site-actions.md, "Whose permissions apply a design";
a refusal fails the step at once with the API server's message), ``wait`` (hosts on and
provisioned, the design's Nodes Ready with their labels), and ``create_action_tag``,
which runs even after a failure: the revision is tagged ``site-action-success``, or
``site-action-failure`` once validation had passed. The guard against intermediate
commits ran when the action was created (``policy.actions.intermediate_commits``).

Every step is idempotent: apply again writes nothing new; the wait keeps its start in its
record so its timeout survives restarts; tagging again replaces the tag's data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.api.resources import BareMetalHost, Machine
from metalmend.db.leased import in_thread
from metalmend.policy.interlock import TEARDOWN_ANNOTATION
from metalmend.siteactions import redeploy
from metalmend.siteactions.policy import actions as siteactions
from metalmend.siteactions.policy import deploysite as policy
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.siteactions.redeploy import (
    FIELD_MANAGER,
    apply_as_caller,
    as_caller,
    caller,
    documents,
    event,
    node_host_problem,
    node_named,
    revision,
)
from metalmend.siteactions.steps import Planned, StepContext, StepFailed

VALIDATION = "validation"
APPLY = "apply"
WAIT = "wait"
CREATE_ACTION_TAG = "create_action_tag"
KINDS: dict[str, Any] = {"BareMetalHost": BareMetalHost, "Machine": Machine}


def _namespaces(ctx: StepContext) -> tuple[str, ...]:
    return tuple(getattr(ctx.services, "site_namespaces", ()) or ())


async def site_design(ctx: StepContext) -> policy.SiteDesign:
    return redeploy.site_design(ctx, await documents(ctx))


# ---- validation ---------------------------------------------------------------------------


async def validation(ctx: StepContext) -> str:
    caller(ctx)  # an action without its creator's identity is not run as serve
    design = await site_design(ctx)
    problems = list(design.problems)
    if not problems:
        problems += await redeploy.bmc_problems(ctx, policy.bmc_hosts(design))
        problems += await _held_problems(ctx, design)
        problems += await _node_problems(ctx, design)
    etcd = await redeploy.etcd_design(ctx)  # a design that declares etcd must read
    if problems:
        raise StepFailed(f"design revision {revision(ctx)}: " + "; ".join(problems[:20]))
    await _dry_run(ctx, design)
    clusters = f", {len(etcd.clusters)} etcd cluster(s)" if etcd is not None else ""
    return (
        f"design revision {revision(ctx)}: {len(design.hosts)} host(s),"
        f" {len(design.objects) - len(design.hosts)} machine(s),"
        f" {len(design.node_labels)} node(s){clusters}"
    )


async def _held_problems(ctx: StepContext, design: policy.SiteDesign) -> list[str]:
    """A host being torn down or fenced is not the design's to power: applying
    ``online: true`` over a remediation's power-off would undo the fence."""
    problems = []
    for host in design.hosts:
        found = await redeploy.host_of(ctx.services.client, (host.namespace, host.name))
        annotations = dict((found.metadata.annotations or {}) if found else {})
        if TEARDOWN_ANNOTATION in annotations:
            problems.append(f"{host.key} is claimed for teardown ({TEARDOWN_ANNOTATION})")
        pending = sorted(k for k in annotations if k.startswith("reboot.metal3.io"))
        if pending:
            problems.append(f"{host.key} has a power request pending ({pending[0]})")
    return problems


async def _node_problems(ctx: StepContext, design: policy.SiteDesign) -> list[str]:
    """A design Node already registered must be its design host's server (a Node that
    registers later is checked before its labels are applied)."""
    problems = []
    for name in design.node_labels:
        node = await node_named(ctx.services.client, name)
        host = policy.host_named(design, name)
        if node is not None and host is not None:
            problem = await node_host_problem(ctx, node, (host.namespace, host.name))
            if problem:
                problems.append(problem)
    return problems


async def _dry_run(ctx: StepContext, design: policy.SiteDesign) -> None:
    """Every write the action would make, as a server-side dry run as the caller: what
    RBAC or an admission policy refuses (a ``spec.bmc`` change the caller may not make,
    an object in a namespace they may not write) fails validation, nothing written."""
    async with as_caller(ctx, dry_run=True) as client:
        for obj in design.objects:
            what = f"{obj.key} of the design (dry run)"
            await apply_as_caller(ctx, client, _body(obj), what, namespace=obj.namespace)
        for name, labels in design.node_labels.items():
            if labels and await node_named(ctx.services.client, name) is not None:
                await apply_as_caller(
                    ctx, client, node_labels(name, labels), f"labels of Node {name}"
                )


def node_labels(name: str, labels: Mapping[str, str]) -> Node:
    return Node(metadata=ObjectMeta(name=name, labels=dict(labels)))


# ---- apply --------------------------------------------------------------------------------


def _body(obj: policy.SiteObject) -> Any:
    meta = {
        k: v
        for k, v in obj.body["metadata"].items()
        if k in ("name", "namespace", "labels", "annotations")
    }
    return KINDS[obj.kind].from_dict({**obj.body, "metadata": meta})


async def apply(ctx: StepContext) -> str:
    design = await site_design(ctx)
    async with as_caller(ctx) as client:
        for obj in design.objects:
            applied = await apply_as_caller(
                ctx, client, _body(obj), obj.key, namespace=obj.namespace
            )
            if obj.kind == "BareMetalHost":
                await event(ctx, applied, f"applied from design revision {revision(ctx)}")
    await ctx.note(f"applied {len(design.objects)} object(s)")
    return f"{len(design.objects)} object(s) applied (server-side apply, {FIELD_MANAGER})"


# ---- wait ---------------------------------------------------------------------------------


async def wait(ctx: StepContext) -> str:
    """Until the site is there, a host fails (in error: ``policy.deploysite.progress``), the
    timeout passes (counted from the start kept in the record) or the action is stopped
    (``ctx.pause``: nothing is half-done between two looks)."""
    design = await site_design(ctx)
    timing: RedeploySettings = redeploy.settings(ctx)
    clock = ctx.services.clock
    limit = timing.provision_timeout + timing.node_ready_timeout
    since, known = _since(ctx.record), _known(ctx.record)
    shown: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()
    go_on = continue_on_fail(ctx)
    while True:
        seen = [await _host_seen(ctx, h) for h in design.hosts]
        if since is None:  # the first look: what the wait starts from, kept for restarts
            since, known = clock.now(), policy.known_errors(seen)
            await ctx.save({"since": since.isoformat(), "known_errors": known})
        elif (still := policy.still_known(known, seen)) != known:
            known = still
            await ctx.save({"since": since.isoformat(), "known_errors": known})
        ready = {
            n: await _node_ready(ctx, design, n, labels) for n, labels in design.node_labels.items()
        }
        found = policy.progress(seen, ready, known, go_on)
        if found.fails(go_on):
            raise StepFailed("; ".join(found.failed))
        if found.failed != failures:  # continue-on-fail: the others are waited for
            failures = found.failed
            await ctx.note(
                "continue-on-fail: " + "; ".join(failures[:10]) + "; waiting for the others"
            )
        if found.done:
            return f"{len(seen)} host(s) on, {len(ready)} Node(s) Ready"
        if found.waiting != shown:
            shown = found.waiting
            await ctx.note("waiting for " + "; ".join(found.waiting[:10]))
        if clock.now() >= since + dt.timedelta(seconds=limit):
            raise StepFailed(f"not there after {limit:g}s: " + "; ".join(found.waiting[:10]))
        await ctx.pause(timing.poll_interval)


def continue_on_fail(ctx: StepContext) -> bool:
    """Shipyard's ``continue-on-fail=true`` (checked when the action was created)."""
    found = siteactions.boolean_parameter(
        siteactions.CONTINUE_ON_FAIL, ctx.action.parameters.get(siteactions.CONTINUE_ON_FAIL), False
    )
    return found is True


def _known(record: Mapping[str, Any]) -> dict[str, str]:
    raw = record.get("known_errors")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}


def _since(record: Mapping[str, Any]) -> dt.datetime | None:
    raw = record.get("since")
    try:
        return dt.datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


async def _host_seen(ctx: StepContext, obj: policy.SiteObject) -> policy.HostSeen:
    found = await redeploy.host_of(ctx.services.client, (obj.namespace, obj.name))
    spec = obj.body.get("spec") or {}
    facts = redeploy.host_facts(found)
    return policy.HostSeen(
        obj.key, spec.get("online") is True, isinstance(spec.get("image"), Mapping),
        facts.provisioning if facts else "", facts.powered_on if facts else None,
        facts.error if facts else "", facts.problem if facts else None,
    )  # fmt: skip


async def _node_ready(
    ctx: StepContext, design: policy.SiteDesign, name: str, labels: Mapping[str, str]
) -> bool | None:
    """The Node's Ready; its design labels applied first (as the caller), once it exists
    and is found to be its design host's server."""
    node = await node_named(ctx.services.client, name)
    if node is None:
        return None
    present = dict(node.metadata.labels or {}) if node.metadata else {}
    if any(present.get(k) != v for k, v in labels.items()):
        host = policy.host_named(design, name)
        assert host is not None  # read_site keeps only the Nodes of its hosts
        problem = await node_host_problem(ctx, node, (host.namespace, host.name))
        if problem:
            raise StepFailed(problem)
        async with as_caller(ctx) as client:
            node = await apply_as_caller(
                ctx, client, node_labels(name, labels), f"labels of Node {name}"
            )
        await event(ctx, node, f"labels of design revision {revision(ctx)} applied")
    return bool(redeploy.node_ready(node))


# ---- the tag ------------------------------------------------------------------------------


async def create_action_tag(ctx: StepContext) -> str:
    states = ctx.action.states
    validated = states.get(VALIDATION) == "success"
    succeeded = all(states.get(s) == "success" for s in (VALIDATION, APPLY, WAIT))
    name = siteactions.ActionName(ctx.action.name)
    tag = siteactions.completion_tag(name, revision(ctx), ctx.action.name, validated, succeeded)
    if tag is None:
        return "no tag: the action failed before it changed the site"
    data = {**tag.data, "action_id": ctx.action.id}
    await in_thread(ctx.services.design_store.tag, tag.revision, tag.tag, data)
    return f"design revision {tag.revision} tagged {tag.tag}"


PLAN = (
    Planned(VALIDATION, validation),
    Planned(APPLY, apply),
    Planned(WAIT, wait),
    Planned(CREATE_ACTION_TAG, create_action_tag, final=True),
)
