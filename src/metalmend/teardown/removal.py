"""clear-labels and remove-from-cluster (docs/teardown.md): the labels of a Node removed and
its DaemonSet pods waited for, then the Node deleted once cordoned, drained and unlabelled,
as their pure policy (``metalmend.teardown.policy.removal``) decides. Asked again after an
interruption, each finishes what it began."""

from __future__ import annotations

import datetime as dt

from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.errors import Conflict, Failed, Message, NotFound, notes
from metalmend.errors import errors as error_lines
from metalmend.kube import errors
from metalmend.teardown import params
from metalmend.teardown.drain import (
    DaemonSets,
    KubeTeardownWriter,
    NodePods,
    TeardownWriter,
    get_node,
    write_refused,
)
from metalmend.teardown.policy.removal import (
    NodeFacts,
    labels_to_clear,
    removal_conflicts,
    stranded,
    unsettled,
)

# ---- clear labels ----------------------------------------------------------------------

# However short the timeout, the pods are listed once before the answer (a list of a
# Node's pods takes well under this).
FIRST_LIST_WITHIN = 10.0


async def clear_labels(
    client: AsyncClient,
    name: str,
    request: params.ClearLabelsRequest,
    writer: TeardownWriter | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> list[Message]:
    """Remove every label of Node ``name`` but promenade-decomission, then wait (up to the
    request's timeout) for the DaemonSet pods that no longer fit it to be removed."""
    node = await get_node(client, name)
    present = dict((node.metadata.labels if node.metadata else None) or {})
    removing = labels_to_clear(present)
    deadline = clock.now() + dt.timedelta(seconds=request.timeout)
    try:
        updated = await (writer or KubeTeardownWriter(client)).remove_labels(node, removing)
    except ApiError as error:
        doing = f"remove the labels of Node {name}"
        raise write_refused(error, name, doing, "ClearLabelsError") from None
    after = (updated or node).metadata
    now_labels = dict((after.labels if after else None) or {})
    done = notes(*(f"label {key} removed" for key in removing))
    async with NodePods(client, name) as pods:
        remaining = max(0.0, (deadline - clock.now()).total_seconds())
        try:
            await pods.listed(max(remaining, FIRST_LIST_WITHIN))
        except TimeoutError:
            problem = pods.informer.last_error or "no answer"
            raise Failed(
                f"cannot list the pods of Node {name}: {problem}", reason="ClearLabelsError"
            ) from None
        while True:
            pods.changed.clear()
            facts = pods.facts()
            waiting = unsettled(name, now_labels, facts)
            if not waiting:
                left = notes(*stranded(name, now_labels, facts))
                return [*done, *left, Message(f"node/{name} labels cleared", False)]
            if clock.now() >= deadline:
                raise Failed(
                    f"the labels of Node {name} are removed but {len(waiting)} pod(s) have not"
                    f" settled within {request.timeout} s",
                    [*done, *error_lines(*waiting)],
                    reason="ClearLabelsError",
                )
            await pods.wait(deadline, clock)


# ---- remove from cluster ---------------------------------------------------------------


async def remove_from_cluster(
    client: AsyncClient, name: str, writer: TeardownWriter | None = None
) -> list[Message]:
    """Delete Node ``name`` if it is cordoned, drained and unlabelled; else 409."""
    writer = writer or KubeTeardownWriter(client)
    node = await get_node(client, name)
    daemonsets = DaemonSets(client)
    pods = [
        await daemonsets.facts(pod.to_dict())
        async for pod in client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": name})
    ]
    facts = NodeFacts(
        name=name,
        uid=str(node.metadata.uid if node.metadata else ""),
        cordoned=bool(node.spec and node.spec.unschedulable),
        labels=dict((node.metadata.labels if node.metadata else None) or {}),
    )
    if problems := removal_conflicts(facts, pods):
        raise Conflict(f"Node {name} cannot be removed yet", error_lines(*problems))
    try:
        deleted = await writer.delete_node(name, facts.uid)
    except ApiError as error:
        raise Failed(
            f"cannot delete Node {name}: {errors.code(error)} {error.status.message}",
            reason="DeleteNodeError",
        ) from None
    if not deleted:
        # Gone meanwhile (success), or another Node of that name registered since the
        # checks (the uid precondition kept it): that one has not been checked.
        try:
            await get_node(client, name)
        except NotFound:  # gone
            return notes(f"node/{name} deleted")
        raise Conflict(f"Node {name} registered again while it was being removed: ask again")
    return notes(f"node/{name} deleted")
