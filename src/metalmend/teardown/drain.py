"""drain (docs/teardown.md): cordon a Node and evict its pods, as its pure policy
(``metalmend.teardown.policy.drain``) decides, through ``TeardownWriter`` (the writer of
every node step: clear-labels and remove-from-cluster, ``removal.py``, use it too); and
what the node steps share (the Node read, its pods watched). Nothing is remembered between
requests, so a request interrupted at any point (client gone, service restarted) is
finished by asking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta, Preconditions
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod, PodEviction
from lightkube.types import PatchType

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.errors import Failed, Message, NotFound, notes
from metalmend.errors import errors as error_lines
from metalmend.kube import errors, writes
from metalmend.kube.informer import Informer
from metalmend.log import fields
from metalmend.teardown import params
from metalmend.teardown.policy import drain as policy
from metalmend.teardown.policy.settings import TeardownSettings

log = logging.getLogger(__name__)


class TeardownWriter(Protocol):
    """Every change the node steps make (the narrow writer of docs/decide-act.md)."""

    async def cordon(self, node: str) -> None: ...

    async def evict(self, action: policy.Evict) -> None:
        """Raises ApiError (or a transport error) when the eviction is refused."""

    async def remove_labels(self, node: Node, keys: list[str]) -> Node | None:
        """Remove only these labels; the new Node, or None when none was there."""

    async def delete_node(self, name: str, uid: str) -> bool: ...


class KubeTeardownWriter:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def cordon(self, node: str) -> None:
        body = {"spec": {"unschedulable": True}}
        await self.client.patch(Node, node, body, patch_type=PatchType.MERGE)

    async def evict(self, action: policy.Evict) -> None:
        eviction = PodEviction(
            metadata=ObjectMeta(name=action.name, namespace=action.namespace),
            # The uid precondition: a pod recreated under the same name is not evicted
            # by a decision about its predecessor.
            deleteOptions=DeleteOptions(
                gracePeriodSeconds=action.grace_period,
                preconditions=Preconditions(uid=action.uid),
            ),
        )
        await self.client.create(eviction, name=action.name, namespace=action.namespace)

    async def remove_labels(self, node: Node, keys: list[str]) -> Node | None:
        changed: Node | None = await writes.patch_metadata_map(
            self.client, Node, node, "labels", dict.fromkeys(keys)
        )
        return changed

    async def delete_node(self, name: str, uid: str) -> bool:
        return await writes.delete_exact(self.client, Node, name, uid)


def not_found(name: str) -> NotFound:
    return NotFound(f"Node {name} is not discoverable: no such Node")


async def get_node(client: AsyncClient, name: str) -> Node:
    try:
        return await client.get(Node, name)
    except ApiError as error:
        if errors.is_not_found(error):
            raise not_found(name) from None
        raise


def write_refused(
    error: ApiError, node: str, doing: str, reason: str, *, listed: bool = False
) -> NotFound | Failed:
    """A change to Node ``node`` the API server refused: NotFound when the Node is gone,
    else Failed saying what was being done (``listed``: the message also as an error line)."""
    if errors.is_not_found(error):
        return not_found(node)
    text = f"cannot {doing}: {errors.code(error)} {error.status.message}"
    return Failed(text, error_lines(text) if listed else (), reason=reason)


class DaemonSets:
    """Whether the DaemonSets owning pods still exist (a pod whose DaemonSet is gone is
    deleted, as by ``kubectl drain --force``); each asked once per request."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.known: dict[tuple[str, str], bool] = {}

    async def facts(self, pod: dict[str, Any]) -> policy.PodFacts:
        facts = policy.PodFacts.from_wire(pod)
        if facts.controller_kind != "DaemonSet" or facts.controller_name is None:
            return facts
        key = (facts.namespace, facts.controller_name)
        if key not in self.known:
            try:
                await self.client.get(DaemonSet, key[1], namespace=key[0])
                self.known[key] = True
            except ApiError as error:
                if not errors.is_not_found(error):
                    raise
                self.known[key] = False
        return _with_missing(facts, not self.known[key])


