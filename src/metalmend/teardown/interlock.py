"""The teardown side of invariant 7 (docs/design.md; the rules: ``metalmend.policy.interlock``).

Before a teardown step changes anything, ``Interlock.claim`` takes the Node's
BareMetalHost(s) for the teardown: it reads the host from the API server (not a cache),
then the remediations that could hold it, asks the policy, and writes the claim
(``metalmend.dev/teardown``) conditional on the very version of the host it read. A
remediation that took the host meanwhile changed that version: the write is a 409, and
the claim is decided again from what the API server now shows. A remediation holding the
host is a 409 Conflict answer naming it, and nothing is changed.

Which hosts are the Node's (api/links.py): the host its providerID names (the namespaced
forms, or the legacy ``metal3://<uid>``); for a Node without providerID, the hosts of
the Machines whose ``status.nodeRef`` names it (the Machines a remediation would fence it
for). Machines are of every kind metalmend reads (api/resources.MACHINE_KINDS: Cluster
API's and OpenShift's ``machine.openshift.io``, as controllers/machines.py reads them for
``run``); a kind the API server does not serve has none. A Node with a providerID that is
not metal3's, or without any host, is not metal3-managed: no metalmend remediation can
power its server off or fence it (both remediation controllers refuse to fence a Node whose
providerID names another host), so nothing is claimed and the step goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from lightkube import ALL_NS, ApiError, AsyncClient

from metalmend.api import links, names
from metalmend.api.resources import MACHINE_KINDS, BareMetalHost, Metal3Remediation
from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.errors import Conflict
from metalmend.errors import errors as error_lines
from metalmend.kube import discovery, errors, writes
from metalmend.kube.store import object_key, split_key
from metalmend.log import fields
from metalmend.policy import interlock as policy
from metalmend.teardown import metrics
from metalmend.teardown.drain import get_node

log = logging.getLogger(__name__)
T = TypeVar("T")

ATTEMPTS = 5  # claims decided again after a conflict before the caller is asked to retry
BUSY_RETRIES = 8  # reads the API server answers 429 or 5xx (passing): asked again ...
BUSY_WAIT = 0.25  # ... after this many seconds, doubling (about a minute in all)


class ClaimWriter(Protocol):
    """The one change the interlock makes: a host's teardown claim."""

    async def claim_host(self, host: Any, value: str) -> Any | None:
        """Set the claim, only if ``host`` is unchanged (ApiError 409 otherwise)."""

    async def release_host(self, host: Any) -> None:
        """Remove the claim, only if ``host`` is unchanged (a claim written by this
        request, taken back when another host of the Node refuses)."""


class KubeClaimWriter:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def claim_host(self, host: Any, value: str) -> Any | None:
        return await writes.patch_metadata_map(
            self.client, BareMetalHost, host, "annotations",
            {policy.TEARDOWN_ANNOTATION: value}, require_version=True,
        )  # fmt: skip

    async def release_host(self, host: Any) -> None:
        await writes.patch_metadata_map(
            self.client, BareMetalHost, host, "annotations",
            {policy.TEARDOWN_ANNOTATION: None}, require_version=True,
        )  # fmt: skip


