"""When a BareMetalHost is in error, and when its error fails a site action's wait
(policy.redeploy.host_error and fails_wait; policy.deploysite.progress; the provision
phase of deploy_server): issue 27, point 8. Tables, no I/O."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from metalmend.siteactions.policy import redeploy as policy
from metalmend.siteactions.policy.deploysite import HostSeen, known_errors, progress, still_known
from metalmend.siteactions.policy.redeploy import HostError, fails_wait, host_error

UNBOUND = "Secret t1/h-bmc is not bound to any host"
REGISTRATION = {"errorType": "registration error", "errorMessage": UNBOUND, "errorCount": 1,
                "operationalStatus": "error"}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({}, None, id="no-status"),
        pytest.param({"operationalStatus": "OK", "errorType": "", "errorCount": 0}, None,
                     id="recovered"),
        pytest.param({"provisioning": {"state": "provisioning"}}, None, id="busy-not-in-error"),
        pytest.param(REGISTRATION, HostError("registration error", UNBOUND, 1),
                     id="host-power's-unbound-secret"),
        pytest.param({"errorType": "power management error", "errorMessage": "timed out"},
                     HostError("power management error", "timed out", 0), id="error-type-alone"),
        pytest.param({"operationalStatus": "error"}, HostError("operational error", "", 0),
                     id="operational-status-alone"),
        pytest.param({"provisioning": {"state": "provisioning error"}, "errorMessage": "no image"},
                     HostError("provisioning error", "no image", 0), id="provisioner's-state"),
        pytest.param({"errorType": "registration error", "errorCount": True, "errorMessage": 7},
                     HostError("registration error", "", 0), id="hostile-field-types"),
        pytest.param({"errorType": "x", "errorMessage": "m" * 1000},
                     HostError("x", "m" * 300, 0), id="a-long-message-is-cut"),
    ],
)  # fmt: skip
def test_what_in_error_means(status: dict[str, Any], expected: HostError | None) -> None:
    assert host_error(status) == expected


ERR1 = HostError("registration error", UNBOUND, 1)
ERR2 = HostError("registration error", UNBOUND, 2)


@pytest.mark.parametrize(
    ("error", "known", "fails"),
    [
        pytest.param(None, None, False, id="not-in-error"),
        pytest.param(ERR1, None, True, id="a-new-error-fails-at-once"),
        pytest.param(ERR1, ERR1.mark, False, id="the-error-from-before-the-wait-unchanged"),
        pytest.param(ERR2, ERR1.mark, True, id="tried-again-and-failed-again"),
        pytest.param(HostError("registration error", "other", 1), ERR1.mark, True,
                     id="another-error"),
        pytest.param(None, ERR1.mark, False, id="the-old-error-cleared"),
    ],
)  # fmt: skip
def test_when_an_error_fails_a_wait(
    error: HostError | None, known: str | None, fails: bool
) -> None:
    assert fails_wait(error, known) is fails


def seen(key: str = "h", **changes: Any) -> HostSeen:
    values = {"key": key, "wants_on": True, "wants_image": True,
              "provisioning": "provisioning", "powered_on": False} | changes  # fmt: skip
    return HostSeen(**values)


@pytest.mark.parametrize(
    ("host", "known", "waiting", "failed"),
    [
        pytest.param(seen(problem=ERR1), {}, (), (f"h: registration error: {UNBOUND}",),
                     id="unbound-secret-fails-the-site-wait-at-once"),
        pytest.param(seen(problem=ERR1), {"h": ERR1.mark},
                     (f"h in error since before this wait (registration error: {UNBOUND}):"
                      " waiting for its next attempt",), (), id="an-old-error-is-waited-out"),
        pytest.param(seen(problem=ERR2), {"h": ERR1.mark}, (),
                     (f"h: registration error: {UNBOUND}",), id="then-fails-at-its-next-failure"),
        pytest.param(seen(problem=ERR1), {"other": ERR1.mark}, (),
                     (f"h: registration error: {UNBOUND}",), id="known-is-per-host"),
        pytest.param(seen(provisioning="provisioned", powered_on=True), {"h": ERR1.mark}, (), (),
                     id="recovered-and-on"),
    ],
)  # fmt: skip
def test_a_host_in_error_in_the_site_wait(
    host: HostSeen, known: dict[str, str], waiting: tuple[str, ...], failed: tuple[str, ...]
) -> None:
    found = progress([host], {}, known)
    assert (found.waiting, found.failed) == (waiting, failed)


def test_the_wait_keeps_the_errors_it_began_with_until_they_clear() -> None:
    hosts = [seen("a", problem=ERR1), seen("b")]
    assert known_errors(hosts) == {"a": ERR1.mark}
    assert still_known({"a": ERR1.mark}, hosts) == {"a": ERR1.mark}
    assert still_known({"a": ERR1.mark}, [seen("a"), seen("b")]) == {}


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = policy.RedeploySettings(provision_timeout=3600)


def facts(problem: HostError | None, state: str = "provisioning") -> policy.HostFacts:
    return policy.HostFacts("h1", state, False, problem.message if problem else "", problem)


def provision(bmh: policy.HostFacts, known: str | None) -> list[Any]:
    record = policy.DeployRecord(policy.DeployPhase.PROVISION, T0, known_error=known)
    view = policy.DeployView("h1", record, 2, bmh, None, (), ())
    return list(policy.decide_deploy(view, T0 + dt.timedelta(seconds=5), SETTINGS).actions)


def test_deploy_server_keeps_the_error_seen_when_it_applied_the_documents() -> None:
    record = policy.DeployRecord(policy.DeployPhase.APPLY, T0)
    view = policy.DeployView("h1", record, 2, facts(ERR1), None, (), ())
    actions = policy.decide_deploy(view, T0, SETTINGS).actions
    (saved,) = [a for a in actions if isinstance(a, policy.SetRecord)]
    assert saved.record.known_error == ERR1.mark
    assert policy.DeployRecord.from_wire(saved.record.to_wire()) == saved.record


@pytest.mark.parametrize(
    ("bmh", "known", "fails"),
    [
        pytest.param(facts(ERR1), None, f"BareMetalHost h1 is in error: registration error:"
                     f" {UNBOUND}", id="in-error-fails-at-once"),
        pytest.param(facts(ERR1), ERR1.mark, None, id="the-error-from-before-the-apply-waits"),
        pytest.param(facts(ERR2), ERR1.mark, f"BareMetalHost h1 is in error: registration"
                     f" error: {UNBOUND}", id="failing-again-fails"),
        pytest.param(facts(None), ERR1.mark, None, id="recovered"),
    ],
)  # fmt: skip
def test_deploy_server_fails_its_provision_wait_on_a_host_in_error(
    bmh: policy.HostFacts, known: str | None, fails: str | None
) -> None:
    actions = provision(bmh, known)
    failed = [a.message for a in actions if isinstance(a, policy.Fail)]
    assert failed == ([fails] if fails else [])
