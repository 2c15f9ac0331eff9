"""The pure mappings behind /metrics: which label a BMC failure, a reboot request, a host's
error and a remediation's phase are counted under, with bounded label values whatever an
object says."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from prometheus_client import generate_latest

from metalmend.api import names
from metalmend.api.power import PowerAction
from metalmend.api.resources import BareMetalHost, Machine, Metal3Remediation
from metalmend.bmc import errors
from metalmend.bmc import metrics as bmc_metrics
from metalmend.controllers import metrics
from metalmend.kube import metrics as kube_metrics
from metalmend.policy.remediation import Phase

NOW = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)


def host(name: str, annotations: dict[str, str] | None = None, **status: Any) -> Any:
    meta = ObjectMeta(name=name, namespace="hosts", annotations=annotations)
    return BareMetalHost(metadata=meta, spec={}, status=status)


def samples_by_labels(samples: list[metrics.Sample], gauge: str) -> dict[tuple[str, ...], float]:
    return {labels: value for name, labels, value in samples if name == gauge}


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (None, "success"),
        (errors.TimedOut("x"), "timeout"),
        (TimeoutError(), "timeout"),
        (errors.Unreachable("x"), "unreachable"),
        (errors.AuthenticationFailed("x"), "auth"),
        (errors.CredentialsError("x"), "credentials"),
        (errors.Refused("x"), "refused_by_policy"),
        (errors.BadAddress("x"), "bad_address"),
        (errors.Unsupported("x"), "unsupported"),
        (errors.BmcError("x"), "failed"),
        (errors.Busy("x", 0.1), "busy"),
        (asyncio.CancelledError(), "cancelled"),
        (ValueError("a bug"), "other"),
    ],
)
def test_a_bmc_call_is_counted_under_its_kind_of_failure(
    error: BaseException | None, outcome: str
) -> None:
    assert bmc_metrics.outcome_of(error) == outcome


def test_every_power_action_has_its_own_operation_label() -> None:
    operations = {bmc_metrics.operation_of(action) for action in PowerAction}
    assert len(operations) == len(PowerAction)
    assert bmc_metrics.operation_of(PowerAction.HARD_OFF) == "power_off_hard"


def test_an_unknown_protocol_cannot_add_a_series() -> None:
    assert bmc_metrics.protocol_label("ipmi") == "ipmi"
    assert bmc_metrics.protocol_label("redfish") == "redfish"
    assert bmc_metrics.protocol_label("idrac-redfish+https") == "redfish"
    assert bmc_metrics.protocol_label("10.0.0.9:623") == "other"


def test_a_cancelled_call_is_timed_but_not_an_error_of_the_bmc() -> None:
    def errors_counted() -> float:
        labels = ("ipmi", "power_state", "cancelled")
        return bmc_metrics.REQUEST_ERRORS.labels(*labels)._value.get()

    before = errors_counted()
    bmc_metrics.observe("ipmi", bmc_metrics.Operation.POWER_STATE, 0.5, asyncio.CancelledError())
    assert errors_counted() == before


def test_reboot_requests_are_counted_by_who_asked_and_mode() -> None:
    remediation_key = f"{names.METAL3_REMEDIATION_REBOOT_PREFIX}0d6a"
    since = "2026-11-23T20:59:30Z"
    hosts = [
        host("a", {names.REBOOT: ""}, provisioning={"pendingRebootSince": since}),
        host("b", {remediation_key: '{"mode":"hard"}', "unrelated": "x"}),
        host("c", {names.MACHINE_REMEDIATION_REBOOT: '{"mode":"hard"}'}),
        host("d", {f"{names.REBOOT_PREFIX}ops-team": "not json"}),  # read as soft
        host("e", {"unrelated": "x"}, provisioning={"pendingRebootSince": "2020-01-01T00:00:00Z"}),
        host("f"),
    ]
    samples = metrics.reboot_samples(hosts, NOW)
    pending = samples_by_labels(samples, "metalmend_reboot_requests_pending")
    assert pending == {
        ("metal3-remediation", "hard"): 1,
        ("metal3-remediation", "soft"): 0,
        ("machine-remediation", "hard"): 1,
        ("machine-remediation", "soft"): 0,
        ("other", "hard"): 0,
        ("other", "soft"): 2,
    }
    # the oldest *pending* request: host e's old stamp carries no request any more
    assert samples_by_labels(samples, "metalmend_reboot_request_oldest_age_seconds") == {(): 30.0}


def test_no_reboot_pending_reads_as_zero_age() -> None:
    samples = metrics.reboot_samples([host("a")], NOW)
    assert samples_by_labels(samples, "metalmend_reboot_request_oldest_age_seconds") == {(): 0.0}


def test_hosts_in_bmc_error_are_counted_by_error_type_only_from_a_known_set() -> None:
    hosts = [
        host("a", operationalStatus="error", errorType="power management error"),
        host("b", operationalStatus="error", errorType="registration error"),
        host("c", operationalStatus="error", errorType="x" * 300),  # hostile: no new series
        host("d", operationalStatus="OK", errorType="power management error"),  # recovered
        host("e"),
    ]
    assert samples_by_labels(metrics.bmc_error_samples(hosts), "metalmend_hosts_bmc_error") == {
        ("registration error",): 1,
        ("power management error",): 1,
        ("other",): 1,
    }


def remediation(phase: str | None) -> Any:
    status = {"phase": phase} if phase is not None else {}
    meta = ObjectMeta(name="m", namespace="hosts")
    return Metal3Remediation(metadata=meta, spec={}, status=status)


def test_metal3_remediations_are_counted_by_phase_with_every_phase_present() -> None:
    objects = [remediation(None), remediation("power-off"), remediation("power-off")]
    objects += [remediation("fencing"), remediation("made-up")]
    counted = samples_by_labels(
        metrics.metal3_remediation_samples(objects), "metalmend_remediations"
    )
    assert counted[("metal3-remediation", "not-started")] == 1
    assert counted[("metal3-remediation", "power-off")] == 2
    assert counted[("metal3-remediation", "fencing")] == 1
    assert counted[("metal3-remediation", "other")] == 1
    assert counted[("metal3-remediation", "failed")] == 0
    assert {phase for _, phase in counted} == set(metrics.METAL3_PHASES)


def test_fence_remediations_are_counted_by_phase_under_their_own_controller() -> None:
    objects = [remediation(None), remediation("power-off"), remediation("waiting")]
    counted = samples_by_labels(
        metrics.metal3_remediation_samples(objects, metrics.FENCE_REMEDIATION),
        "metalmend_remediations",
    )
    assert {controller for controller, _ in counted} == {"fence-remediation"}
    assert counted[("fence-remediation", "not-started")] == 1
    assert counted[("fence-remediation", "power-off")] == 1
    assert counted[("fence-remediation", "waiting")] == 1
    assert {phase for _, phase in counted} == set(metrics.METAL3_PHASES)


def machine(name: str, host_name: str, asking: bool) -> Any:
    annotations = {names.MACHINE_HOST: f"hosts/{host_name}"}
    if asking:
        annotations[names.EXTERNAL_REMEDIATION] = ""
    return Machine(metadata=ObjectMeta(name=name, namespace="hosts", annotations=annotations))


def test_machine_remediations_are_waiting_until_their_host_holds_the_key() -> None:
    machines = [machine("m1", "h1", True), machine("m2", "h2", True), machine("m3", "h3", False)]
    hosts = [
        host("h1", {names.MACHINE_REMEDIATION_REBOOT: '{"mode":"hard"}'}),
        host("h2"),
        host("h3", {names.MACHINE_REMEDIATION_REBOOT: '{"mode":"hard"}'}),  # not asking now
    ]
    counted = samples_by_labels(
        metrics.machine_remediation_samples(machines, hosts), "metalmend_remediations"
    )
    assert counted == {
        ("machine-remediation", "waiting-to-start"): 1,
        ("machine-remediation", "power-cycling"): 1,
    }


@pytest.mark.parametrize(
    ("before", "after", "entered"),
    [
        ({}, Phase.POWER_OFF, "power-off"),
        ({"phase": "power-off"}, Phase.FENCING, "fencing"),
        ({"phase": "fencing"}, Phase.FENCING, None),  # a status write in the same phase
        ({"phase": "waiting"}, None, None),  # cleared: no phase entered
    ],
)
def test_a_phase_counts_once_when_it_is_entered(
    before: dict[str, str], after: Phase | None, entered: str | None
) -> None:
    assert metrics.phase_change(before, after) == entered


def test_phases_that_end_an_attempt_name_its_outcome() -> None:
    assert metrics.PHASE_OUTCOME[Phase.WAITING] == "power_cycled"
    assert metrics.PHASE_OUTCOME[Phase.BACKOFF] == "attempt_failed"
    assert Phase.POWER_OFF not in metrics.PHASE_OUTCOME  # under way, not an outcome


def test_a_fence_is_counted_by_its_outcome_and_the_error_still_raised() -> None:
    def count(outcome: str) -> float:
        return metrics.FENCES.labels("metal3-remediation", "delete-node", outcome)._value.get()

    ok, failed = count("success"), count("error")
    with metrics.fencing("metal3-remediation", "delete-node"):
        pass
    with pytest.raises(RuntimeError), metrics.fencing("metal3-remediation", "delete-node"):
        raise RuntimeError("the API server said no")
    assert (count("success"), count("error")) == (ok + 1, failed + 1)


def test_two_controllers_report_one_gauge_as_one_family_and_a_broken_source_is_skipped() -> None:
    gauge = kube_metrics.cache_gauge(
        kube_metrics.CacheGauge("metalmend_test_things", "Things.", ("controller",))
    )
    sources = {
        "test-a": lambda: [(gauge.name, ("a",), 1.0)],
        "test-b": lambda: [(gauge.name, ("b",), 2.0)],
        "test-broken": lambda: [(gauge.name, ("c",), 1 / 0)],
    }
    try:
        for name, source in sources.items():
            kube_metrics.from_cache(name, source)
        text = generate_latest().decode()
    finally:
        for name in sources:
            kube_metrics.FROM_CACHES.sources.pop(name, None)
        kube_metrics.FROM_CACHES.gauges.pop(gauge.name, None)
    assert text.count("# TYPE metalmend_test_things gauge") == 1
    assert 'metalmend_test_things{controller="a"} 1.0' in text
    assert 'metalmend_test_things{controller="b"} 2.0' in text
    assert 'controller="c"' not in text
