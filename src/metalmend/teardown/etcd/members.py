"""Taking a Node's etcd members out of their clusters, and reading the clusters' health,
for remove-etcd, the health endpoint and decommission (docs/teardown.md); and bringing a
redeployed server's members back (``add_member``: redeploy_server, docs/site-actions.md).

observe (etcd's member list, each member's own ``/health``, the leader) -> the pure rule
(``metalmend.teardown.policy.etcd.decide``) -> act (move leadership, remove the member), again
until the rule answers AlreadyGone or Refuse, or the deadline passes. Nothing is kept
between requests: a removal interrupted anywhere is finished by asking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from metalmend.teardown.etcd import access
from metalmend.teardown.etcd.client import (
    EndpointHealth,
    EtcdClient,
    EtcdError,
    EtcdInvalid,
    EtcdRefused,
    EtcdUnreachable,
    Member,
)
from metalmend.teardown.etcd.design import ClusterDesign, Design, MemberDesign
from metalmend.teardown.policy import etcd as policy

log = logging.getLogger(__name__)

RETRY = 1.0  # seconds between attempts etcd asked us to make later (503 unhealthy cluster)
# After a leadership hand-over the members hold an election-sized pause: health probes may
# fail for a moment. A refusal seen this soon after is looked at again, not answered.
SETTLE = 5.0


class Result(StrEnum):
    REMOVED = "removed"
    ALREADY_GONE = "already gone"
    REFUSED = "refused"  # the rule or etcd refused; nothing was changed
    UNREACHABLE = "unreachable"  # no member of the cluster answered
    TIMED_OUT = "timed out"


@dataclass
class Outcome:
    """What became of one Node's member of one cluster; ``lines`` say it for operators."""

    cluster: str
    node: str
    result: Result
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result in (Result.REMOVED, Result.ALREADY_GONE)


class ClusterUnreachable(Exception):
    """No member of a cluster gave its member list."""


@dataclass(frozen=True)
class Observed:
    view: policy.ClusterView
    probes: tuple[EndpointHealth | EtcdError, ...]  # per member, for messages


def _matches(member: Member, wanted: MemberDesign) -> bool:
    """The etcd member the design places on a Node: same name, or (unstarted, nameless)
    one of the same peer URLs."""
    if member.name:
        return member.name == wanted.name
    return bool(set(member.peer_urls) & set(wanted.peer_urls))


async def _member_list(client: EtcdClient, cluster: ClusterDesign) -> list[Member]:
    # Asked of every endpoint at once, the agreed list first; without a quorum nobody can
    # agree, and a member's own view still says who the members are.
    problems: list[str] = []
    for linearizable in (True, False):
        answers = await asyncio.gather(
            *(_list_or_error(client, e, linearizable) for e in cluster.endpoints)
        )
        for answer in answers:
            if isinstance(answer, list):
                return answer
            problems.append(str(answer))
    raise ClusterUnreachable(
        f"cannot read the members of etcd cluster {cluster.name}: " + "; ".join(problems[-3:])
    )


async def _list_or_error(
    client: EtcdClient, endpoint: str, linearizable: bool
) -> list[Member] | EtcdError:
    try:
        return await client.member_list(endpoint, linearizable)
    except EtcdError as error:
        return error


async def _probe(client: EtcdClient, member: Member) -> EndpointHealth | EtcdError:
    """The member's own health, on its first client URL that answers."""
    last: EtcdError = EtcdUnreachable(member.name or str(member.id), "no client URL")
    for url in member.client_urls:
        try:
            return await client.health(url)
        except EtcdError as error:
            last = error
    return last


async def _leader(client: EtcdClient, members: Sequence[Member], healthy: set[int]) -> int:
    for member in members:
        if member.id in healthy:
            for url in member.client_urls:
                try:
                    return (await client.status(url)).leader
                except EtcdError:
                    continue
    return 0


async def observe(client: EtcdClient, cluster: ClusterDesign, node: str | None) -> Observed:
    """The cluster as it is now: etcd's member list, each member probed (concurrently)."""
    members = await _member_list(client, cluster)
    probes = await asyncio.gather(*(_probe(client, m) for m in members))
    healthy = {
        m.id for m, p in zip(members, probes, strict=True)
        if isinstance(p, EndpointHealth) and p.healthy
    }  # fmt: skip
    leader = await _leader(client, members, healthy)
    wanted = cluster.member_on(node) if node else None
    target = next((m.id for m in members if wanted and _matches(m, wanted)), None)
    view = policy.ClusterView(
        cluster=cluster.name,
        threshold=cluster.threshold,
        members=tuple(
            policy.MemberFacts(
                id=m.id, name=m.name, healthy=m.id in healthy, leader=m.id == leader,
                learner=m.is_learner, client_urls=m.client_urls, peer_urls=m.peer_urls,
            )
            for m in members
        ),
        target=target,
        node=node or "",
    )  # fmt: skip
    return Observed(view, tuple(probes))


