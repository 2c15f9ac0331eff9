"""``metalmend run``: connect, build the manager from the chosen controllers, serve health,
and run until SIGTERM/SIGINT (or until the leader lease is lost)."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from metalmend.controllers import REGISTRY, RunOptions
from metalmend.kube.client import ClusterUnavailable, async_client, load_config, whoami
from metalmend.kube.health import serving
from metalmend.kube.leader import LeaseTiming
from metalmend.kube.manager import LeaderElection, Manager
from metalmend.log import fields

log = logging.getLogger("metalmend.run")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass
class RunConfig:
    kubeconfig: Path | None
    controllers: list[str] = field(default_factory=list)
    leader_elect: bool = False
    leader_election_namespace: str | None = None
    lease_name: str = "metalmend"
    lease_timing: LeaseTiming = field(default_factory=LeaseTiming)
    health_host: str = "127.0.0.1"
    health_port: int = 8081
    options: RunOptions = field(default_factory=RunOptions)


def unknown_controllers(names: list[str]) -> list[str]:
    return [n for n in names if n not in REGISTRY]


def default_lease_namespace() -> str:
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


async def run(config: RunConfig) -> None:
    """Raises ClusterUnavailable before anything starts if the cluster cannot be used."""
    kubeconfig = load_config(config.kubeconfig)
    client = async_client(kubeconfig)
    current = kubeconfig.get()
    server = current.cluster.server if current else "?"
    identity = await whoami(client, server)
    log.info("connected", extra=fields(server=server, user=identity.username))
    election = None
    if config.leader_elect:
        election = LeaderElection(
            lease_name=config.lease_name,
            namespace=config.leader_election_namespace or default_lease_namespace(),
            identity=f"{socket.gethostname()}_{uuid.uuid4()}",
            timing=config.lease_timing,
        )
    manager = Manager(client, leader_election=election)
    for name in config.controllers:
        REGISTRY[name](manager, config.options)
    # A signal sets an Event; only the manager's task is cancelled, never this one, so
    # that shutting down (health server, client) runs as ordinary code.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(manager, config.health_host, config.health_port) as port:
        log.info(
            "serving /healthz /readyz /metrics",
            extra=fields(
                address=f"{config.health_host}:{port}",
                controllers=",".join(config.controllers) or "none",
            ),
        )
        running = asyncio.create_task(manager.run(), name="manager")
        stopping = asyncio.create_task(stop.wait(), name="signals")
        done, _ = await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if running in done:
            stopping.cancel()
            running.result()  # LeadershipLost, or a bug, ends the process
        else:
            log.info("stopping")
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    await client.close()


__all__ = ["ClusterUnavailable", "RunConfig", "run", "unknown_controllers"]
