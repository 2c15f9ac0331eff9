"""Read-only BMC reads for fencing evidence, outside host-power.

Fencing by the out-of-service taint does not take host-power's one "off" reading as the
last word: the remediation controller reads the host's BMC itself, several times over a
window, before it taints (policy.remediation, phase ``confirming-off``). This module is
that read: the host's address and credentials are resolved as host-power resolves them
(``bmc.target.target_for_host``: labelled, bound Secrets from the cache), and the read goes through
a ``BmcPool`` (the same per-endpoint slots and deadlines). It never sends a command.
"""

from __future__ import annotations

from typing import Any, Protocol

from lightkube.resources.core_v1 import Secret

from metalmend.bmc import BmcPool, BmcTarget, PowerState
from metalmend.bmc import credentials as bmc_credentials
from metalmend.bmc.target import target_for_host
from metalmend.kube.informer import Informer
from metalmend.kube.manager import Manager
from metalmend.settings import Settings


def shared_pool(manager: Manager, settings: Settings) -> BmcPool:
    """The manager's one BMC pool (host-power's commands and polls, and these reads):
    each BMC's share of calls in flight is counted once (docs/design.md, invariant 10).
    Closed when the manager stops."""

    def make() -> BmcPool:
        pool = BmcPool(settings.bmc)
        manager.on_stop(pool.close)
        return pool

    made: BmcPool = manager.shared("bmc-pool", make)
    return made


class PowerReader(Protocol):
    async def is_off(self, host: Any) -> bool:
        """Whether the host's BMC reads off now (raises the pool's BmcError)."""


def bmc_secrets(manager: Manager, settings: Settings) -> dict[str | None, Informer]:
    """The manager's informers of labelled BMC Secrets, one per namespace whose BMC Secrets
    may be read (shared: host-power and these reads watch the same ones)."""
    return {
        scope: manager.informer(
            Secret,
            namespace=scope,
            labels={bmc_credentials.SECRET_LABEL: bmc_credentials.SECRET_LABEL_VALUE},
        )
        for scope in bmc_credentials.secret_scopes(
            settings.runtime.namespace, settings.runtime.secret_namespaces
        )
    }


def credential_store(secrets: dict[str | None, Informer]) -> bmc_credentials.CredentialStore:
    """Credentials read from ``secrets``' caches, with the binding rules of docs/security.md."""
    return bmc_credentials.CredentialStore(
        {scope: informer.store for scope, informer in secrets.items()}
    )


class BmcPowerReader:
    """``PowerReader`` through the host's own BMC, with host-power's credential rules."""

    def __init__(self, manager: Manager, settings: Settings, pool: BmcPool | None = None) -> None:
        self.credentials = credential_store(bmc_secrets(manager, settings))
        self.pool = pool or shared_pool(manager, settings)

    def target(self, host: Any) -> BmcTarget:
        return target_for_host(host, self.credentials)

    async def is_off(self, host: Any) -> bool:
        return await self.pool.power_state(self.target(host)) == PowerState.OFF