async def _remove(client: EtcdClient, action: policy.RemoveMember) -> None:
    """Send the removal to the other healthy members in turn, until one takes it."""
    last: EtcdError | None = None
    for endpoint in action.via:
        try:
            await client.member_remove(endpoint, action.member_id)
            return
        except EtcdRefused:
            raise
        except EtcdError as error:
            last = error
    raise last or EtcdUnreachable(action.cluster, "no healthy member to send the removal to")


async def _move_leader(client: EtcdClient, action: policy.MoveLeader) -> None:
    last: EtcdError | None = None
    for endpoint in action.via:
        try:
            await client.move_leader(endpoint, action.to_id)
            return
        except EtcdRefused:
            raise
        except EtcdError as error:
            last = error
    raise last or EtcdUnreachable(action.cluster, "the leader has no client URL")


def _label(view: policy.ClusterView, member_id: int) -> str:
    member = next((m for m in view.members if m.id == member_id), None)
    return f"{member.name or '(unstarted)'} ({member_id:x})" if member else f"{member_id:x}"


@contextlib.asynccontextmanager
async def _clients(
    clusters: Sequence[ClusterDesign], secrets: access.SecretReader | None
) -> AsyncIterator[dict[str, EtcdClient | str]]:
    """A client per cluster, with its credentials; or why there is none (a message)."""
    clients: dict[str, EtcdClient | str] = {}
    try:
        for cluster in clusters:
            try:
                clients[cluster.name] = await access.connect(cluster, secrets)
            except access.CredentialsRefused as error:
                clients[cluster.name] = str(error)
        yield clients
    finally:
        for client in clients.values():
            if isinstance(client, EtcdClient):
                await client.aclose()


async def _observe(
    clients: dict[str, EtcdClient | str], cluster: ClusterDesign, node: str | None
) -> Observed:
    client = clients[cluster.name]
    if isinstance(client, str):
        raise ClusterUnreachable(client)
    return await observe(client, cluster, node)


async def remove_member(
    design: Design,
    node: str,
    *,
    timeout: float = 1800.0,  # noqa: ASYNC109 (the spec's remove-etcd timeout, whole)
    secrets: access.SecretReader | None = None,
) -> list[Outcome]:
    """Take ``node``'s member out of every cluster of ``design`` it belongs to; one Outcome
    per such cluster (none: the Node holds no etcd member, nothing to do). ``secrets``
    reads the credentials Secrets the design names (none: clusters that declare
    credentials are unreachable).

    Every cluster is checked before anything is changed: when the rule refuses one, no
    cluster is touched (each Outcome then says REFUSED or what was observed)."""
    clusters = design.clusters_on(node)
    deadline = time.monotonic() + timeout
    async with _clients(clusters, secrets) as clients:
        first: dict[str, Observed] = {}
        outcomes: list[Outcome] = []
        for cluster in clusters:
            try:
                first[cluster.name] = await _observe(clients, cluster, node)
            except ClusterUnreachable as error:
                return [Outcome(cluster.name, node, Result.UNREACHABLE, [str(error)])]
            for action in policy.decide(first[cluster.name].view).actions:
                if isinstance(action, policy.Refuse):
                    outcomes.append(
                        Outcome(cluster.name, node, Result.REFUSED, list(action.reasons))
                    )
        if outcomes:
            return outcomes
        for cluster in clusters:
            etcd = clients[cluster.name]
            assert isinstance(etcd, EtcdClient)  # observed above
            outcomes.append(await _take_out(etcd, cluster, node, deadline, first[cluster.name]))
        return outcomes


