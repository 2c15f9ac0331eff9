"""Restart safety of the destroy's rules (metalmend.destroy.policy.destroy; docs/destroy.md,
"Stored, restarted, shared by replicas"), in a simulated world: the service is killed
between any two actions (everything in memory lost, the stored record kept) and started
again. Whatever the point, the node ends destroyed, every drive to be erased was erased
exactly once (an erase the BMC accepted is never started twice), a preserved drive was
never touched, and the host is off and released.

The world plays host-power (off once spec.online is false; reboot annotations removed
from a deprovisioned host) and a BMC whose erases take a few looks."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

from metalmend.destroy.policy import destroy as p

START = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)
DRIVES = (p.DriveFacts("d-os", "/dev/sda", "S0"), p.DriveFacts("d-data", "/dev/sdb", "S1"))
ERASE_LOOKS = 3


@dataclass
class World:
    online: bool = True
    powered_on: bool = True
    state: str = "provisioned"
    consumer: bool = True
    reboot_keys: tuple[str, ...] = ("reboot.metal3.io",)
    erasing: dict[str, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    stored: p.NodeState = field(default_factory=p.NodeState)

    def host(self) -> p.HostFacts:
        return p.HostFacts("site/h", self.online, self.powered_on, "", self.state,
                           self.consumer, False, self.reboot_keys)  # fmt: skip

    def host_power(self) -> None:
        if not self.online:
            self.powered_on = False
        if self.state in ("deprovisioning", "available"):
            self.reboot_keys = ()

    def seen(self, drive: str) -> p.SeenErase:
        left = self.erasing.get(drive)
        if left is None:
            return p.SeenErase(p.Seen.FINISHED)
        if left <= 1:
            del self.erasing[drive]
            return p.SeenErase(p.Seen.FINISHED)
        self.erasing[drive] = left - 1
        return p.SeenErase(p.Seen.RUNNING)

    def start(self, drive: str) -> None:
        self.starts[drive] = self.starts.get(drive, 0) + 1
        self.erasing.setdefault(drive, ERASE_LOOKS)  # as BMCs (and the lab): never two


def run(world: World, preserve: bool, crash_at: int | None) -> int:
    """Rounds until the node is finished; the service killed before action ``crash_at``."""
    actions_done = 0
    accepted: dict[str, str] = {}
    now = START
    for _ in range(200):
        world.host_power()
        state = world.stored
        if state.finished:
            return actions_done
        open_ = [d.id for d in state.drives if d.erase in (p.Erase.REQUESTED, p.Erase.RUNNING)]
        view = p.View(
            "n1", preserve, state, host=world.host(),
            drives=DRIVES if state.step is p.Step.WIPE and not state.planned else None,
            os_drive="d-os" if preserve else None,
            erases={d: world.seen(d) for d in open_ if d not in accepted},
            accepted=dict(accepted),
        )  # fmt: skip
        accepted = {}
        for action in p.decide(view, now).actions:
            if actions_done == crash_at:
                accepted, crash_at = {}, None  # killed: what was only in memory is gone
                break
            actions_done += 1
            match action:
                case p.SetState(new):
                    world.stored = new
                case p.SetOnline(_, online):
                    world.online = online
                case p.StartErase(_, drive):
                    world.start(drive)
                    accepted[drive] = f"/tasks/{drive}"
                case p.SetProvisioningState(_, value):
                    world.state = value
                case p.ClearConsumer():
                    world.consumer = False
        now += dt.timedelta(seconds=1)
    raise AssertionError(f"not finished: {world.stored}")


def actions_without_crash(preserve: bool) -> int:
    return run(World(), preserve, None)


@pytest.mark.parametrize("preserve", [False, True], ids=["every-drive", "preserve-local-storage"])
def test_killed_between_any_two_actions_the_destroy_ends_the_same(preserve: bool) -> None:
    total = actions_without_crash(preserve)
    expected = {"d-os": 1} if preserve else {"d-os": 1, "d-data": 1}
    for crash_at in range(total + 1):
        world = World()
        run(world, preserve, crash_at)
        where = f"killed before action {crash_at}"
        assert world.stored.outcome is p.Outcome.SUCCESS, where
        assert world.starts == expected, where  # each erase started once; preserved: never
        erased = {d.id for d in world.stored.drives if d.erase is p.Erase.ERASED}
        assert erased == set(expected), where
        assert (world.online, world.powered_on, world.state, world.consumer) == (
            False, False, "available", False,
        ), where  # fmt: skip
        assert world.reboot_keys == (), where
