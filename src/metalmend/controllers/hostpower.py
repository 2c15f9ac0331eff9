"""The host power controller: BareMetalHost power follows ``spec.online`` and the reboot
annotations of metal3's reboot interface, through the host's BMC. In the shape of
docs/decide-act.md: ``begin`` reads the host from the cache and its power from the BMC and
asks policy.hostpower to decide; ``act`` carries each action out through the Writer, in
the decision's order:

1. status (facts first: pendingRebootSince is on record before the host goes off),
2. annotation removals (only the suffixless form, or all on deprovisioning),
3. the power command, 4. Events.

A crash between any two steps is safe: the next reconcile reads the BMC again and the same
rules pick up where this one stopped; a command recorded in step 1 but never sent is sent
again at once, because this process did not send it (``policy.hostpower.send_recorded_now``).

Failing hosts are tried on their own schedule only (``policy.hostpower.after_failure``);
the schedule is kept here, per host, in memory. A reconcile that arrives before a failing
host's next attempt (its own status write, an Event, anyone's unrelated update, a resync)
returns that time and touches neither the BMC nor the API server. After a restart the
schedule is gone: each failing host gets one immediate attempt, and its consecutive
failures are taken from ``status.errorCount`` so the next wait is as long as before.
The status rules of a failed attempt, a recovery and a refused write are
``PowerStatus.failed``, ``recovered`` and ``refused`` in the policy.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import random
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError

from metalmend.api import indexes, names
from metalmend.api.power import PowerState
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import AuthenticationFailed, BmcError, BmcPool, BmcTarget, parse
from metalmend.bmc import credentials as bmc_credentials
from metalmend.bmc.errors import Busy, TimedOut
from metalmend.controllers import metrics
from metalmend.controllers.powerreads import bmc_secrets, credential_store, shared_pool
from metalmend.kube import errors
from metalmend.kube.controller import DONE, Controller, Result, beyond_status
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.log import fields
from metalmend.policy import hostpower as policy
from metalmend.settings import Settings

log = logging.getLogger(__name__)

BUSY_JITTER = 0.2  # a busy BMC's retry_after, up to this fraction later (spreads the herd)

# /metrics outcomes of a reconcile (metalmend_reconcile_total{outcome=...})
OUTCOME_BMC_ERROR = "bmc_error"
OUTCOME_BACKOFF = "backoff"  # waited for the host's schedule: nothing read, nothing written
OUTCOME_BUSY = "busy"  # the BMC was busy with other calls: tried again shortly
OUTCOME_REFUSED = "write_refused"


@dataclass
class Attempt:
    """One reconcile that reached the BMC: what it decided on, and the host as last
    written (each versioned write of the decision carries the version before it)."""

    key: str
    host: Any
    target: BmcTarget
    now: dt.datetime
    ended: Result | None = None  # set when an action failed: the reconcile ends there


class HostPowerController:
    def __init__(
        self,
        manager: Manager,
        settings: Settings,
        *,
        writer: Writer | None = None,
        bmcs: BmcPool | None = None,
    ) -> None:
        self.clock = manager.clock
        # (CREDENTIALS) hosts indexed by the Secret they name; one labelled-Secret informer
        # per namespace whose BMC Secrets may be read.
        # Sharded (docs/sharding.md): only the hosts the leader assigned to this replica.
        self.member = settings.runtime.shard_id if settings.runtime.shard else None
        self.hosts = manager.informer(
            BareMetalHost,
            namespace=settings.runtime.namespace,
            labels={names.SHARD_REPLICA_LABEL: self.member} if self.member else None,
            indexes=indexes.of(indexes.HOSTS_BY_BMC_SECRET),
        )
        self.secrets = bmc_secrets(manager, settings)
        self.credentials = credential_store(self.secrets)
        self.bmcs = bmcs or shared_pool(manager, settings)
        self.writer = writer or KubeWriter(manager.client, manager.events, self.bmcs)
        self.settings = settings.power
        self.retry = settings.power_retry
        self.random = random.Random()
        self._schedules: dict[str, policy.Schedule] = {}  # failing hosts, by key
        self._sent: dict[str, policy.LastCommand] = {}  # the power command this process sent
        self._reported: set[tuple[str, ...]] = set()  # ReportOnce topics already told
        self._waiting: set[str] = set()  # hosts told they wait for other namespaces' calls
        self._poll_every = self.settings.poll_interval  # as last said in the log
        self.runner: Controller | None = None  # set by setup: its queue knows background keys

    def reset_backoff(self, key: str) -> None:
        """Forget ``key``'s retry schedule: its next reconcile tries the BMC at once.

        For the credentials Secret's watch: a Secret whose data changed may fix refused
        credentials, and an authentication failure otherwise waits up to an hour. Call it
        only when the Secret's ``data`` changed (not for metadata-only updates or relists
        that bring nothing new: each call may cost one login at the BMC), then enqueue the
        key. Synchronous and cheap: safe inside an informer handler."""
        self._schedules.pop(key, None)

    def cache_samples(self) -> list[metrics.Sample]:
        """/metrics gauges from the host cache: reboot requests pending, hosts in error,
        the idle poll's interval."""
        hosts = self.hosts.store.values()
        return (
            metrics.reboot_samples(hosts, self.clock.now())
            + metrics.bmc_error_samples(hosts)
            + metrics.power_samples(hosts)
            + metrics.poll_interval_samples(self.settings.poll_interval, self.poll_every())
        )

    def poll_every(self) -> float:
        """The interval idle polls keep now (``policy.hostpower.poll_every`` over the hosts cached).
        The log says when the poll budget starts or stops stretching it."""
        every = policy.poll_every(self.settings, len(self.hosts.store))
        stretched, was = every > self.settings.poll_interval, self._poll_every
        if stretched != (was > self.settings.poll_interval):
            if stretched:
                log.warning(
                    "host-power: %d hosts at one read every %gs would be more than"
                    " power.poll_budget (%g BMC reads a second): each host's power is read"
                    " every %gs instead (metalmend_power_poll_interval_seconds); raise"
                    " --power-poll-budget (each read is a new TLS connection) or split the hosts"
                    " between processes (--namespace)",
                    len(self.hosts.store), self.settings.poll_interval,
                    self.settings.poll_budget, every,
                )  # fmt: skip
            else:
                log.info(
                    "host-power: %d hosts fit power.poll_budget again: each host's power is"
                    " read every %gs (power.poll_interval)",
                    len(self.hosts.store), every,
                )  # fmt: skip
        self._poll_every = every
        return every

    def next_attempt(self, key: str) -> dt.datetime | None:
        """When a failing host is tried next (None: not failing). For tests and tools."""
        schedule = self._schedules.get(key)
        return schedule.next_attempt if schedule is not None else None

    # ---- reconcile: begin (schedule, BMC read, decide), act, succeeded ---------------------

    async def reconcile(self, key: str) -> Result:
        if self.member is not None:
            host = self.hosts.store.get(key)
            if host is not None and names.SHARD_DRAIN_LABEL in (host.metadata.labels or {}):
                return await self.let_go(key, host)
        begun = await self.begin(key)
        if isinstance(begun, Result):
            return begun
        attempt, decision = begun
        for action in decision.actions:
            await self.act(attempt, action)
            if attempt.ended is not None:
                return attempt.ended
        return self.succeeded(attempt, decision)

    async def let_go(self, key: str, host: Any) -> Result:
        """The leader moves the host to another replica (docs/sharding.md): acknowledge by
        removing both shard labels, on the version that asked. Nothing of this host is in
        flight here (the work queue runs one reconcile of a key at a time), and nothing
        more will be: the host leaves this replica's informer with its label. What a
        reboot in progress needs is in its status, where the new owner reads it."""
        changes: dict[str, str | None] = {
            names.SHARD_REPLICA_LABEL: None,
            names.SHARD_DRAIN_LABEL: None,
        }
        await self.writer.patch_metadata(
            BareMetalHost, host, "labels", changes, require_version=True
        )
        self._schedules.pop(key, None)
        self._sent.pop(key, None)
        self._waiting.discard(key)
        log.info("host handed over", extra=fields(host=key, replica=self.member))
        return DONE

    async def begin(self, key: str) -> Result | tuple[Attempt, policy.Decision]:
        """Wait for the host's schedule, or read its BMC and decide. A Result when the
        reconcile ends here (host gone, backing off, BMC busy or failing)."""
        host = self.hosts.store.get(key)
        if host is None:
            self._schedules.pop(key, None)
            self._sent.pop(key, None)
            return DONE
        now = self.clock.now()
        schedule = self._schedules.get(key)
        if (
            schedule is not None
            and now < schedule.next_attempt
            and not _user_changed(schedule, host)
        ):
            if schedule.unwritten is not None:  # the failure's status write lost a race
                await self._write_error(key, host, schedule)
            return Result.at(schedule.next_attempt, OUTCOME_BACKOFF)
        background = self._background(key)
        try:
            target = self._target(host)
            power = await self.bmcs.power_state(target, background=background)
        except Busy as busy:
            if not background:
                await self._report_waiting(key, host, busy)
            # Nothing read, nothing done: a poll stays a background poll (kube.controller)
            return dataclasses.replace(self._busy(key, busy, now), same_priority=True)
        except BmcError as error:
            self._waiting.discard(key)
            return await self._failed(key, host, error, now)
        self._waiting.discard(key)
        view = self.observe(key, host, power)
        return Attempt(key, host, target, now), policy.decide(view, now, self.settings)

    def _background(self, key: str) -> bool:
        """Whether this reconcile is a routine poll (the work queue handed the key out in
        the background): its BMC read then leaves a slot to reconciles of changes."""
        return self.runner is not None and self.runner.queue.handed_out_in_background(key)

    def observe(self, key: str, host: Any, power: PowerState) -> policy.Host:
        spec = host.get("spec") or {}
        status = policy.PowerStatus.from_wire(host.get("status") or {})
        provisioning = (host.get("status") or {}).get("provisioning") or {}
        return policy.Host(
            online=bool(spec.get("online", False)),
            provisioning_state=str(provisioning.get("state") or ""),
            externally_provisioned=bool(spec.get("externallyProvisioned", False)),
            annotations=dict(host.metadata.annotations or {}),
            power=power,
            status=status,
            command_confirmed=status.last_command == self._sent.get(key),
            poll_phase=policy.poll_phase(key),
            poll_every=self.poll_every(),
        )

    async def act(self, attempt: Attempt, action: policy.Action) -> None:
        """Carry one action out through the writer; a refused write or a failed send ends
        the attempt (``attempt.ended``) after reporting it."""
        writer, host = self.writer, attempt.host
        try:
            match action:
                case policy.SetStatus(status=status):
                    wire = status.to_wire(host.get("status") or {})
                    attempt.host = await writer.patch_status(BareMetalHost, host, wire) or host
                case policy.RemoveAnnotations(keys=keys):
                    changes: dict[str, str | None] = {k: None for k in keys}
                    new = await writer.patch_metadata(BareMetalHost, host, "annotations", changes)
                    attempt.host = new or host
                case policy.SendPower(command=command):
                    await self._send(attempt, command)
                case policy.Event(type=kind, reason=reason, message=message):
                    await writer.record_event(host, kind, reason, message)
                case policy.ReportOnce(event=event, topic=topic):
                    if (str(host.metadata.uid), *topic) not in self._reported:
                        self._reported.add((str(host.metadata.uid), *topic))
                        await writer.record_event(host, event.type, event.reason, event.message)
        except ApiError as error:
            if not errors.is_refused(error):  # RBAC or an admission policy said no
                raise
            attempt.ended = await self._refused(attempt, action, error)

    async def _send(self, attempt: Attempt, command: policy.LastCommand) -> None:
        try:
            await self.writer.power(attempt.target, command.action)
        except Busy as busy:
            # Recorded, not sent: unconfirmed, so the next attempt sends it at once.
            await self._report_waiting(attempt.key, attempt.host, busy)
            attempt.ended = self._busy(attempt.key, busy, attempt.now)
            return
        except BmcError as error:
            self._waiting.discard(attempt.key)
            forget = policy.forget_refused_command(command.action, isinstance(error, TimedOut))
            attempt.ended = await self._failed(
                attempt.key, attempt.host, error, attempt.now, forget_command=forget
            )
            return
        self._waiting.discard(attempt.key)
        self._sent[attempt.key] = command

    def succeeded(self, attempt: Attempt, decision: policy.Decision) -> Result:
        self._schedules.pop(attempt.key, None)
        return Result.at(decision.requeue_at)

    # ---- the BMC, its credentials and its failures ------------------------------------------

    def _target(self, host: Any) -> BmcTarget:
        """The host's BMC and credentials, from the cache; CredentialsError (reported on the
        host, nothing sent) when its Secret is missing, unlabelled or not bound to it."""
        bmc = (host.get("spec") or {}).get("bmc") or {}
        address = parse(bmc.get("address") or "")
        namespace, name = str(host.metadata.namespace), str(host.metadata.name)
        creds = self.credentials.lookup(namespace, name, bmc.get("credentialsName"))
        verify = not bmc.get("disableCertificateVerification", False)
        return BmcTarget(
            address, creds, verify_certificates=verify, namespace=namespace,
            waiter=f"{namespace}/{name}",
        )  # fmt: skip

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

    async def _report_waiting(self, key: str, host: Any, busy: Busy) -> None:
        """A host whose command waits for a BMC endpoint busy with other namespaces' calls
        says so, once per wait (an Event: the wait is short-lived by design, and status
        is the BMC's outcome, not its queue)."""
        if busy.others == 0 or key in self._waiting:
            return
        self._waiting.add(key)
        await self.writer.record_event(host, "Normal", names.REASON_BMC_WAITING, str(busy))

    def _busy(self, key: str, busy: Busy, now: dt.datetime) -> Result:
        """Not the BMC's failure, and no attempt: nothing written, nothing counted, and no
        worker waits for the BMC to be free."""
        delay = busy.retry_after * (1.0 + BUSY_JITTER * self.random.random())
        log.debug("BMC busy", extra=fields(host=key, retry_in=f"{delay:.2f}s"))
        return Result.at(now + dt.timedelta(seconds=delay), OUTCOME_BUSY)

    async def _failed(
        self, key: str, host: Any, error: BmcError, now: dt.datetime, forget_command: bool = False
    ) -> Result:
        """One failed attempt: schedule the next (policy.hostpower.after_failure), report it
        once on the host."""
        status = policy.PowerStatus.from_wire(host.get("status") or {})
        schedule = policy.after_failure(
            self._schedules.get(key),
            status,
            authentication=isinstance(error, AuthenticationFailed),
            spec=host.get("spec") or {},
            annotations=host.metadata.annotations or {},
            now=now,
            jitter=self.random.random(),
            settings=self.retry,
        )
        message = str(error)
        schedule = dataclasses.replace(
            schedule, unwritten=(error.error_type, message, forget_command)
        )
        self._schedules[key] = schedule
        await self._write_error(key, host, schedule)
        await self.writer.record_event(host, "Warning", names.REASON_BMC_ERROR, message)
        delay = (schedule.next_attempt - now).total_seconds()
        log.warning(
            "BMC error",
            extra=fields(host=key, error=message, attempt=schedule.failures,
                         retry_in=f"{delay:.1f}s"),
        )  # fmt: skip
        return Result.at(schedule.next_attempt, OUTCOME_BMC_ERROR)

    async def _write_error(self, key: str, host: Any, schedule: policy.Schedule) -> None:
        """Write the failed attempt to status (counted once: ``errorCount`` counts attempts).
        A conflict leaves it for the next reconcile, which writes it without a BMC call."""
        if schedule.unwritten is None:
            return
        error_type, message, forget = schedule.unwritten
        current = host.get("status") or {}
        failed = policy.PowerStatus.from_wire(current).failed(
            error_type, message, forget_command=forget
        )
        try:
            await self.writer.patch_status(BareMetalHost, host, failed.to_wire(current))
        except ApiError as problem:
            if errors.is_refused(problem):  # said by the Event and the log instead
                log.warning(
                    "cannot write the BMC error to status",
                    extra=fields(host=key, error=str(problem.status.message)),
                )
            elif errors.is_not_found(problem) or errors.is_conflict(problem):
                return  # still unwritten; the retry is fresh
            else:
                raise
        if forget:
            self._sent.pop(key, None)
        self._schedules[key] = dataclasses.replace(schedule, unwritten=None)

    async def _refused(self, attempt: Attempt, action: policy.Action, error: ApiError) -> Result:
        """The API server refused our status or annotation write (RBAC, or an admission
        policy such as deploy/policies/reboot-annotation-writers.yaml without our identity):
        say so on the host where an operator looks, and retry on the ordinary schedule."""
        key, host, now = attempt.key, attempt.host, attempt.now
        current = host.get("status") or {}
        if isinstance(action, policy.RemoveAnnotations):
            what = f"removal of {', '.join(action.keys)}"
            intended = policy.PowerStatus.from_wire(current)
        else:
            what = "status update"
            intended = (
                action.status
                if isinstance(action, policy.SetStatus)
                else policy.PowerStatus.from_wire(current)
            )
        reason = " ".join(str(error.status.message or "").split())[:500]
        message = (
            f"the API server refused metalmend's {what} ({errors.code(error)}): {reason};"
            " the host's reboot cannot finish until metalmend may write it"
        )
        self._schedules[key] = policy.after_failure(
            self._schedules.get(key),
            intended,
            authentication=False,
            spec=host.get("spec") or {},
            annotations=host.metadata.annotations or {},
            now=now,
            jitter=self.random.random(),
            settings=self.retry,
        )
        status = intended.refused(message, now).to_wire(current)
        try:
            await self.writer.patch_status(BareMetalHost, host, status)
        except ApiError as problem:  # the status write itself refused: the Event must do
            log.debug("cannot report refusal in status", extra=fields(host=key, error=str(problem)))
        await self.writer.record_event(host, "Warning", names.REASON_WRITE_REFUSED, message)
        log.warning("write refused", extra=fields(host=key, error=message))
        return Result.at(self._schedules[key].next_attempt, OUTCOME_REFUSED)


