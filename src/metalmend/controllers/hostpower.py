"""The host power controller: BareMetalHost power follows ``spec.online`` and the reboot
annotations of seed 000, through the host's BMC. Decisions are in policy.hostpower; this
module reads, calls ``decide`` and carries the decision out, in this order:

1. status (facts first: pendingRebootSince is on record before the host goes off),
2. annotation removals (only the suffixless form, or all on deprovisioning),
3. the power command, 4. Events.

A crash between any two steps is safe: the next reconcile reads the BMC again and the same
rules pick up where this one stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from metalmend.api import names
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcError, BmcPool, BmcTarget, parse
from metalmend.bmc import credentials as bmc_credentials
from metalmend.controllers import REGISTRY, RunOptions
from metalmend.kube.controller import DONE, Controller, Result
from metalmend.kube.manager import Manager
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend.log import fields
from metalmend.policy.hostpower import (
    Decision,
    Host,
    LastCommand,
    PowerSettings,
    decide,
    parse_stamp,
    stamp,
)

log = logging.getLogger(__name__)

ERROR_BACKOFF_CAP = 60.0  # a BMC back from an outage is noticed within a minute


class HostPowerController:
    def __init__(self, manager: Manager, options: RunOptions) -> None:
        self.manager = manager
        self.client = manager.client
        self.clock = manager.clock
        self.events = manager.events
        self.hosts = manager.informer(BareMetalHost, namespace=options.namespace)
        self.bmcs = BmcPool(timeout=options.bmc_timeout, ca_bundle=options.bmc_ca_bundle)
        self.settings = PowerSettings(
            soft_timeout=options.soft_power_off_timeout,
            poll_interval=options.power_poll_interval,
        )
        self._reported: set[tuple[str, ...]] = set()  # warnings already given, per value

    async def reconcile(self, key: str) -> Result:
        host = self.hosts.store.get(key)
        if host is None:
            return DONE
        now = self.clock.now()
        try:
            target = await self._target(host)
            power = await self.bmcs.power_state(target)
        except BmcError as error:
            return await self._failed(host, error, now)
        view = _view(host, power)
        decision = decide(view, now, self.settings)
        host = await self._write_status(host, decision) or host
        if decision.remove_annotations:
            changes: dict[str, str | None] = {k: None for k in decision.remove_annotations}
            host = await patch_annotations(self.client, BareMetalHost, host, changes) or host
        if decision.command is not None:
            try:
                await self._send(target, decision.command)
            except BmcError as error:
                return await self._failed(host, error, now, forget_command=True)
        await self._tell(host, decision)
        return Result.at(now + dt.timedelta(seconds=decision.requeue_after))

    async def _target(self, host: Any) -> BmcTarget:
        bmc = (host.get("spec") or {}).get("bmc") or {}
        address = parse(bmc.get("address") or "")
        creds = await bmc_credentials.load(
            self.client, host.metadata.namespace, bmc.get("credentialsName")
        )
        verify = not bmc.get("disableCertificateVerification", False)
        return BmcTarget(address, creds, verify_certificates=verify)

    async def _send(self, target: BmcTarget, command: str) -> None:
        if command == "on":
            await self.bmcs.power_on(target)
        else:
            await self.bmcs.power_off(target, hard=command == "hard off")

    async def _write_status(self, host: Any, decision: Decision) -> Any | None:
        status = _with_changes(host.get("status") or {}, decision.status)
        if status.get("errorType") or status.get("operationalStatus") == "error":
            status.update(errorType="", errorMessage="", errorCount=0, operationalStatus="OK")
            await self.events.normal(host, names.REASON_BMC_RECOVERED, "BMC answers again")
        status.setdefault("operationalStatus", "OK")
        return await patch_status(self.client, BareMetalHost, host, status)

    async def _failed(
        self, host: Any, error: BmcError, now: dt.datetime, forget_command: bool = False
    ) -> Result:
        status = dict(host.get("status") or {})
        count = int(status.get("errorCount") or 0) + 1
        status.update(
            errorType=error.error_type,
            errorMessage=str(error),
            errorCount=count,
            operationalStatus="error",
        )
        if forget_command:
            status.pop("lastPowerCommand", None)  # not obeyed: send it again next time
        await patch_status(self.client, BareMetalHost, host, status)
        await self.events.warning(host, names.REASON_BMC_ERROR, str(error))
        log.warning(
            "BMC error",
            extra=fields(host=f"{host.metadata.namespace}/{host.metadata.name}", error=str(error)),
        )
        retry = min(ERROR_BACKOFF_CAP, 2.0 ** min(count - 1, 10))
        return Result.at(now + dt.timedelta(seconds=retry))

    async def _tell(self, host: Any, decision: Decision) -> None:
        for event in decision.events:
            await self.events.record(host, event.type, event.reason, event.message)
        uid = str(host.metadata.uid)
        for request in decision.invalid:
            value = (host.metadata.annotations or {}).get(request.key, "")
            if self._first_time(uid, "invalid", request.key, value):
                await self.events.warning(
                    host, names.REASON_INVALID_REBOOT,
                    f"{request.key}: {request.problem}; using the default mode (soft)",
                )  # fmt: skip
        if decision.ignored and self._first_time(uid, "ignored", decision.ignored):
            await self.events.normal(host, names.REASON_REBOOT_IGNORED, decision.ignored)

    def _first_time(self, *what: str) -> bool:
        if what in self._reported:
            return False
        self._reported.add(what)
        return True


def _view(host: Any, power: Any) -> Host:
    spec = host.get("spec") or {}
    status = host.get("status") or {}
    provisioning = status.get("provisioning") or {}
    command = status.get("lastPowerCommand") or {}
    last_command = None
    if command.get("action") in ("on", "soft off", "hard off") and command.get("at"):
        last_command = LastCommand(command["action"], parse_stamp(command["at"]) or dt.datetime.min)
    return Host(
        online=bool(spec.get("online", False)),
        provisioning_state=str(provisioning.get("state") or ""),
        externally_provisioned=bool(spec.get("externallyProvisioned", False)),
        annotations=dict(host.metadata.annotations or {}),
        power=power,
        recorded_on=status.get("poweredOn"),
        last_powered_on=parse_stamp(provisioning.get("lastPoweredOn")),
        pending_reboot_since=parse_stamp(provisioning.get("pendingRebootSince")),
        last_command=last_command,
    )


def _with_changes(status: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The decision's flat field names, placed where they live in BareMetalHost status."""
    status = dict(status)
    provisioning = dict(status.get("provisioning") or {})
    for name, value in changes.items():
        if isinstance(value, dt.datetime):
            value = stamp(value)
        elif isinstance(value, dict):
            value = {k: stamp(v) if isinstance(v, dt.datetime) else v for k, v in value.items()}
        target = provisioning if name in ("lastPoweredOn", "pendingRebootSince") else status
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value
    if provisioning:
        status["provisioning"] = provisioning
    return status


def setup(manager: Manager, options: RunOptions) -> None:
    controller = HostPowerController(manager, options)
    manager.add(Controller("host-power", controller.reconcile, workers=4)).watch(controller.hosts)


REGISTRY["host-power"] = setup
