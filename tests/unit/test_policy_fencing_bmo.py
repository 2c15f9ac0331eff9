"""Fencing beside baremetal-operator (policy.remediation, power_owner baremetal-operator):
metalmend only adds its keyed reboot annotation; BMO's ``poweredOn: false`` in the host
version carrying that key AND metalmend's own BMC reads must say off; ``disablePowerOff``
hosts are refused. And how ``metalmend run`` picks the power owner. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.policy import remediation as r
from metalmend.policy.fencing import HostPower
from metalmend.runner import beside_power_owner, decide_power_owner
from metalmend.settings import SettingsError, load
from tests.unit.test_policy_remediation import T0, host, kinds, node, observed, progress_of, sec

BMO = r.Settings(power_owner=r.PowerOwner.BAREMETAL_OPERATOR, confirm_window=10, confirm_reads=3)
BMO_TAINT = r.Settings(
    power_owner=r.PowerOwner.BAREMETAL_OPERATOR,
    fence=r.FenceMethod.OUT_OF_SERVICE_TAINT,
)
# BMO writes no poweredOffFor: "off" is poweredOn false in the version that holds our key
BMO_OFF = HostPower(holds_key=True, powered_on=False, acknowledged=False, power_on_in_flight=False)
BMO_ON = HostPower(holds_key=True, powered_on=True, acknowledged=False, power_on_in_flight=False)
BMO_OFF_NO_KEY = HostPower(
    holds_key=False, powered_on=False, acknowledged=False, power_on_in_flight=False
)


def at(phase: r.Phase | None, **kw: Any) -> r.Progress:
    fields: dict[str, Any] = dict(phase=phase, phase_since=T0, node="node-1")
    fields.update(kw)
    return r.Progress(**fields)


CASES: list[tuple[str, r.Settings, dict[str, Any], float, list[str], r.Phase | None]] = [
    (
        "a new remediation asks with its keyed annotation only",
        BMO,
        dict(progress=at(None), host=host(HostPower(False, True, False, False))),
        0,
        ["SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "BMO reports off in the version holding our key: confirm with our own reads",
        BMO,
        dict(progress=at(r.POWER_OFF), host=host(BMO_OFF)),
        1,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "BMO's off without our key is no evidence",
        BMO,
        dict(progress=at(r.POWER_OFF), host=host(BMO_OFF_NO_KEY)),
        1,
        ["RequestPowerOff"],
        None,
    ),
    (
        "BMO still reports on: wait",
        BMO,
        dict(progress=at(r.POWER_OFF), host=host(BMO_ON)),
        1,
        [],
        None,
    ),
    (
        "our read says on although BMO says off: power-off again, no fence",
        BMO,
        dict(
            progress=at(r.CONFIRMING, off_reads=2, off_read_since=T0),
            host=host(BMO_OFF),
            power_read=r.PowerRead(off=False),
        ),
        5,
        ["SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "BMO turns to on while confirming: power-off again",
        BMO,
        dict(progress=at(r.CONFIRMING, off_reads=2), host=host(BMO_ON)),
        5,
        ["SetProgress", "RequestPowerOff"],
        r.POWER_OFF,
    ),
    (
        "both agree over the window: fencing",
        BMO,
        dict(
            progress=at(r.CONFIRMING, off_reads=2, off_read_since=T0, last_read_at=T0 + sec(5)),
            host=host(BMO_OFF),
            power_read=r.PowerRead(off=True),
        ),
        10,
        ["SetProgress"],
        r.FENCING,
    ),
    (
        "fencing without our reads on record goes back to confirming (Node kept)",
        BMO,
        dict(progress=at(r.FENCING, off_reads=0), host=host(BMO_OFF)),
        0,
        ["SetProgress"],
        r.CONFIRMING,
    ),
    (
        "confirmed by both: the Node is deleted (deletion strategy)",
        BMO,
        dict(progress=at(r.FENCING, off_reads=3), host=host(BMO_OFF)),
        0,
        ["SetProgress", "BackupNode", "DeleteNode", "DeletePods", "SetProgress", "ReleasePower"],
        r.POWER_ON,
    ),
    (
        "confirmed by both: tainted (taint strategy), host held off",
        BMO_TAINT,
        dict(progress=at(r.FENCING, off_reads=3), host=host(BMO_OFF)),
        0,
        ["SetProgress", "TaintNode", "DeletePods", "SetProgress"],
        r.EVACUATING,
    ),
    (
        "disablePowerOff: refused before any request",
        BMO,
        dict(
            progress=at(None),
            host=host(HostPower(False, True, False, False), disable_power_off=True),
        ),
        0,
        ["SetProgress"],
        r.FAILED,
    ),
    (
        "disablePowerOff set while our key is on: refused, key released",
        BMO,
        dict(progress=at(r.POWER_OFF), host=host(BMO_ON, disable_power_off=True)),
        0,
        ["ReleasePower", "SetProgress"],
        r.FAILED,
    ),
    (
        "disablePowerOff set while tainted: untaint before the release",
        BMO_TAINT,
        dict(
            progress=at(r.EVACUATING, off_reads=3),
            host=host(BMO_OFF, disable_power_off=True),
            node=node(out_of_service=True),
        ),
        0,
        ["UntaintNode", "ReleasePower", "SetProgress"],
        r.FAILED,
    ),
]


@pytest.mark.parametrize(
    ("settings", "given", "now", "actions", "phase"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_beside_baremetal_operator(
    settings: r.Settings,
    given: dict[str, Any],
    now: float,
    actions: list[str],
    phase: r.Phase | None,
) -> None:
    decision = r.decide(observed(**given), T0 + sec(now), settings)
    assert kinds(decision) == actions
    if phase is not None:
        assert progress_of(decision).phase == phase


def test_the_disable_power_off_refusal_says_why() -> None:
    decision = r.decide(observed(progress=at(None), host=host(disable_power_off=True)), T0, BMO)
    message = progress_of(decision).message
    assert "spec.disablePowerOff" in message
    assert "cannot be fenced" in message


def test_metalmends_own_power_owner_ignores_disable_power_off() -> None:
    """host-power has no disablePowerOff: the field means nothing to metalmend's own flow."""
    settings = r.Settings(power_owner=r.PowerOwner.METALMEND)
    decision = r.decide(
        observed(progress=at(None), host=host(disable_power_off=True)), T0, settings
    )
    assert "RequestPowerOff" in kinds(decision)