def _with_missing(facts: policy.PodFacts, missing: bool) -> policy.PodFacts:
    return dataclasses.replace(facts, daemonset_missing=missing)


class NodePods:
    """The pods bound to a Node, listed then watched (an Informer) for one request: a step
    wakes when one changes or goes, and at its own deadlines, never on a polling period."""

    def __init__(self, client: AsyncClient, node: str) -> None:
        self.informer = Informer(client, Pod, fields={"spec.nodeName": node})
        self.changed = asyncio.Event()
        self.informer.add_handler(lambda old, new: self.changed.set())
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> NodePods:
        self._tasks = [
            asyncio.create_task(self.informer.run()),
            asyncio.create_task(self._first_listing()),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _first_listing(self) -> None:
        """The first listing is a change too, even of no pods: a caller that saw "not
        listed yet", then awaited something else (a cordon) while the listing of an empty
        Node completed, must not wait for a pod event that will never come."""
        await self.informer.synced.wait()
        self.changed.set()

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    def facts(self) -> list[policy.PodFacts]:
        return [policy.PodFacts.from_wire(p.to_dict()) for p in self.informer.store.values()]

    async def wait(self, until: dt.datetime | None, clock: Clock) -> None:
        """Until a pod changes, the first listing completes (both set ``changed``, which
        the caller clears before it looks), or ``until``."""
        timeout = None if until is None else max(0.0, (until - clock.now()).total_seconds())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    async def listed(self, within: float) -> None:
        """Wait for the first listing, at most ``within`` seconds (raises TimeoutError)."""
        await asyncio.wait_for(self.informer.synced.wait(), within)


# ---- drain -----------------------------------------------------------------------------

WAITING_LOG_EVERY = dt.timedelta(seconds=30)


@dataclass
class DrainRun:
    """What one drain request has learnt so far (lost with the request: asking again
    starts from what the cluster shows, which is all that matters)."""

    node: str
    cordoned: bool
    deadline: dt.datetime
    grace_period: int
    evicted: set[str] = field(default_factory=set)
    refusals: dict[str, policy.Refusal] = field(default_factory=dict)
    done: list[Message] = field(default_factory=list)
    said_waiting: dt.datetime | None = None  # when the last "drain waiting" line was logged


class Drainer:
    def __init__(
        self,
        client: AsyncClient,
        settings: TeardownSettings,
        writer: TeardownWriter | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.settings = settings
        self.writer = writer or KubeTeardownWriter(client)
        self.clock = clock

    async def drain(self, name: str, request: params.DrainRequest) -> list[Message]:
        """Drain Node ``name``; the messages of a success; raises NotFound, Failed."""
        node = await get_node(self.client, name)
        run = DrainRun(
            node=name,
            cordoned=bool(node.spec and node.spec.unschedulable),
            deadline=self.clock.now() + dt.timedelta(seconds=request.timeout),
            grace_period=request.grace_period,
        )
        async with NodePods(self.client, name) as pods:
            return await self._drain(run, pods)

    async def _drain(self, run: DrainRun, pods: NodePods) -> list[Message]:
        daemonsets = DaemonSets(self.client)
        while True:
            pods.changed.clear()  # before observing: a change during the decision wakes us
            view = await self._observe(run, pods.informer, daemonsets)
            now = self.clock.now()
            decision = policy.decide(view, now, self.settings)
            evictions = []
            for action in decision.actions:
                match action:
                    case policy.Cordon(node=node):
                        await self._cordon(run, node)
                    case policy.Evict():
                        evictions.append(action)
                    case policy.Drained(left=left):
                        return self._drained(run, left)
                    case policy.DrainFailed(problems=problems):
                        raise Failed(
                            f"Node {run.node} is not drained: {len(problems)} pod(s) left",
                            error_lines(*problems),
                            reason="DrainNodeError",
                        )
                    case _:
                        pass  # an Event: drains report in their answer
            if evictions:
                # All at once, as kubectl does; then decide again with the answers.
                await asyncio.gather(*(self._evict(run, e) for e in evictions))
                continue
            self._say_waiting(run, view, now)
            await pods.wait(decision.requeue_at, self.clock)

    def _say_waiting(self, run: DrainRun, view: policy.DrainView, now: dt.datetime) -> None:
        """One log line at most every WAITING_LOG_EVERY seconds while a drain waits: which
        pods it waits for (or why it cannot list them), so that a drain of an hour is
        never silent to the operator."""
        if run.said_waiting is not None and now - run.said_waiting < WAITING_LOG_EVERY:
            return
        run.said_waiting = now
        if view.pods_unknown is not None:
            waiting = f"the pods cannot be listed yet: {view.pods_unknown}"
        else:
            left = [
                f"{p.key}{' (stopping)' if p.deleting else ''}"
                for p in view.pods
                if p.controller_kind != "DaemonSet" and not p.mirror
            ]
            shown = ", ".join(left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
            waiting = f"{len(left)} pod(s) to go: {shown}" if left else "its pods to settle"
        log.info(
            "drain waiting",
            extra=fields(
                node=run.node, waiting=waiting, until=run.deadline.isoformat(timespec="seconds")
            ),
        )

    async def _observe(
        self, run: DrainRun, pods: Informer, daemonsets: DaemonSets
    ) -> policy.DrainView:
        unknown = None
        facts: list[policy.PodFacts] = []
        if not pods.synced.is_set():
            unknown = pods.last_error or "not listed yet"
        else:
            for pod in pods.store.values():
                facts.append(await daemonsets.facts(pod.to_dict()))
        return policy.DrainView(
            node=run.node,
            cordoned=run.cordoned,
            pods=tuple(sorted(facts, key=lambda p: p.key)),
            deadline=run.deadline,
            grace_period=run.grace_period,
            evicted=frozenset(run.evicted),
            refusals=dict(run.refusals),
            pods_unknown=unknown,
        )

    async def _cordon(self, run: DrainRun, node: str) -> None:
        try:
            await self.writer.cordon(node)
        except ApiError as error:
            raise write_refused(error, node, f"cordon Node {node}", "DrainNodeError") from None
        run.cordoned = True
        run.done.append(Message(f"node/{node} cordoned", False))

    async def _evict(self, run: DrainRun, action: policy.Evict) -> None:
        key = f"{action.namespace}/{action.name}"
        try:
            await self.writer.evict(action)
        except ApiError as error:
            causes = tuple(
                (c.reason or "", c.message or "")
                for c in ((error.status.details.causes or []) if error.status.details else [])
            )
            refusal = policy.eviction_refusal(
                errors.code(error), error.status.message or "", causes, self.clock.now(),
                self.settings,
            )  # fmt: skip
            if refusal is None:  # already gone
                run.evicted.add(action.uid)
                return
            log.info("eviction refused", extra=fields(pod=key, reason=refusal.message))
            run.refusals[action.uid] = refusal
            return
        except (httpx2.HTTPError, OSError) as error:
            refusal = policy.eviction_refusal(503, str(error), (), self.clock.now(), self.settings)
            assert refusal is not None
            run.refusals[action.uid] = refusal
            return
        run.evicted.add(action.uid)
        run.refusals.pop(action.uid, None)
        line = f"pod {key} evicted" + (f" ({action.warning})" if action.warning else "")
        run.done.append(Message(line, False))

    def _drained(
        self, run: DrainRun, left: tuple[tuple[str, policy.Disposition], ...]
    ) -> list[Message]:
        why = {
            policy.Disposition.LEAVE_DAEMONSET: "DaemonSet-managed",
            policy.Disposition.LEAVE_MIRROR: "a mirror (static) pod",
        }
        kept = [f"pod {key} left running: {why.get(d, str(d))}" for key, d in left]
        return [*run.done, *notes(*kept), Message(f"node/{run.node} drained", False)]
