"""relabel_nodes (docs/site-actions.md, "relabel_nodes"): the committed design's Node labels
applied to the target Nodes, as Shipyard's action of that name updates "the Kubernetes
node labels for those servers".

Steps: ``validation`` (the committed revision reads without a problem, as deploy_site
reads it: ``policy.deploysite.read_site``; each target Node has a Node document in it,
is registered, and is its design host's server; the labels applied as a server-side dry
run as the caller, so that RBAC and the admission policies refuse before anything is
written) and ``relabel`` (server-side apply of each Node's labels as the caller who
created the action, field manager ``metalmend-shipyard``: labels the design no longer
holds, which an earlier apply of the design set, are removed; labels of other managers,
the kubelet's among them, are kept). Nothing else of the Node changes; no tag (a target
action, as redeploy_server). Both steps are idempotent: applying again writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from lightkube.resources.core_v1 import Node

from metalmend.siteactions import deploysite
from metalmend.siteactions.policy import actions as siteactions
from metalmend.siteactions.policy import deploysite as policy
from metalmend.siteactions.redeploy import (
    FIELD_MANAGER,
    apply_as_caller,
    as_caller,
    caller,
    event,
    node_host_problem,
    node_named,
    revision,
)
from metalmend.siteactions.steps import Planned, StepContext, StepFailed

VALIDATION = "validation"
RELABEL = "relabel"


def targets(ctx: StepContext) -> tuple[str, ...]:
    found = siteactions.relabel_parameters(ctx.action.parameters)
    if isinstance(found, siteactions.BadParameters):  # checked at creation; stored is input
        raise StepFailed("; ".join(found.problems))
    return found


async def _labels_of_targets(ctx: StepContext) -> dict[str, tuple[Node, Mapping[str, str]]]:
    """Each target Node and the labels the design gives it; StepFailed naming every
    problem (a design that does not read, a Node not in it, not registered, or the
    server of another host) before anything is written."""
    design = await deploysite.site_design(ctx)
    where = f"design revision {revision(ctx)}"
    if design.problems:
        raise StepFailed(f"{where}: " + "; ".join(design.problems[:20]))
    found: dict[str, tuple[Node, Mapping[str, str]]] = {}
    problems: list[str] = []
    for name in targets(ctx):
        labels = design.node_labels.get(name)
        host = policy.host_named(design, name)
        if labels is None or host is None:
            problems.append(f"Node {name} has no Node document in {where}: no labels to apply")
            continue
        node = await node_named(ctx.services.client, name)
        if node is None:
            problems.append(f"Node {name} is not registered in the cluster: nothing to label")
            continue
        problem = await node_host_problem(ctx, node, (host.namespace, host.name))
        if problem:
            problems.append(problem)
            continue
        found[name] = (node, labels)
    if problems:
        raise StepFailed("; ".join(problems[:20]))
    return found


async def validation(ctx: StepContext) -> str:
    caller(ctx)  # an action without its creator's identity is not run as serve
    found = await _labels_of_targets(ctx)
    async with as_caller(ctx, dry_run=True) as client:
        for name, (_, labels) in found.items():
            what = f"labels of Node {name} (dry run)"
            await apply_as_caller(ctx, client, deploysite.node_labels(name, labels), what)
    return f"{len(found)} Node(s) to relabel from design revision {revision(ctx)}"


async def relabel(ctx: StepContext) -> str:
    found = await _labels_of_targets(ctx)  # again: the cluster may have changed since
    async with as_caller(ctx) as client:
        for name, (_, labels) in found.items():
            node = await apply_as_caller(
                ctx, client, deploysite.node_labels(name, labels), f"labels of Node {name}"
            )
            shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "none"
            await event(ctx, node, f"labels of design revision {revision(ctx)} applied")
            await ctx.note(f"Node {name}: design labels applied ({shown})")
    return f"{len(found)} Node(s) relabelled (server-side apply, {FIELD_MANAGER})"


PLAN = (Planned(VALIDATION, validation), Planned(RELABEL, relabel))
