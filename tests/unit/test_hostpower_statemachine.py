"""The host power decisions under random interleavings: several clients adding and removing
suffixless and keyed reboot annotations with random modes, ``online`` flips, a BMC whose
changes land late, get ignored (soft) or fail, controller crashes between the steps of a
reconcile, and deprovisioning. The controller's act step is modelled exactly as
controllers/hostpower.py carries a decision out: status, then annotations, then command.

Invariants (docs/design.md): 2 (online, no annotation -> ends up on), 3 (a keyed annotation
holds a fenced host off), 4 (lastPoweredOn moves only when power was restored), 6 (only
the suffixless form, or everything on deprovisioning, is removed by the controller), and:
every reboot request sees the host off before lastPoweredOn passes it.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from metalmend.api.names import REBOOT
from metalmend.api.power import PowerState
from metalmend.api.reboot import is_reboot_annotation
from metalmend.policy.hostpower import Decision, Host, PowerSettings, PowerStatus, SetStatus, decide
from tests.support import thorough
from tests.unit import hostpower_views as views

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = PowerSettings(soft_timeout=30, poll_interval=20, transition_poll=1, command_retry=10)
KEYS = [REBOOT, "reboot.metal3.io/remediation", "reboot.metal3.io/maintenance"]
VALUES = ["", '{"mode":"hard"}', "{'mode':'soft'}", '{"mode":"hard","force":true}', "not json"]


class HostPowerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        # the hardware
        self.power_on = True
        self.landing: tuple[bool, dt.datetime] | None = None  # a power change on its way
        self.bmc_fails = False
        self.ignores_soft = False
        # the BareMetalHost
        self.online = True
        self.state = "provisioned"
        self.annotations: dict[str, str] = {}
        self.status = PowerStatus(powered_on=True)
        # what the invariants watch
        self.seen_off_for: dict[dt.datetime, bool] = {}  # pending reboot -> host seen off
        self.violations: list[str] = []

    # ---- the world ------------------------------------------------------------------------

    def tick(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
        if self.landing is not None and self.now >= self.landing[1]:
            self.power_on, self.landing = self.landing[0], None

    @rule(key=st.sampled_from(KEYS), value=st.sampled_from(VALUES))
    def client_adds(self, key: str, value: str) -> None:
        self.annotations[key] = value

    @rule(key=st.sampled_from(KEYS))
    def client_removes_its_own(self, key: str) -> None:
        self.annotations.pop(key, None)

    @rule()
    def flip_online(self) -> None:
        self.online = not self.online

    @rule(seconds=st.sampled_from([0.5, 2, 5, 12, 40]))
    def time_passes(self, seconds: float) -> None:
        self.tick(seconds)

    @rule()
    def bmc_breaks_or_heals(self) -> None:
        self.bmc_fails = not self.bmc_fails

    @rule()
    def bmc_toggles_soft_support(self) -> None:
        self.ignores_soft = not self.ignores_soft

    @rule(state=st.sampled_from(["provisioned", "deprovisioning", "externally provisioned"]))
    def provisioning_changes(self, state: str) -> None:
        self.state = state

    # ---- the controller ---------------------------------------------------------------------

    @rule(
        crash_after=st.sampled_from([None, "status", "annotations"]),
        delay=st.sampled_from([0, 1, 3, 11]),
    )
    def reconcile(self, crash_after: str | None, delay: float) -> None:
        self.tick(0.001)
        if self.bmc_fails:
            return  # the BMC read fails: an error is recorded, nothing else happens
        before = dict(self.annotations)
        view = self.view()
        decision = decide(view, self.now, SETTINGS)
        self.check_decision(view, decision, before)
        self.apply_status(decision)
        if crash_after == "status":
            return
        for key in views.removed(decision):
            self.annotations.pop(key, None)
        command = views.command(decision)
        if crash_after == "annotations" or command is None:
            return
        target = command == "on"
        if command == "soft off" and self.ignores_soft:
            return
        self.landing = (target, self.now + dt.timedelta(seconds=delay))
        self.tick(0)

    def view(self) -> Host:
        return Host(
            online=self.online,
            provisioning_state=self.state,
            externally_provisioned=False,
            annotations=dict(self.annotations),
            power=PowerState.ON if self.power_on else PowerState.OFF,
            status=self.status,
        )

    def apply_status(self, decision: Decision) -> None:
        self.status = decision.of(SetStatus)[-1].status

    def check_decision(self, view: Host, decision: Decision, annotations: dict[str, str]) -> None:
        changes = views.status_changes(view, decision)
        pending = self.status.pending_reboot_since
        last = self.status.last_powered_on
        if pending is not None and (last is None or pending > last) and not self.power_on:
            self.seen_off_for[pending] = True
        new_pending = changes.get("pendingRebootSince")
        if new_pending is not None:
            self.seen_off_for.setdefault(new_pending, not self.power_on)
        elif "pendingRebootSince" in changes:
            self.seen_off_for.clear()  # deprovisioning withdrew the request
        # invariant 6: only the suffixless form, or all of them when deprovisioning
        for key in views.removed(decision):
            if key != REBOOT and self.state != "deprovisioning":
                self.violations.append(f"removed {key} while {self.state}")
        # invariant 3: no power-on while a keyed annotation remains
        keyed = [k for k in annotations if is_reboot_annotation(k) and k != REBOOT]
        honoured = self.state in ("provisioned", "externally provisioned")
        if views.command(decision) == "on" and keyed and honoured:
            self.violations.append(f"powered on while {keyed} held the host")
        # invariant 4 and reboot completion: lastPoweredOn moves only on restored power,
        # and never past a reboot request that has not seen the host off
        moved = changes.get("lastPoweredOn")
        if moved is not None:
            restored = self.power_on and self.status.powered_on is not True
            first_sight = self.power_on and last is None
            if not (restored or first_sight):
                self.violations.append("lastPoweredOn moved without power being restored")
            for request, seen_off in self.seen_off_for.items():
                if (last is None or request > last) and request < moved and not seen_off:
                    self.violations.append(f"reboot requested at {request} completed unseen")

    # ---- invariants ---------------------------------------------------------------------------

    @invariant()
    def no_violation(self) -> None:
        assert not self.violations, self.violations

    @rule()
    def settle(self) -> None:
        """Liveness, with a healthy BMC and time passing: invariant 2 (an online host that
        no keyed annotation holds ends up on), and every reboot request completes (the
        suffixless form is gone and lastPoweredOn has passed pendingRebootSince)."""
        keyed = [k for k in self.annotations if is_reboot_annotation(k) and k != REBOOT]
        if not self.online or keyed:
            return
        self.bmc_fails = False
        for _ in range(20):
            self.tick(SETTINGS.command_retry + 1)
            self.reconcile(crash_after=None, delay=1)
            self.tick(2)
        self.reconcile(crash_after=None, delay=1)
        assert self.power_on, "an online host without reboot annotations stayed off"
        assert not self.violations, self.violations
        assert REBOOT not in self.annotations, "the suffixless annotation outlived its reboot"
        pending = self.status.pending_reboot_since
        last = self.status.last_powered_on
        assert pending is None or (last is not None and pending < last), "reboot never completed"


HostPowerMachine.TestCase.settings = settings(
    max_examples=thorough(250, 1000), stateful_step_count=50, deadline=None
)
test_host_power_state_machine = HostPowerMachine.TestCase
# Seconds on an idle machine, but hundreds of examples: on a busy one (CI beside other
# jobs) it may run far past pytest's default 300 s without being stuck.
test_host_power_state_machine.pytestmark = [pytest.mark.timeout(1200)]  # type: ignore[attr-defined]