async def _read(read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, asked again while the API server answers that it is busy (429: priority
    and fairness, or a kind's storage still initializing; 5xx): a teardown step is not
    failed for weather. Any other answer is raised."""
    wait = BUSY_WAIT
    for _ in range(BUSY_RETRIES):
        try:
            return await read()
        except ApiError as error:
            if not errors.is_unavailable(error):
                raise
        await asyncio.sleep(wait)
        wait *= 2
    return await read()


async def _listed(client: AsyncClient, resource: Any, namespace: Any) -> list[Any]:
    """Every object of ``resource`` in ``namespace``; none when the kind is not installed
    (a cluster without metal3 or Cluster API has no host to claim)."""

    async def listing() -> list[Any]:
        return [obj async for obj in client.list(resource, namespace=namespace)]

    try:
        return await _read(listing)
    except ApiError as error:
        if errors.is_not_found(error):
            return []
        raise


async def _machines(client: AsyncClient, namespace: Any) -> list[Any]:
    """The Machines of every kind metalmend reads (Cluster API's, OpenShift's) in
    ``namespace``; a kind the API server does not serve has none (its discovery document
    says so: listing a group that is not served answers a bare 404 page, not a Status)."""
    found = []
    for kind in MACHINE_KINDS:
        group, version, plural = discovery.kind_of(kind)
        if await discovery.serves(client, f"{group}/{version}", plural) is False:
            continue
        found += await _listed(client, kind, namespace)
    return found


class Interlock:
    def __init__(
        self, client: AsyncClient, writer: ClaimWriter | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.client = client
        self.writer = writer or KubeClaimWriter(client)
        self.clock = clock

    async def claim(self, node: str, step: str, by: str) -> list[str]:
        """Claim Node ``node``'s hosts for teardown step ``step`` asked by ``by``; the keys
        of the hosts claimed (empty: none, the Node is not metal3-managed). NotFound
        without such a Node, 409 while a remediation holds one of its hosts."""
        for _ in range(ATTEMPTS):
            view, hosts = await self.observe(node, step, by)
            decision = policy.decide_claims(view, self.clock.now())
            if decision.refused:
                message = policy.refusal_message(node, decision.refusals)
                log.info("teardown refused", extra=fields(node=node, step=step, why=message))
                metrics.interlock_refused(step)
                raise Conflict(message, error_lines(*decision.refusals))
            if await self._write(decision, hosts):
                if decision.claims:
                    claimed = ", ".join(c.host for c in decision.claims)
                    log.info("teardown claim", extra=fields(node=node, step=step, hosts=claimed))
                return [h.key for h in view.hosts]
        raise Conflict(
            f"the BareMetalHost of Node {node} kept changing while it was being claimed for"
            " teardown: ask again"
        )

    async def _write(self, decision: policy.ClaimDecision, hosts: Mapping[str, Any]) -> bool:
        """Write every claim; False (and the claims of this attempt taken back) when a host
        changed since it was read."""
        written: list[Any] = []
        for claim in decision.claims:
            host = hosts[claim.host]
            try:
                written.append(await self.writer.claim_host(host, claim.value) or host)
            except ApiError as error:
                if not errors.is_conflict(error) and not errors.is_not_found(error):
                    raise
                await self._take_back(written, hosts)
                return False
        return True

    async def _take_back(self, written: list[Any], hosts: Mapping[str, Any]) -> None:
        """Remove the claims this attempt added on hosts that had none (a claim that was
        already there is left: it was another step's)."""
        for host in written:
            before = hosts.get(object_key(host))
            had = before is not None and policy.TEARDOWN_ANNOTATION in (
                before.metadata.annotations or {}
            )
            if not had:
                try:
                    await self.writer.release_host(host)
                except ApiError as error:  # changed again: the next attempt decides anew
                    if not errors.is_conflict(error) and not errors.is_not_found(error):
                        raise

    # ---- observe: from the API server, the hosts first ---------------------------------

    async def observe(
        self, name: str, step: str, by: str
    ) -> tuple[policy.TeardownView, dict[str, Any]]:
        """The view, and the host objects it was read from (their versions are what the
        claims are conditional on). The hosts are read before the remediations: one that
        started after that changed the host (its key), so the claim cannot be written."""
        node = await get_node(self.client, name)
        hosts: dict[str, Any] = {}
        for key in await self.host_keys(node):
            host = await self._host(key)
            if host is not None:
                hosts[key] = host
        facts = []
        for key, host in sorted(hosts.items()):
            remediations, requests = await self._remediations_of(key)
            annotations = dict(host.metadata.annotations or {})
            facts.append(policy.HostFacts(key, annotations, remediations, requests))
        uid = str(node.metadata.uid if node.metadata else "")
        view = policy.TeardownView(name, uid, step, by, tuple(facts))
        return view, hosts

    async def host_keys(self, node: Any) -> list[str]:
        """The hosts of Node ``node`` (module docstring)."""
        provider = links.node_provider_id(node)
        if provider:
            ref = links.parse_provider_id(provider)
            if ref is None:
                return []  # not metal3's: no remediation fences it
            if ref.host:
                return [f"{ref.namespace}/{ref.host}"]
            return sorted(
                object_key(h)
                for h in await _listed(self.client, BareMetalHost, ALL_NS)
                if h.metadata.uid == ref.uid
            )
        name = node.metadata.name
        keys = {
            key
            for machine in await _machines(self.client, ALL_NS)
            if links.node_of(machine) == [name]
            for key in links.host_of(machine)
        }
        return sorted(keys)

    async def _host(self, key: str) -> Any | None:
        namespace, name = split_key(key)
        try:
            found: Any = await _read(
                lambda: self.client.get(BareMetalHost, name, namespace=namespace)
            )
            return found
        except ApiError as error:
            if errors.is_not_found(error):
                return None
            raise

    async def _remediations_of(
        self, key: str
    ) -> tuple[tuple[policy.RemediationFacts, ...], tuple[str, ...]]:
        """The Metal3Remediations of host ``key`` (their Machine names it, or they recorded
        it) and the Machines naming it that ask for remediation by annotation."""
        namespace, _ = split_key(key)
        machines = [m for m in await _machines(self.client, namespace) if links.host_of(m) == [key]]
        requests = tuple(
            sorted(
                object_key(m)
                for m in machines
                if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
            )
        )
        # a Machine by its group and name: an owner of the other group is another Machine
        named = {(links.machine_group(m), m.metadata.name) for m in machines}
        found = []
        for remediation in await _listed(self.client, Metal3Remediation, namespace):
            status = remediation.get("status") or {}
            owners = {
                (_group(o.apiVersion), o.name)
                for o in remediation.metadata.ownerReferences or []
                if o.kind == "Machine"
            }
            proposal = {(group, remediation.metadata.name) for group, _ in named}
            mine = status.get("host") == key or bool((owners or proposal) & named)
            if mine:
                phase = status.get("phase")
                text = phase if isinstance(phase, str) else ""
                found.append(policy.RemediationFacts(object_key(remediation), text))
        return tuple(sorted(found, key=lambda r: r.name)), requests


def _group(api_version: str | None) -> str:
    return (api_version or "").rpartition("/")[0]