async def _take_out(
    etcd: EtcdClient, cluster: ClusterDesign, node: str, deadline: float, seen: Observed
) -> Outcome:
    """observe -> decide -> act for one cluster until done, refused or out of time."""
    outcome = Outcome(cluster.name, node, Result.TIMED_OUT)
    observed: Observed | None = seen
    removed = False
    settle_until = 0.0
    while True:
        if observed is None:
            try:
                observed = await observe(etcd, cluster, node)
            except ClusterUnreachable as error:
                outcome.lines.append(str(error))
                if time.monotonic() >= deadline:
                    outcome.result = Result.UNREACHABLE
                    return outcome
                await asyncio.sleep(RETRY)
                continue
        view, observed = observed.view, None
        action = policy.decide(view).actions[0]
        try:
            match action:
                case policy.AlreadyGone():
                    outcome.result = Result.REMOVED if removed else Result.ALREADY_GONE
                    outcome.lines.append(
                        f"etcd member on {node} removed from cluster {cluster.name}"
                        if removed
                        else f"etcd cluster {cluster.name} has no member on {node} (already gone)"
                    )
                    return outcome
                case policy.Refuse() if time.monotonic() < min(settle_until, deadline):
                    await asyncio.sleep(0.2)
                case policy.Refuse(reasons=reasons):
                    outcome.result = Result.REFUSED
                    outcome.lines.extend(reasons)
                    return outcome
                case policy.MoveLeader():
                    await _move_leader(etcd, action)
                    settle_until = time.monotonic() + SETTLE
                    outcome.lines.append(
                        f"cluster {cluster.name}: leadership moved from"
                        f" {_label(view, action.from_id)} to {_label(view, action.to_id)}"
                    )
                case policy.RemoveMember():
                    await _remove(etcd, action)
                    removed = True
                    log.info("etcd member %s removed from %s", action.name, cluster.name)
                case _:
                    raise AssertionError(action)
        except EtcdRefused as error:
            if error.member_not_found:
                continue  # someone else removed it: the next look says AlreadyGone
            if not error.retryable:
                outcome.result = Result.REFUSED
                outcome.lines.append(f"etcd refused: {error}")
                return outcome
            outcome.lines.append(f"etcd asked to wait: {error}")
            await _pause(deadline)
        except EtcdError as error:
            outcome.lines.append(str(error))
            await _pause(deadline)
        if time.monotonic() >= deadline:
            outcome.lines.append(f"cluster {cluster.name}: member on {node} not removed in time")
            return outcome


async def _pause(deadline: float) -> None:
    await asyncio.sleep(max(0.0, min(RETRY, deadline - time.monotonic())))


# ---- health --------------------------------------------------------------------------------


