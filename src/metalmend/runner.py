"""``metalmend run``: connect, build the manager from the chosen controllers, check that
the API server accepts the writes they need, serve health, and run until SIGTERM/SIGINT
(or until the leader lease is lost)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from metalmend import heap
from metalmend.api.names import REBOOT_PREFIX
from metalmend.api.resources import BareMetalHost
from metalmend.controllers import machines as machine_kinds
from metalmend.controllers import metrics, sharder
from metalmend.controllers.registry import CONTROLLERS
from metalmend.kube import admission, discovery, errors, served_schema
from metalmend.kube.client import ClusterUnavailable, async_client, load_config, whoami
from metalmend.kube.health import serving
from metalmend.kube.leader import LeaseTiming
from metalmend.kube.manager import LeaderElection, Manager
from metalmend.kube.shards import Sharding
from metalmend.log import fields
from metalmend.policy.remediation import PowerOwner
from metalmend.settings import Settings, health_address

log = logging.getLogger("metalmend.run")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass
class RunConfig:
    settings: Settings = field(default_factory=Settings)
    lease_name: str = "metalmend"
    lease_timing: LeaseTiming = field(default_factory=LeaseTiming)


def default_lease_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


async def run(config: RunConfig) -> None:
    """Raises ClusterUnavailable before anything starts if the cluster cannot be used."""
    runtime = config.settings.runtime
    controllers = runtime.controller_names
    health_host, health_port = health_address(runtime)
    kubeconfig = load_config(runtime.kubeconfig)
    client = async_client(kubeconfig)
    current = kubeconfig.get()
    server = current.cluster.server if current else "?"
    identity = await whoami(client, server)
    log.info("connected", extra=fields(server=server, user=identity.username))
    # Who owns power (docs/install.md): decided before anything runs, logged and exported.
    owner, why = await choose_power_owner(client, config.settings.remediation.power_owner)
    log.info("power owner", extra=fields(owner=str(owner), why=why))
    metrics.from_cache("power-owner", lambda: metrics.power_owner_samples(str(owner)))
    settings = dataclasses.replace(
        config.settings,
        remediation=dataclasses.replace(config.settings.remediation, power_owner=owner),
    )
    if refused := beside_power_owner(owner, controllers):
        await client.close()
        raise ClusterUnavailable(refused)
    # Before anything runs: a schema that prunes our status fields would fail silently.
    # Beside baremetal-operator, metal3-remediation (and fence-remediation, the same flow)
    # read only status.poweredOn (kept).
    fencing = ("metal3-remediation", "fence-remediation")
    checked = [c for c in controllers if owner == PowerOwner.METALMEND or c not in fencing]
    if refused := await served_schema.check(client, checked):
        await client.close()
        raise ClusterUnavailable(refused)
    election = None
    if runtime.leader_elect:
        election = LeaderElection(
            lease_name=config.lease_name,
            namespace=runtime.leader_election_namespace or default_lease_namespace(),
            identity=f"{socket.gethostname()}_{uuid.uuid4()}",
            timing=config.lease_timing,
        )
    sharding = None
    if runtime.shard and election is not None:
        member = runtime.shard_id or shard_member(socket.gethostname())
        sharding = Sharding(
            member=member,
            ring=election.lease_name,
            namespace=election.namespace,
            identity=f"{member}_{uuid.uuid4()}",
            timing=config.lease_timing,
        )
        settings = dataclasses.replace(
            settings, runtime=dataclasses.replace(settings.runtime, shard_id=member)
        )
        log.info("sharding", extra=fields(replica=member, lease=sharding.lease_name))
    manager = Manager(client, leader_election=election, sharding=sharding)
    # Cluster API's Machines, OpenShift's, or both: whichever the API server serves (one
    # log line for a kind it does not), read through one adapter (controllers/machines.py).
    # A kind served but not readable by this identity (the chart's run.machines) is skipped
    # the same way.
    ns = runtime.namespace
    machine_kinds.use_kinds(manager, await machine_kinds.served_machine_kinds(client, ns))
    # CAPM3's Metal3Machines, where served: a Cluster API Machine's host through them.
    machine_kinds.use_metal3machines(manager, await machine_kinds.served_metal3machines(client, ns))
    needs: dict[tuple[str, str, str], list[str]] = {}
    for name in controllers:
        before = set(manager.informers)
        CONTROLLERS[name](manager, settings)
        for key in manager.informers.keys() - before:
            needs.setdefault(discovery.kind_of(manager.informers[key].resource), []).append(name)
    if sharding is not None and "host-power" in controllers:
        # Not a --controllers name: the leader's half of sharding (docs/sharding.md).
        sharder.setup(manager, settings, sharding)
    # A kind not served (a CRD that a Helm upgrade did not install): said now, in one line,
    # instead of informers retrying and warning forever while /readyz stays 503.
    if missing := await discovery.unserved(
        client, [i.resource for i in manager.informers.values()]
    ):
        await client.close()
        raise ClusterUnavailable(discovery.unserved_refusal({k: needs.get(k, []) for k in missing}))
    policy_check: asyncio.Task[None] | None = None
    if "host-power" in controllers:
        problem = await check_reboot_annotation_writes(client, runtime.namespace)
        if problem:
            log.warning("start-up check failed: %s", problem)
        # The spec.bmc admission policy, which the bindings of BMC Secrets rely on: said
        # (log, Event, metric) when missing, never a readiness failure (kube/admission.py).
        own = runtime.leader_election_namespace or default_lease_namespace()
        told = await admission.check(client, manager.events, own)
        policy_check = asyncio.create_task(
            admission.keep_checking(client, manager.events, own, told), name="admission"
        )
    heap.tune(asyncio.get_running_loop())
    # A signal sets an Event; only the manager's task is cancelled, never this one, so
    # that shutting down (health server, client) runs as ordinary code.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(manager, health_host, health_port) as port:
        log.info(
            "serving /healthz /readyz /metrics",
            extra=fields(
                address=f"{health_host}:{port}",
                controllers=",".join(controllers) or "none",
            ),
        )
        running = asyncio.create_task(manager.run(), name="manager")
        stopping = asyncio.create_task(stop.wait(), name="signals")
        freezing = asyncio.create_task(freeze_when_synced(manager), name="heap")
        done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        freezing.cancel()
        if policy_check is not None:
            policy_check.cancel()
        if running in done:
            stopping.cancel()
            running.result()  # LeadershipLost, or a bug, ends the process
        else:
            log.info("stopping")
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    await client.close()


def shard_member(hostname: str) -> str:
    """A replica's default name in the ring: its host name (a Pod's name), lower-cased,
    cut to a DNS label of 50 characters (settings.SHARD_ID)."""
    kept = (c if (c.isascii() and c.isalnum()) or c == "-" else "-" for c in hostname.lower())
    name = "".join(kept)
    return name[:50].strip("-") or "metalmend"


# Controllers that send power commands, or fence on host-power's own evidence: never
# beside another power owner.
OWN_POWER_ONLY = ("host-power", "machine-remediation")


def decide_power_owner(schema: Mapping[str, Any] | None) -> tuple[PowerOwner, str]:
    """``auto``: baremetal-operator's CRD has no ``status.poweredOffFor`` (host-power's
    evidence); metalmend's has. An unreadable schema keeps metalmend's own (and the
    schema check says what it could not check)."""
    if schema is None:
        return PowerOwner.METALMEND, "the served BareMetalHost schema could not be read"
    if served_schema.pruned(schema, ("status.poweredOffFor",)):
        return (
            PowerOwner.BAREMETAL_OPERATOR,
            "the served BareMetalHost schema is baremetal-operator's (no status.poweredOffFor)",
        )
    return PowerOwner.METALMEND, "the served BareMetalHost schema is metalmend's"


async def choose_power_owner(client: AsyncClient, setting: PowerOwner) -> tuple[PowerOwner, str]:
    if setting != PowerOwner.AUTO:
        return setting, "set (remediation.power_owner)"
    return decide_power_owner(await served_schema.served_bare_metal_host_schema(client))


def beside_power_owner(owner: PowerOwner, controllers: Sequence[str]) -> str | None:
    """The refusal line when a controller that would send power commands (or fence on
    host-power's evidence) is asked for where baremetal-operator owns power."""
    clash = [c for c in controllers if c in OWN_POWER_ONLY]
    if owner != PowerOwner.BAREMETAL_OPERATOR or not clash:
        return None
    return (
        f"baremetal-operator owns power here; {', '.join(clash)} would send power commands"
        " or fence on evidence only metalmend's host-power gives: run without"
        f" {', '.join(clash)} (metal3-remediation fences through baremetal-operator;"
        " docs/install.md, 'Beside metal3')"
    )


async def freeze_when_synced(manager: Manager) -> None:
    """Once every cache is filled, its objects are long-lived: out of the garbage
    collector's sight (metalmend.heap). With sharding, again once the caches filled on
    leadership are (kube/manager.py)."""
    await manager.wait_synced()
    heap.freeze_long_lived()
    await manager.late_synced.wait()
    heap.freeze_long_lived()


CHECK_ANNOTATION = f"{REBOOT_PREFIX}metalmend-start-up-check"


async def check_reboot_annotation_writes(client: AsyncClient, namespace: str | None) -> str | None:
    """Whether the API server lets us change reboot annotations (host-power removes the
    suffixless one when a reboot is done): a server-side dry run (nothing is stored, but
    admission policies run) adding a reboot annotation to one BareMetalHost. Returns a
    line for the operator when refused, None when allowed or when there is nothing to try
    on (no host yet; a refusal then shows on the first host as WritesAccepted=False)."""
    where: str | None = None  # set once a host is found: only the patch is checked here
    try:
        host: Any = None
        async for found in client.list(BareMetalHost, namespace=namespace or "*", chunk_size=1):
            host = found
            break
        if host is None:
            return None
        where = f"{host.metadata.namespace}/{host.metadata.name}"
        await client.patch(
            BareMetalHost,
            host.metadata.name,
            {"metadata": {"annotations": {CHECK_ANNOTATION: ""}}},
            namespace=host.metadata.namespace,
            patch_type=PatchType.MERGE,
            dry_run=True,
        )
    except ApiError as error:
        if where is None or not errors.is_refused(error):
            return None  # not a refusal of the write: the controllers will say what it is
        message = " ".join(str(error.status.message or "").split())
        return (
            f"the API server refuses metalmend's changes to reboot annotations on"
            f" BareMetalHosts (dry run on {where}: {error.status.code} {message});"
            " a rebooted host would stay off. Allow metalmend's identity (RBAC, or the"
            " metalmend-reboot-writers ConfigMap of deploy/policies/)"
        )
    except (httpx2.HTTPError, OSError):
        return None
    return None


__all__ = ["ClusterUnavailable", "RunConfig", "run"]
