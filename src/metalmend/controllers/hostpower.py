"""The host power controller: BareMetalHost power follows ``spec.online`` and the reboot
annotations of metal3's reboot interface, through the host's BMC. Decisions and status
rules are in policy.hostpower; this module reads, calls the policy and carries the
decision out, in this order:

1. status (facts first: pendingRebootSince is on record before the host goes off),
2. annotation removals (only the suffixless form, or all on deprovisioning),
3. the power command, 4. Events.

A crash between any two steps is safe: the next reconcile reads the BMC again and the same
rules pick up where this one stopped; a command recorded in step 1 but never sent is sent
again at once, because this process did not send it (``policy.hostpower.send_recorded_now``).

Failing hosts are tried on their own schedule only (``policy.hostpower.RetrySettings``):
the schedule lives here, per host, in memory. A reconcile that arrives before a failing
host's next attempt (its own status write, an Event, anyone's unrelated update, a resync)
returns that time and touches neither the BMC nor the API server. After a restart the
schedule is gone: each failing host gets one immediate attempt, and its consecutive
failures are taken from ``status.errorCount`` so the next wait is as long as before.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError
from lightkube.resources.core_v1 import Secret

from metalmend.api import indexes, names
from metalmend.api.power import PowerAction
from metalmend.api.resources import BareMetalHost
from metalmend.api.stamps import parse_stamp
from metalmend.bmc import AuthenticationFailed, BmcError, BmcPool, BmcTarget, parse
from metalmend.bmc import credentials as bmc_credentials
from metalmend.bmc.errors import Busy, TimedOut
from metalmend.kube import errors
from metalmend.kube.controller import DONE, Controller, Result, beyond_status
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend.log import fields
from metalmend.policy.fencing import POWERED_OFF_FOR
from metalmend.policy.hostpower import (
    WRITES_CONDITION,
    Decision,
    Host,
    LastCommand,
    credentials_inputs,
    decide,
    error_status,
    forget_refused_command,
    recovered_status,
    refused_status,
    retry_delay,
    user_inputs,
    with_changes,
)
from metalmend.settings import Settings

log = logging.getLogger(__name__)

BUSY_JITTER = 0.2  # a busy BMC's retry_after, up to this fraction later (spreads the herd)

# /metrics outcomes of a reconcile (metalmend_reconcile_total{outcome=...})
OUTCOME_BMC_ERROR = "bmc_error"
OUTCOME_BACKOFF = "backoff"  # waited for the host's schedule: nothing read, nothing written
OUTCOME_BUSY = "busy"  # the BMC was busy with other calls: tried again shortly
OUTCOME_REFUSED = "write_refused"


@dataclass(frozen=True)
class Schedule:
    """The retry schedule of one failing host."""

    failures: int  # consecutive failed attempts
    authentication_failures: int  # ... of which the last ones were refused logins
    next_attempt: dt.datetime
    inputs: tuple[tuple[str, str], ...]  # the user's inputs then: a change retries early
    unwritten: tuple[str, str, bool] | None = None  # error status still to write (409)


class HostPowerController:
    def __init__(self, manager: Manager, settings: Settings) -> None:
        self.manager = manager
        self.client = manager.client
        self.clock = manager.clock
        self.events = manager.events
        # (CREDENTIALS) hosts indexed by the Secret they name; one labelled-Secret informer
        # per namespace whose BMC Secrets may be read.
        self.hosts = manager.informer(
            BareMetalHost,
            namespace=settings.runtime.namespace,
            indexes=indexes.of(indexes.HOSTS_BY_BMC_SECRET),
        )
        self.secrets = {
            scope: manager.informer(
                Secret,
                namespace=scope,
                labels={bmc_credentials.SECRET_LABEL: bmc_credentials.SECRET_LABEL_VALUE},
            )
            for scope in bmc_credentials.secret_scopes(
                settings.runtime.namespace, settings.runtime.secret_namespaces
            )
        }
        self.credentials = bmc_credentials.CredentialStore(
            {scope: informer.store for scope, informer in self.secrets.items()}
        )
        self.bmcs = BmcPool(settings.bmc)
        self.settings = settings.power
        self.retry = settings.power_retry
        self.random = random.Random()
        self._schedules: dict[str, Schedule] = {}  # failing hosts, by key
        self._sent: dict[str, LastCommand] = {}  # the power command this process sent
        self._reported: set[tuple[str, ...]] = set()  # warnings already given, per value

    def reset_backoff(self, key: str) -> None:
        """Forget ``key``'s retry schedule: its next reconcile tries the BMC at once.

        For the credentials Secret's watch: a Secret whose data changed may fix refused
        credentials, and an authentication failure otherwise waits up to an hour. Call it
        only when the Secret's ``data`` changed (not for metadata-only updates or relists
        that bring nothing new: each call may cost one login at the BMC), then enqueue the
        key. Synchronous and cheap: safe inside an informer handler."""
        self._schedules.pop(key, None)

    def next_attempt(self, key: str) -> dt.datetime | None:
        """When a failing host is tried next (None: not failing). For tests and tools."""
        schedule = self._schedules.get(key)
        return schedule.next_attempt if schedule is not None else None

    async def reconcile(self, key: str) -> Result:
        host = self.hosts.store.get(key)
        if host is None:
            self._schedules.pop(key, None)
            self._sent.pop(key, None)
            return DONE
        now = self.clock.now()
        schedule = self._schedules.get(key)
        if schedule is not None and now < schedule.next_attempt and not _changed(schedule, host):
            if schedule.unwritten is not None:  # the failure's status write lost a race
                await self._write_error(key, host, schedule, schedule.unwritten)
            return Result.at(schedule.next_attempt, OUTCOME_BACKOFF)
        try:
            return await self._attempt(key, host, now)
        except Busy as busy:
            # Not the BMC's failure, and no attempt: nothing written, nothing counted, and
            # no worker waits for the BMC to be free.
            delay = busy.retry_after * (1.0 + BUSY_JITTER * self.random.random())
            log.debug("BMC busy", extra=fields(host=key, retry_in=f"{delay:.2f}s"))
            return Result.at(now + dt.timedelta(seconds=delay), OUTCOME_BUSY)

    async def _attempt(self, key: str, host: Any, now: dt.datetime) -> Result:
        try:
            target = await self._target(host)
            power = await self.bmcs.power_state(target)
        except BmcError as error:
            return await self._failed(key, host, error, now)
        view = _view(host, power)
        view = dataclasses.replace(view, command_confirmed=view.last_command == self._sent.get(key))
        decision = decide(view, now, self.settings)
        # A refused removal stays reported until a removal succeeds (not cleared and set
        # again by every attempt): the facts are written first, the recovery after.
        refused_before = bool(decision.remove_annotations) and _writes_refused(host)
        try:
            host = await self._write_status(host, decision, recover=not refused_before) or host
            if decision.remove_annotations:
                changes: dict[str, str | None] = {k: None for k in decision.remove_annotations}
                host = await patch_annotations(self.client, BareMetalHost, host, changes) or host
            if refused_before:
                host = await self._write_status(host, Decision()) or host
        except ApiError as error:
            if not errors.is_refused(error):  # RBAC or an admission policy said no
                raise
            return await self._refused(key, host, error, decision, now)
        if decision.command is not None:
            try:
                await self._send(target, decision.command)
            except BmcError as error:
                forget = forget_refused_command(decision.command, isinstance(error, TimedOut))
                return await self._failed(key, host, error, now, forget_command=forget)
            recorded = decision.status.get("lastPowerCommand") or {}
            self._sent[key] = LastCommand(decision.command, recorded.get("at", now))
        self._schedules.pop(key, None)
        await self._tell(host, decision)
        return Result.at(now + dt.timedelta(seconds=decision.requeue_after))

    async def _target(self, host: Any) -> BmcTarget:
        """The host's BMC and credentials, from the cache; CredentialsError (reported on the
        host, nothing sent) when its Secret is missing, unlabelled or not bound to it."""
        bmc = (host.get("spec") or {}).get("bmc") or {}
        address = parse(bmc.get("address") or "")
        namespace, name = str(host.metadata.namespace), str(host.metadata.name)
        creds = self.credentials.lookup(namespace, name, bmc.get("credentialsName"))
        verify = not bmc.get("disableCertificateVerification", False)
        return BmcTarget(address, creds, verify_certificates=verify, namespace=namespace)

    def _hosts_naming_secret(self, old: Any | None, new: Any | None) -> list[str]:
        """A BMC Secret's data or binding changed, or it appeared: its hosts run again at
        once, even those backing off after a refused login or a refused Secret (the fix
        may be this very change). Gone: its hosts run again to report it (on backoff)."""
        secret = new if new is not None else old
        if secret is None or not bmc_credentials.credentials_changed(old, new):
            return []
        hosts = self.hosts.store.by_index(indexes.HOSTS_BY_BMC_SECRET.name, object_key(secret))
        keys = [object_key(h) for h in hosts]
        if new is not None:
            for key in keys:
                self.reset_backoff(key)
        return keys

    async def _send(self, target: BmcTarget, command: PowerAction) -> None:
        await self.bmcs.act(target, command)

    async def _write_status(
        self, host: Any, decision: Decision, *, recover: bool = True
    ) -> Any | None:
        status = with_changes(host.get("status") or {}, decision.status)
        recovered = False
        if recover:
            status, recovered = recovered_status(status)
        if recovered:
            await self.events.normal(host, names.REASON_BMC_RECOVERED, "BMC answers again")
        return await patch_status(self.client, BareMetalHost, host, status)

    async def _failed(
        self, key: str, host: Any, error: BmcError, now: dt.datetime, forget_command: bool = False
    ) -> Result:
        """One failed attempt: schedule the next, report it once on the host."""
        previous = self._schedules.get(key)
        if previous is not None:
            failures = previous.failures + 1
            authentication = previous.authentication_failures
        else:  # first failure, or first attempt after a restart: continue where status is
            failures = int((host.get("status") or {}).get("errorCount") or 0) + 1
            authentication = 0
        auth = isinstance(error, AuthenticationFailed)
        authentication = authentication + 1 if auth else 0
        delay = retry_delay(failures, authentication, self.random.random(), self.retry)
        spec, annotations = host.get("spec") or {}, host.metadata.annotations or {}
        message = str(error)
        schedule = Schedule(
            failures=failures,
            authentication_failures=authentication,
            next_attempt=now + dt.timedelta(seconds=delay),
            inputs=(credentials_inputs if auth else user_inputs)(spec, annotations),
            unwritten=(error.error_type, message, forget_command),
        )
        self._schedules[key] = schedule
        await self._write_error(key, host, schedule, schedule.unwritten)
        await self.events.warning(host, names.REASON_BMC_ERROR, message)
        log.warning(
            "BMC error",
            extra=fields(host=key, error=message, attempt=failures, retry_in=f"{delay:.1f}s"),
        )
        return Result.at(schedule.next_attempt, OUTCOME_BMC_ERROR)

    async def _write_error(
        self, key: str, host: Any, schedule: Schedule, error: tuple[str, str, bool] | None
    ) -> None:
        """Write the failed attempt to status (counted once: ``errorCount`` counts attempts).
        A conflict leaves it for the next reconcile, which writes it without a BMC call."""
        if error is None:
            return
        error_type, message, forget = error
        status = error_status(
            host.get("status") or {}, error_type, message, counted=True, forget_command=forget
        )
        try:
            await patch_status(self.client, BareMetalHost, host, status)
        except ApiError as problem:
            if errors.is_refused(problem):  # said by the Event and the log instead
                log.warning(
                    "cannot write the BMC error to status",
                    extra=fields(host=key, error=str(problem.status.message)),
                )
            elif errors.is_not_found(problem) or errors.is_conflict(problem):
                self._schedules[key] = schedule  # still unwritten; the retry is fresh
                return
            else:
                raise
        if forget:
            self._sent.pop(key, None)
        self._schedules[key] = dataclasses.replace(schedule, unwritten=None)

    async def _refused(
        self, key: str, host: Any, error: ApiError, decision: Decision, now: dt.datetime
    ) -> Result:
        """The API server refused our status or annotation write (RBAC, or an admission
        policy such as deploy/policies/reboot-annotation-writers.yaml without our identity):
        say so on the host where an operator looks, and retry on the ordinary schedule."""
        what = (
            f"removal of {', '.join(decision.remove_annotations)}"
            if decision.remove_annotations
            else "status update"
        )
        reason = " ".join(str(error.status.message or "").split())[:500]
        message = (
            f"the API server refused metalmend's {what} ({errors.code(error)}): {reason};"
            " the host's reboot cannot finish until metalmend may write it"
        )
        previous = self._schedules.get(key)
        failures = (previous.failures if previous is not None else 0) + 1
        delay = retry_delay(failures, 0, self.random.random(), self.retry)
        spec, annotations = host.get("spec") or {}, host.metadata.annotations or {}
        self._schedules[key] = Schedule(
            failures, 0, now + dt.timedelta(seconds=delay), user_inputs(spec, annotations)
        )
        status = refused_status(
            with_changes(host.get("status") or {}, decision.status), message, now
        )
        try:
            await patch_status(self.client, BareMetalHost, host, status)
        except ApiError as problem:  # the status write itself refused: the Event must do
            log.debug("cannot report refusal in status", extra=fields(host=key, error=str(problem)))
        await self.events.warning(host, names.REASON_WRITE_REFUSED, message)
        log.warning("write refused", extra=fields(host=key, error=message))
        return Result.at(self._schedules[key].next_attempt, OUTCOME_REFUSED)

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
    if command.get("action") in tuple(PowerAction) and command.get("at"):
        action = PowerAction(command["action"])
        last_command = LastCommand(action, parse_stamp(command["at"]) or dt.datetime.min)
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
        powered_off_for=_keys(status.get(POWERED_OFF_FOR)),
    )


def _keys(listed: Any) -> tuple[str, ...]:
    """status.poweredOffFor as written by us; anything else lists nothing."""
    if not isinstance(listed, list):
        return ()
    return tuple(k for k in listed if isinstance(k, str))


# The state machine tests (tests/unit/test_remediation_statemachine.py) model this step.
_with_changes = with_changes


def _changed(schedule: Schedule, host: Any) -> bool:
    """A user changed what they ask of the host since its last failed attempt."""
    spec, annotations = host.get("spec") or {}, host.metadata.annotations or {}
    inputs = credentials_inputs if schedule.authentication_failures else user_inputs
    return inputs(spec, annotations) != schedule.inputs


def _writes_refused(host: Any) -> bool:
    conditions = (host.get("status") or {}).get("conditions") or []
    return any(c.get("type") == WRITES_CONDITION and c.get("status") == "False" for c in conditions)


def host_power_relevant(old: Any | None, new: Any | None) -> bool:
    """host-power's watch predicate: a change beyond status (spec, annotations, labels,
    deletion), or a provisioning state written by someone else (it decides whether reboot
    annotations are honoured). Status-only updates - our own writes above all - do not
    wake the key; the host's poll and retry schedules do."""
    if beyond_status(old, new):
        return True
    return bool(_provisioning_state(old) != _provisioning_state(new))


def _provisioning_state(host: Any) -> Any:
    return ((host.get("status") or {}).get("provisioning") or {}).get("state")


def setup(manager: Manager, settings: Settings) -> None:
    controller = HostPowerController(manager, settings)
    # More workers than BMC slots: a call that holds a slot until its deadline holds a
    # worker too, and healthy hosts must still find a free one (busy BMCs never block:
    # the pool answers Busy and the key is requeued).
    workers = controller.bmcs.settings.max_in_flight + 4
    runner = manager.add(Controller("host-power", controller.reconcile, workers=workers))
    manager.on_stop(controller.bmcs.close)
    runner.watch(controller.hosts, predicate=host_power_relevant)
    for secrets in controller.secrets.values():
        runner.watch(secrets, controller._hosts_naming_secret)