def _user_changed(schedule: policy.Schedule, host: Any) -> bool:
    spec, annotations = host.get("spec") or {}, host.metadata.annotations or {}
    return policy.user_changed(schedule, spec, annotations)


def host_power_relevant(old: Any | None, new: Any | None) -> bool:
    """host-power's watch predicate: a change beyond status (spec, annotations, labels,
    deletion), or a provisioning state written by someone else (it decides whether reboot
    annotations are honoured). Status-only updates - our own writes above all - do not
    wake the key; the host's poll and retry schedules do."""
    if beyond_status(old, new):
        return True
    return bool(provisioning_state(old) != provisioning_state(new))


def provisioning_state(host: Any) -> Any:
    return ((host.get("status") or {}).get("provisioning") or {}).get("state")


def setup(manager: Manager, settings: Settings) -> None:
    controller = HostPowerController(manager, settings)
    # More workers than BMC slots: a call that holds a slot until its deadline holds a
    # worker too, and healthy hosts must still find a free one (busy BMCs never block:
    # the pool answers Busy and the key is requeued).
    workers = controller.bmcs.settings.max_in_flight + 4
    runner = manager.add(
        Controller("host-power", controller.reconcile, workers=workers), sharded=True
    )
    controller.runner = runner
    metrics.from_cache("host-power", lambda: controller.cache_samples())
    metrics.from_cache(
        "bmc-waiting", lambda: metrics.bmc_waiting_samples(controller.bmcs.waiting_samples())
    )
    # A host whose namespace's turn at its BMC endpoint comes is handed out at once.
    controller.bmcs.wake = runner.queue.add
    runner.watch(controller.hosts, predicate=host_power_relevant)
    for secrets in controller.secrets.values():
        runner.watch(secrets, controller._hosts_naming_secret)