class State(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    INACCESSIBLE = "Unable to access Etcd"  # the spec's message


@dataclass(frozen=True)
class ClusterHealth:
    cluster: str
    state: State
    healthy_members: int
    members: int
    threshold: int
    invalid: tuple[str, ...] = ()  # endpoints that answered something that is not etcd's health
    detail: str = ""


async def cluster_health(
    design: Design,
    ignore_node: str | None = None,
    *,
    secrets: access.SecretReader | None = None,
) -> list[ClusterHealth]:
    """Each cluster of ``design``, Healthy or Unhealthy as the rule reads it
    (``policy.etcd.health``), not counting ``ignore_node``'s member (the Node being torn
    down); INACCESSIBLE when no member gives the member list."""
    async with _clients(design.clusters, secrets) as clients:
        return list(
            await asyncio.gather(*(_health(clients, c, ignore_node) for c in design.clusters))
        )


async def _health(
    clients: dict[str, EtcdClient | str], cluster: ClusterDesign, ignore_node: str | None
) -> ClusterHealth:
    try:
        observed = await _observe(clients, cluster, ignore_node)
    except ClusterUnreachable as error:
        return ClusterHealth(
            cluster.name, State.INACCESSIBLE, 0, 0, cluster.threshold, (), str(error)
        )
    view = observed.view
    state = State(policy.health(view, view.target).value)
    healthy = sum(1 for m in view.members if m.healthy and m.id != view.target)
    invalid = tuple(str(p) for p in observed.probes if isinstance(p, EtcdInvalid))
    ignored = f", not counting {ignore_node}" if ignore_node else ""
    detail = (
        f"{healthy} of {len(view.members)} members healthy{ignored}; the site needs"
        f" {cluster.threshold}"
    )
    return ClusterHealth(
        cluster.name, state, healthy, len(view.members), cluster.threshold, invalid, detail
    )


# ---- adding a member back (a redeployed server) --------------------------------------------


async def observe_add(
    client: EtcdClient, cluster: ClusterDesign, node: str, expired: bool = False
) -> policy.AddView:
    """The cluster as ``policy.etcd.decide_add`` reads it, with the design's member for
    ``node`` found among etcd's members by its peer URLs."""
    members = (await observe(client, cluster, None)).view.members
    wanted = cluster.member_on(node)
    peer_urls = wanted.peer_urls if wanted else ()
    present = next((m.id for m in members if set(m.peer_urls) & set(peer_urls)), None)
    return policy.AddView(cluster.name, cluster.threshold, members, peer_urls, present, expired)


@dataclass(frozen=True)
class AddHooks:
    """What the caller is told while a member comes back: ``requested(cluster)`` is awaited
    BEFORE each MemberAdd is sent (the caller records it, so that a restart looks the member
    up rather than trusting memory); ``progress(line)`` for the operator."""

    requested: Callable[[str], Awaitable[None]]
    progress: Callable[[str], Awaitable[None]]


async def add_member(
    design: Design,
    node: str,
    hooks: AddHooks,
    *,
    timeout: float,  # noqa: ASYNC109 (the whole wait, quorum and start included)
    poll: float = RETRY,
    secrets: access.SecretReader | None = None,
) -> list[Outcome]:
    """Bring ``node``'s member back into every cluster of ``design`` that places one
    there, one cluster after the other; one Outcome per cluster (none: no member there).
    REMOVED here means "back": listed, started and healthy."""
    clusters = [c for c in design.clusters_on(node) if c.member_on(node)]
    deadline = time.monotonic() + timeout
    outcomes: list[Outcome] = []
    async with _clients(clusters, secrets) as clients:
        for cluster in clusters:
            etcd = clients[cluster.name]
            if isinstance(etcd, str):
                outcomes.append(Outcome(cluster.name, node, Result.UNREACHABLE, [etcd]))
                continue
            outcomes.append(await _bring_back(etcd, cluster, node, hooks, deadline, poll))
    return outcomes


async def _bring_back(
    etcd: EtcdClient, cluster: ClusterDesign, node: str, hooks: AddHooks,
    deadline: float, poll: float,
) -> Outcome:  # fmt: skip
    outcome = Outcome(cluster.name, node, Result.TIMED_OUT)
    said = ""
    while True:
        expired = time.monotonic() >= deadline
        try:
            action = policy.decide_add(await observe_add(etcd, cluster, node, expired))
            match action:
                case policy.MemberBack(member_id=member_id):
                    outcome.result = Result.REMOVED
                    outcome.lines.append(
                        f"etcd member {member_id:x} on {node} is back in cluster {cluster.name},"
                        " started and healthy"
                    )
                    return outcome
                case policy.CannotAdd(reason=reason):
                    outcome.result = Result.REFUSED
                    outcome.lines.append(reason)
                    return outcome
                case policy.GiveUp(reason=reason):
                    outcome.lines.append(f"cluster {cluster.name}: not back in time: {reason}")
                    return outcome
                case policy.WithdrawMember():
                    await _withdraw(etcd, action)
                    outcome.lines.append(
                        f"cluster {cluster.name}: member {action.member_id:x} for {node} never"
                        " started in time and was removed again, so that the cluster keeps its"
                        " fault tolerance"
                    )
                    return outcome
                case policy.AwaitMember(why=why):
                    line = f"etcd cluster {cluster.name}: member on {node} added, {why}"
                case policy.AwaitQuorum(reasons=reasons):
                    line = "; ".join(reasons) + ": waiting before adding the member"
                case policy.AddMember():
                    await hooks.requested(cluster.name)
                    added = await _add(etcd, action)
                    line = (
                        f"etcd cluster {cluster.name}: member {added.id:x} added for {node}"
                        f" ({', '.join(action.peer_urls)})"
                    )
                    log.info("etcd member added for %s to %s", node, cluster.name)
        except (ClusterUnreachable, EtcdError) as error:
            line = f"etcd cluster {cluster.name}: {error}"
            if expired:
                outcome.result = Result.UNREACHABLE
                outcome.lines.append(line)
                return outcome
        if line != said:
            outcome.lines.append(line)
            await hooks.progress(line)
            said = line
        await asyncio.sleep(max(0.05, min(poll, deadline - time.monotonic())))


async def _withdraw(client: EtcdClient, action: policy.WithdrawMember) -> None:
    await _remove(client, policy.RemoveMember(action.cluster, action.member_id, "", action.via))


async def _add(client: EtcdClient, action: policy.AddMember) -> Member:
    last: EtcdError | None = None
    for endpoint in action.via:
        try:
            return await client.member_add(endpoint, action.peer_urls)
        except EtcdRefused:
            raise
        except EtcdError as error:
            last = error
    raise last or EtcdUnreachable(action.cluster, "no healthy member to send the add to")
