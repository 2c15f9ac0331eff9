"""The lab's stand-in for baremetal-operator (lab.bmostandin): its rules against upstream's
``manageHostPower`` and ``hasRebootAnnotation`` (controllers/metal3.io/
baremetalhost_controller.go) and Ironic's ``PowerOff``/``PowerOn``, one case per point."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from metalmend_lab.bmostandin import (
    POWER_ERROR,
    ChangePower,
    Facts,
    IronicNode,
    RecordFailure,
    RemoveSuffixless,
    SetPoweredOn,
    Wait,
    decide,
    reboot_requested,
)

HARD = '{"mode": "hard"}'
ON = Facts(
    status_on=True, online=True, state="provisioned", annotations={},
    disable_power_off=False, error_type="", error_count=0, node=IronicNode(power_on=True),
)  # fmt: skip


def test_steady_writes_nothing() -> None:
    """Status written only when it changes: the same reading, no write."""
    assert decide(ON) == Wait()
    off = replace(ON, status_on=False, online=False, node=IronicNode(power_on=False))
    assert decide(off) == Wait()


def test_a_reading_that_differs_is_written_and_nothing_else() -> None:
    seen_off = replace(
        ON, node=IronicNode(power_on=False), annotations={"reboot.metal3.io/x": HARD}
    )
    assert decide(seen_off) == SetPoweredOn(False, clear_error=False)
    errored = replace(seen_off, error_type=POWER_ERROR)
    assert decide(errored) == SetPoweredOn(False, clear_error=True)


def test_unread_server_waits_for_its_first_reading() -> None:
    assert decide(replace(ON, node=IronicNode())) == Wait(changing=True)


@pytest.mark.parametrize("key", ["reboot.metal3.io", "reboot.metal3.io/metal3-remediation-u1"])
def test_any_reboot_annotation_powers_off_hard_when_asked(key: str) -> None:
    assert decide(replace(ON, annotations={key: HARD})) == ChangePower("hard off")
    assert decide(replace(ON, annotations={key: ""})) == ChangePower("soft off")
    assert decide(replace(ON, annotations={key: "not json"})) == ChangePower("soft off")


def test_hard_wins_over_soft() -> None:
    both = {"reboot.metal3.io/a": '{"mode": "soft"}', "reboot.metal3.io/b": HARD}
    assert reboot_requested(both, expect_force=False) == (True, "hard")
    assert reboot_requested({"other.io/x": HARD}, expect_force=False) == (False, "soft")


def test_unprovisioned_hosts_count_only_forced_annotations() -> None:
    available = replace(ON, state="available", annotations={"reboot.metal3.io/x": HARD})
    assert decide(available) == Wait()
    forced = {"reboot.metal3.io/x": '{"mode": "hard", "force": true}'}
    assert decide(replace(available, annotations=forced)) == ChangePower("hard off")


def test_a_change_under_way_is_waited_for() -> None:
    held = replace(ON, annotations={"reboot.metal3.io/x": HARD})
    assert decide(replace(held, node=IronicNode(True, target="hard off"))) == Wait(changing=True)


def test_off_while_any_annotation_on_when_all_removed_if_online() -> None:
    off = replace(ON, status_on=False, node=IronicNode(power_on=False))
    two = {"reboot.metal3.io/a": HARD, "reboot.metal3.io/b": HARD}
    assert decide(replace(off, annotations=two)) == Wait()
    assert decide(replace(off, annotations={"reboot.metal3.io/b": HARD})) == Wait()
    assert decide(off) == ChangePower("on")
    assert decide(replace(off, online=False)) == Wait()


def test_the_suffixless_annotation_goes_once_reported_off() -> None:
    off = replace(ON, status_on=False, node=IronicNode(power_on=False))
    assert decide(replace(off, annotations={"reboot.metal3.io": HARD})) == RemoveSuffixless()


def test_a_failed_soft_power_off_is_recorded_then_hard() -> None:
    held = replace(ON, annotations={"reboot.metal3.io/x": ""})
    timed_out = replace(held, node=IronicNode(True, last_error="timed out"))
    assert decide(timed_out) == RecordFailure("timed out")
    recorded = replace(held, error_type=POWER_ERROR, error_count=1)
    assert decide(recorded) == ChangePower("hard off")


def test_disable_power_off_reboots_once_and_stays_on() -> None:
    held = replace(ON, disable_power_off=True, annotations={"reboot.metal3.io/x": HARD})
    assert decide(held) == ChangePower("reboot")
    done = replace(held, node=IronicNode(True, rebooted_for=("reboot.metal3.io/x",)))
    assert decide(done) == Wait()


def test_lab_up_refuses_an_unknown_power_owner(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from metalmend.cli.main import app

    argv = ["lab", "up", "--dir", str(tmp_path), "--power-owner", "ironic"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "--power-owner must be metalmend or bmo-stand-in, not 'ironic'" in result.output
    assert not (tmp_path / "lab.json").exists()  # nothing started
