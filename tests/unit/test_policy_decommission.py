"""decommission's rules: the spec's order of steps, each only after the one before
succeeded; a kubelet not seen stopped reported without failing the decommission; any
other failure a 500 DisassociateStepFailure with one message per step; etcd polled until
every cluster is healthy or the etcd-ready-timeout passes."""

from __future__ import annotations

import datetime as dt

import pytest

from metalmend.teardown.policy.decommission import (
    ORDER,
    ClusterState,
    Step,
    StepResult,
    etcd_ready,
    next_step,
    verdict,
)

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def ok(step: Step) -> StepResult:
    return StepResult(step, True, f"{step} done")


def failed(step: Step) -> StepResult:
    return StepResult(step, False, f"{step} broke")


def test_the_steps_run_in_the_specs_order() -> None:
    done: list[StepResult] = []
    while (step := next_step(done)) is not None:
        done.append(ok(step))
    assert [r.step for r in done] == [
        Step.DRAIN, Step.CLEAR_LABELS, Step.REMOVE_ETCD, Step.ETCD_READY, Step.SHUTDOWN_KUBELET,
    ]  # fmt: skip


@pytest.mark.parametrize("step", [s for s in ORDER if s is not Step.SHUTDOWN_KUBELET])
def test_a_failed_step_stops_the_decommission_and_answers_500(step: Step) -> None:
    done = [ok(s) for s in ORDER[: ORDER.index(step)]] + [failed(step)]
    assert next_step(done) is None
    answer = verdict("n1", done)
    assert (answer.code, answer.reason) == (500, "DisassociateStepFailure")
    assert answer.message == f"Node n1 was not decommissioned: {step} failed"
    assert len(answer.lines) == len(ORDER)  # one message per step
    assert (f"{step}: {step} broke", True) in answer.lines
    assert [error for _, error in answer.lines].count(True) == 1
    later = ORDER[ORDER.index(step) + 1 :]
    assert [text for text, _ in answer.lines[ORDER.index(step) + 1 :]] == [
        f"{s}: not attempted ({step} failed)" for s in later
    ]


def test_a_kubelet_not_seen_stopped_does_not_hold_up_the_decommission() -> None:
    done = [ok(s) for s in ORDER[:-1]] + [failed(Step.SHUTDOWN_KUBELET)]
    assert next_step(done) is None
    answer = verdict("n1", done)
    assert (answer.code, answer.reason) == (200, "Success")
    assert "its kubelet was not seen stopped" in answer.message
    assert answer.lines[-1] == ("shutdown-kubelet: shutdown-kubelet broke", True)


def test_all_steps_done_is_success_with_one_line_each() -> None:
    answer = verdict("n1", [ok(s) for s in ORDER])
    assert (answer.code, answer.message) == (200, "Node n1 decommissioned")
    assert answer.lines == tuple((f"{s}: {s} done", False) for s in ORDER)


HEALTHY = ClusterState("kubernetes", True, "2 of 3 members healthy")
SICK = ClusterState("calico", False, "1 of 3 members healthy; the site needs 2")


def test_etcd_is_stable_when_every_cluster_is_healthy() -> None:
    ready = etcd_ready([HEALTHY], NOW, NOW + dt.timedelta(seconds=600), 30)
    assert (ready.stable, ready.done) == (True, True)


def test_an_unhealthy_cluster_is_polled_again_after_the_interval() -> None:
    ready = etcd_ready([HEALTHY, SICK], NOW, NOW + dt.timedelta(seconds=600), 30)
    assert (ready.stable, ready.done) == (False, False)
    assert ready.look_again_at == NOW + dt.timedelta(seconds=30)


def test_the_last_look_is_at_the_etcd_ready_timeout() -> None:
    ready = etcd_ready([SICK], NOW, NOW + dt.timedelta(seconds=10), 30)
    assert ready.look_again_at == NOW + dt.timedelta(seconds=10)


def test_past_the_etcd_ready_timeout_it_fails_naming_the_unstable_cluster() -> None:
    ready = etcd_ready([SICK], NOW, NOW, 30)
    assert (ready.stable, ready.done) == (False, True)
    assert ready.summary == (
        "etcd not stable by etcd-ready-timeout: cluster calico: 1 of 3 members healthy;"
        " the site needs 2"
    )
