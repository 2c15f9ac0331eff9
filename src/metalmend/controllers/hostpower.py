"""The host power controller: BareMetalHost power follows ``spec.online`` and the reboot
annotations of metal3's reboot interface, through the host's BMC. In the shape of
docs/decide-act.md, one observe -> decide -> act per reconcile:

- ``observe`` gathers one frozen snapshot (``policy.hostpower.Observed``): the host from
  the cache, this process's memory of it, and its power read from the BMC, unless it
  waits for its retry schedule (``policy.hostpower.reads_bmc``);
- ``decide`` is ``policy.hostpower.decide_reconcile``, pure: every rule, the retry
  schedule and the memory kept between reconciles included;
- ``act`` carries each action out through the Writer, in the decision's order: status
  (facts first: pendingRebootSince is on record before the host goes off), annotation
  removals, the power command, the memory, Events.

An action that fails (the BMC refuses or is busy with the command, the API server refuses
a write) ends the decision there: the snapshot, with the host as last written and what
ended it, is decided again, and that decision is carried out instead.

A crash between any two steps is safe: the next reconcile reads the BMC again and the same
rules pick up where this one stopped; a command recorded in step 1 but never sent is sent
again at once, because this process did not send it (``policy.hostpower.send_recorded_now``).

Failing hosts are tried on their own schedule only (``policy.hostpower.after_failure``),
kept in this process's memory of the host (``policy.hostpower.Memory``). A reconcile that
arrives before a failing host's next attempt (its own status write, an Event, anyone's
unrelated update, a resync) returns that time and touches neither the BMC nor the API
server. After a restart the memory is gone: each failing host gets one immediate attempt,
and its consecutive failures are taken from ``status.errorCount`` so the next wait is as
long as before. The status rules of a failed attempt, a recovery and a refused write are
``PowerStatus.failed``, ``recovered`` and ``refused`` in the policy.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from dataclasses import dataclass, replace
from typing import Any

from lightkube import ApiError

from metalmend.api import indexes, names
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import AuthenticationFailed, BmcError, BmcPool, BmcTarget
from metalmend.bmc import credentials as bmc_credentials
from metalmend.bmc.errors import Busy, TimedOut
from metalmend.bmc.target import target_for_host
from metalmend.controllers import metrics
from metalmend.controllers.powerreads import bmc_secrets, credential_store, shared_pool
from metalmend.kube import errors
from metalmend.kube.controller import Controller, Result, beyond_status
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writer import KubeWriter, Writer
from metalmend.log import fields
from metalmend.policy import hostpower as policy
from metalmend.settings import Settings

log = logging.getLogger(__name__)

NOTHING_KEPT = policy.Memory()


@dataclass(frozen=True)
class Attempt:
    """One reconcile: what it decides on (``observed``), the host object as last written
    (each versioned write of the decision carries the version before it), and its BMC
    (None: not read)."""

    observed: policy.Observed
    host: Any  # None: not cached (the decision then touches no host)
    target: BmcTarget | None = None

    @property
    def key(self) -> str:
        return self.observed.key

    def ended(self, why: policy.Ended) -> Attempt:
        """The attempt as decided again after ``why``: the host as last written."""
        observed = replace(self.observed, host=host_object(self.host), ended=why)
        return replace(self, observed=observed)


def host_object(host: Any | None) -> policy.HostObject | None:
    """The parts of a cached BareMetalHost that host-power reads, as written."""
    if host is None:
        return None
    return policy.HostObject(
        uid=str(host.metadata.uid),
        spec=host.get("spec") or {},
        annotations=dict(host.metadata.annotations or {}),
        status=host.get("status") or {},
    )


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
        # Where this process's idle-poll batches fall in the grid (``spread_poll``):
        # drawn once, so that replicas sharing a machine do not batch at the same moment.
        self.grid_shift = self.random.random()
        # What this process keeps of each host between reconciles; only decisions change it.
        self.memory: dict[str, policy.Memory] = {}
        self._poll_every = self.settings.poll_interval  # as last said in the log
        self.runner: Controller | None = None  # set by setup: its queue knows background keys

    def reset_backoff(self, key: str) -> None:
        """Forget ``key``'s retry schedule: its next reconcile tries the BMC at once.

        For the credentials Secret's watch: a Secret whose data changed may fix refused
        credentials, and an authentication failure otherwise waits up to an hour. Call it
        only when the Secret's ``data`` changed (not for metadata-only updates or relists
        that bring nothing new: each call may cost one login at the BMC), then enqueue the
        key. Synchronous and cheap: safe inside an informer handler."""
        self._remember(key, replace(self.memory.get(key, NOTHING_KEPT), schedule=None))

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
        """The interval idle polls keep now (``policy.hostpower.poll_every`` over the hosts
        cached), as the log last said it."""
        return self._said_poll_every(policy.poll_every(self.settings, len(self.hosts.store)))

    def _said_poll_every(self, every: float) -> float:
        """The log says when the poll budget starts or stops stretching the idle polls."""
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
        schedule = self.memory.get(key, NOTHING_KEPT).schedule
        return schedule.next_attempt if schedule is not None else None

    # ---- reconcile: observe, decide, act ----------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        attempt = await self.observe(key)
        return await self.carry_out(attempt, self.decide(attempt))

    async def observe(self, key: str) -> Attempt:
        """The snapshot of one reconcile, read-only: the host from the cache, this
        process's memory of it, and its BMC's answer unless the policy says not to read
        it (a host waiting for its schedule, gone or handed over)."""
        host = self.hosts.store.get(key)
        labels = (host.metadata.labels or {}) if host is not None else {}
        observed = policy.Observed(
            key=key,
            now=self.clock.now(),
            host=host_object(host),
            memory=self.memory.get(key, NOTHING_KEPT),
            draining=self.member is not None and names.SHARD_DRAIN_LABEL in labels,
            background=self._background(key),
            hosts=len(self.hosts.store),
            jitter=self.random.random(),
            grid_shift=self.grid_shift,
        )
        if not policy.reads_bmc(observed):
            return Attempt(observed, host)
        try:
            target = target_for_host(host, self.credentials)
            power = await self.bmcs.power_state(target, background=observed.background)
        except (Busy, BmcError) as error:
            return Attempt(replace(observed, bmc=bmc_outcome(error)), host)
        return Attempt(replace(observed, bmc=policy.PowerRead(power)), host, target)

    def decide(self, attempt: Attempt) -> policy.ReconcileDecision:
        return policy.decide_reconcile(attempt.observed, self.settings, self.retry)

    async def carry_out(self, attempt: Attempt, decision: policy.ReconcileDecision) -> Result:
        """Each action in order; one that fails ends the decision there, and the attempt
        is decided again (``end``)."""
        if decision.poll_every is not None:
            self._said_poll_every(decision.poll_every)
        for action in decision.actions:
            done = await self.act(attempt, action)
            if not isinstance(done, Attempt):
                return await self.end(attempt, done)
            attempt = done
        return Result.at(decision.requeue_at, decision.outcome, decision.same_priority)

    async def end(self, attempt: Attempt, why: policy.Ended) -> Result:
        """An action failed (``why``): decide again on the host as last written, and carry
        that out (its actions report the failure and never end it again)."""
        ended = attempt.ended(why)
        return await self.carry_out(ended, self.decide(ended))

    def _background(self, key: str) -> bool:
        """Whether this reconcile is a routine poll (the work queue handed the key out in
        the background): its BMC read then leaves a slot to reconciles of changes."""
        return self.runner is not None and self.runner.queue.handed_out_in_background(key)

    async def act(self, attempt: Attempt, action: policy.Step) -> Attempt | policy.Ended:
        """Carry one action out through the writer: the attempt with the host as written,
        or why the decision ends here (a refused write, a command not carried out)."""
        writer, host = self.writer, attempt.host
        match action:
            case policy.SetStatus() | policy.RemoveAnnotations():
                return await self._write(attempt, action)
            case policy.SendPower(command=command):
                return await self._send(attempt, command)
            case policy.Remember(memory=memory):
                self._remember(attempt.key, memory)
            case policy.Event(type=kind, reason=reason, message=message):
                await writer.record_event(host, kind, reason, message)
            case policy.WriteFailure(status=status, then=then):
                if await self._write_failure(attempt, status):
                    self._remember(attempt.key, then)
            case policy.ReportRefusal(status=status):
                wire = status.to_wire(host.get("status") or {})
                try:
                    await writer.patch_status(BareMetalHost, host, wire)
                except ApiError as problem:  # the status write itself refused: the Event must do
                    log.debug("cannot report refusal in status",
                              extra=fields(host=attempt.key, error=str(problem)))  # fmt: skip
            case policy.LetGo():
                await self._let_go(attempt)
            case policy.Log(level=level, message=message, context=context):
                getattr(log, level)(message, extra=fields(**dict(context)))
        return attempt

    def _remember(self, key: str, memory: policy.Memory) -> None:
        if memory == NOTHING_KEPT:
            self.memory.pop(key, None)
        else:
            self.memory[key] = memory

    async def _write(
        self, attempt: Attempt, action: policy.SetStatus | policy.RemoveAnnotations
    ) -> Attempt | policy.Ended:
        """A versioned write of the host; a refusal (RBAC or an admission policy said no)
        ends the decision."""
        writer, host = self.writer, attempt.host
        try:
            if isinstance(action, policy.SetStatus):
                wire = action.status.to_wire(host.get("status") or {})
                written = await writer.patch_status(BareMetalHost, host, wire)
            else:
                changes: dict[str, str | None] = {k: None for k in action.keys}
                written = await writer.patch_metadata(BareMetalHost, host, "annotations", changes)
        except ApiError as error:
            if not errors.is_refused(error):
                raise
            return policy.WriteRefused(action, errors.code(error), str(error.status.message or ""))
        return replace(attempt, host=written or host)

    async def _send(self, attempt: Attempt, command: policy.LastCommand) -> Attempt | policy.Ended:
        if attempt.target is None:  # decide_reconcile sends only after a BMC read
            raise LookupError(f"host {attempt.key}: a power command without a BMC read")
        try:
            await self.writer.power(attempt.target, command.action)
        except (Busy, BmcError) as error:
            return policy.SendEnded(command, bmc_outcome(error))
        return attempt

    async def _write_failure(self, attempt: Attempt, status: policy.PowerStatus) -> bool:
        """Write the failed attempt to status: whether it is done with (written, or refused
        and said by the Event and the log instead). A conflict or a host gone leaves it
        for the next reconcile, which writes it without a BMC call."""
        host = attempt.host
        try:
            await self.writer.patch_status(
                BareMetalHost, host, status.to_wire(host.get("status") or {})
            )
        except ApiError as problem:
            if errors.is_refused(problem):
                log.warning(
                    "cannot write the BMC error to status",
                    extra=fields(host=attempt.key, error=str(problem.status.message)),
                )
            elif errors.is_not_found(problem) or errors.is_conflict(problem):
                return False  # still unwritten; the retry is fresh
            else:
                raise
        return True

    async def _let_go(self, attempt: Attempt) -> None:
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
            BareMetalHost, attempt.host, "labels", changes, require_version=True
        )
        log.info("host handed over", extra=fields(host=attempt.key, replica=self.member))

    # ---- the BMC's credentials --------------------------------------------------------------

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


def bmc_outcome(error: Busy | BmcError) -> policy.BmcFailed | policy.BmcBusy:
    """A BMC call's failure, as the policy reads it."""
    if isinstance(error, Busy):
        return policy.BmcBusy(str(error), error.retry_after, error.others)
    return policy.BmcFailed(
        error.error_type,
        str(error),
        authentication=isinstance(error, AuthenticationFailed),
        timed_out=isinstance(error, TimedOut),
    )


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
    # the pool answers Busy and the key is requeued). Routine polls take at most as many
    # workers as there are slots: they wait in line for a slot (bmc/pool.py), and the
    # other 4 workers stay free for changes (a reboot, a power change landing).
    slots = controller.bmcs.settings.max_in_flight
    runner = manager.add(
        Controller("host-power", controller.reconcile, workers=slots + 4, max_background=slots),
        sharded=True,
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