UPSTREAM = {"properties": {"status": {"properties": {"poweredOn": {"type": "boolean"}}}}}
OURS = {
    "properties": {
        "status": {"properties": {"poweredOn": {"type": "boolean"}, "poweredOffFor": {}}}
    }
}


@pytest.mark.parametrize(
    ("schema", "owner"),
    [
        pytest.param(UPSTREAM, r.PowerOwner.BAREMETAL_OPERATOR, id="upstream CRD: BMO owns power"),
        pytest.param(OURS, r.PowerOwner.METALMEND, id="our CRD: metalmend owns power"),
        pytest.param(None, r.PowerOwner.METALMEND, id="unreadable schema: metalmend's own"),
    ],
)
def test_auto_picks_the_power_owner_from_the_served_schema(
    schema: dict[str, Any] | None, owner: r.PowerOwner
) -> None:
    assert decide_power_owner(schema)[0] == owner


@pytest.mark.parametrize(
    ("owner", "controllers", "refused"),
    [
        pytest.param(
            r.PowerOwner.BAREMETAL_OPERATOR, ["host-power"], True, id="host-power beside BMO"
        ),
        pytest.param(
            r.PowerOwner.BAREMETAL_OPERATOR,
            ["node-link", "machine-remediation"],
            True,
            id="annotation flow beside BMO",
        ),
        pytest.param(
            r.PowerOwner.BAREMETAL_OPERATOR,
            ["node-link", "metal3-remediation"],
            False,
            id="metal3-remediation beside BMO",
        ),
        pytest.param(r.PowerOwner.METALMEND, ["host-power"], False, id="host-power alone"),
    ],
)
def test_what_runs_beside_baremetal_operator(
    owner: r.PowerOwner, controllers: list[str], refused: bool
) -> None:
    line = beside_power_owner(owner, controllers)
    assert (line is not None) is refused
    if line:
        assert "docs/install.md, 'Beside metal3'" in line


def test_the_power_owner_and_the_confirmation_are_settings() -> None:
    loaded = load(
        None,
        {
            "METALMEND_REMEDIATION_POWER_OWNER": "baremetal-operator",
            "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
            "METALMEND_REMEDIATION_CONFIRM_READS": "4",
        },
    )
    assert loaded.remediation.power_owner is r.PowerOwner.BAREMETAL_OPERATOR
    assert (loaded.remediation.confirm_window, loaded.remediation.confirm_reads) == (2.0, 4)
    assert load().remediation.power_owner is r.PowerOwner.AUTO


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "METALMEND_REMEDIATION_POWER_OWNER",
            "bmo",
            "must be one of auto, metalmend, baremetal-operator",
        ),
        ("METALMEND_REMEDIATION_CONFIRM_READS", "0", "must be a whole number from 1 to 100"),
        (
            "METALMEND_REMEDIATION_CONFIRM_WINDOW",
            "-1",
            "must be a number of seconds from 0.1 to 3600",
        ),
    ],
)
def test_bad_power_owner_or_confirmation_settings_are_refused(
    variable: str, value: str, said: str
) -> None:
    with pytest.raises(SettingsError, match=said):
        load(None, {variable: value})
