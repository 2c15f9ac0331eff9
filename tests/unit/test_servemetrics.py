"""serve's own metrics (each component's metrics module: web, siteactions, destroy, teardown, db): requests labelled by route template and
status class (never a node name or a token), destroy transitions counted once (also after
a restart), erases under way forgotten with their runner, database transactions by
outcome, /metrics served on its own address; and run's new cache gauges (hosts by power,
health checks holding remediation back)."""

from __future__ import annotations

import datetime as dt
import gc
import sqlite3
from dataclasses import replace

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from prometheus_client import REGISTRY
from sqlalchemy.exc import OperationalError

from metalmend.controllers import metrics as run_metrics
from metalmend.db import metrics as dbmetrics
from metalmend.destroy import metrics as destroymetrics
from metalmend.destroy.policy.destroy import DriveRecord, Erase, NodeState, Outcome, Step
from metalmend.serve.settings import ServeSettingsError, check
from metalmend.web import metrics as webmetrics
from metalmend.web.settings import ServeSettings
from metalmend_lab.controlplane import free_port

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
DRAIN = "/promenade/api/v1.0/nodes/{node_id}/drain"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def app() -> FastAPI:
    made = FastAPI()

    @made.post(DRAIN)
    async def drain(node_id: str) -> dict[str, str]:
        if node_id == "busy-node":
            raise HTTPException(409, "held by a remediation")
        return {"node": node_id}

    made.add_middleware(webmetrics.Requests)
    return made


async def test_requests_are_counted_by_route_template_and_status_class() -> None:
    before = {
        s: value("metalmend_serve_requests_total", api="promenade", route=DRAIN, method="POST",
                 status=s)
        for s in ("2xx", "4xx")
    }  # fmt: skip
    refused_before = value(
        "metalmend_serve_teardown_step_duration_seconds_count", step="drain", outcome="refused"
    )
    unmatched_before = value(
        "metalmend_serve_requests_total", api="other", route="unmatched", method="GET", status="4xx"
    )
    transport = httpx.ASGITransport(app=app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        headers = {"Authorization": "Bearer secret-token-value"}
        assert (
            await http.post("/promenade/api/v1.0/nodes/node-7/drain", headers=headers)
        ).is_success
        busy = await http.post("/promenade/api/v1.0/nodes/busy-node/drain", headers=headers)
        assert busy.status_code == 409
        assert (await http.get("/promenade/api/v1.0/nodes/node-7/nowhere")).status_code == 404
    after = {
        s: value("metalmend_serve_requests_total", api="promenade", route=DRAIN, method="POST",
                 status=s)
        for s in ("2xx", "4xx")
    }  # fmt: skip
    assert after["2xx"] - before["2xx"] == 1
    assert after["4xx"] - before["4xx"] == 1
    refused = value(
        "metalmend_serve_teardown_step_duration_seconds_count", step="drain", outcome="refused"
    )
    assert refused - refused_before == 1
    unmatched = value(
        "metalmend_serve_requests_total", api="other", route="unmatched", method="GET", status="4xx"
    )
    assert unmatched - unmatched_before == 1
    exposed = " ".join(
        f"{sample.name}{sample.labels}"
        for family in REGISTRY.collect()
        if family.name.startswith("metalmend_serve")
        for sample in family.samples
    )
    for secret in ("node-7", "busy-node", "secret-token-value", "nowhere"):
        assert secret not in exposed


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, ("other", "unmatched")),
        ("/healthz", ("health", "/healthz")),
        (DRAIN, ("promenade", DRAIN)),
        ("/drydock/api/v1.0/tasks/{task_id}", ("drydock", "/drydock/api/v1.0/tasks/{task_id}")),
        ("/elsewhere/{x}", ("other", "/elsewhere/{x}")),
    ],
)
def test_route_labels(template: str | None, expected: tuple[str, str]) -> None:
    assert webmetrics.route_labels(template) == expected


@pytest.mark.parametrize(
    ("code", "label"), [(200, "2xx"), (204, "2xx"), (409, "4xx"), (503, "5xx"), (999, "other")]
)
def test_status_class(code: int, label: str) -> None:
    assert webmetrics.status_class(code) == label


def drive(erase: Erase, since: dt.datetime | None = None, id_: str = "d1") -> DriveRecord:
    return DriveRecord(id_, "/dev/sda", "S1", None, erase, since=since)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (NodeState(), NodeState(), []),
        (NodeState(), replace(NodeState(), step=Step.POWER_OFF), [("step", "power-off", 0.0)]),
        (
            replace(NodeState(), drives=(drive(Erase.PLANNED),)),
            replace(NodeState(), drives=(drive(Erase.REQUESTED, T0),)),
            [("erase-started", "", 0.0)],
        ),
        (
            replace(NodeState(), drives=(drive(Erase.RUNNING, T0),)),
            replace(NodeState(), drives=(drive(Erase.ERASED, T0),)),
            [("erase", "erased", 600.0)],
        ),
        (
            replace(NodeState(), drives=(drive(Erase.PLANNED),)),
            replace(NodeState(), drives=(drive(Erase.FAILED),)),
            [("erase", "failed", 0.0)],  # refused at its start: counted, no duration known
        ),
        (
            NodeState().say(T0, "started"),
            NodeState().say(T0, "started").fail(T0, "no BMC"),
            [("node", "failure", 600.0)],
        ),
    ],
)
def test_destroy_transitions(
    before: NodeState, after: NodeState, expected: list[destroymetrics.Transition]
) -> None:
    now = T0 + dt.timedelta(seconds=600)
    assert destroymetrics.destroy_transitions(before, after, now) == expected


class Runner:
    """Stands for a node's destroy (anything weakly referenced will do)."""


def test_destroy_is_counted_once_and_its_erases_forgotten_with_it() -> None:
    started = value("metalmend_serve_drive_erases_started_total")
    running_before = value("metalmend_serve_drive_erases_running")
    runner = Runner()
    planned = replace(NodeState(), step=Step.WIPE, drives=(drive(Erase.PLANNED),))
    requested = replace(planned, drives=(drive(Erase.REQUESTED, T0),))
    # Taken up after a restart at "requested": nothing counted the first time it is seen.
    destroymetrics.destroy_seen(runner, requested, T0)
    assert value("metalmend_serve_drive_erases_started_total") == started
    assert value("metalmend_serve_drive_erases_running") == running_before + 1
    assert value("metalmend_serve_drive_erase_oldest_age_seconds") > 0
    other = Runner()
    destroymetrics.destroy_seen(other, planned, T0)
    destroymetrics.destroy_seen(other, replace(planned, drives=(drive(Erase.REQUESTED, T0),)), T0)
    assert value("metalmend_serve_drive_erases_started_total") == started + 1
    done = replace(requested, step=Step.DONE, outcome=Outcome.SUCCESS)
    destroymetrics.destroy_seen(runner, done, T0)
    assert value("metalmend_serve_drive_erases_running") == running_before + 1  # other's
    del other
    gc.collect()
    assert value("metalmend_serve_drive_erases_running") == running_before


def test_database_transactions_by_outcome() -> None:
    def count(outcome: str) -> float:
        return value(
            "metalmend_serve_database_duration_seconds_count", operation="write", outcome=outcome
        )

    before = {o: count(o) for o in ("ok", "error", "aborted")}
    with dbmetrics.transaction(True):
        pass
    with pytest.raises(OperationalError), dbmetrics.transaction(True):
        raise OperationalError("INSERT", {}, sqlite3.OperationalError("disk I/O error"))
    with pytest.raises(ValueError, match="ours"), dbmetrics.transaction(True):
        raise ValueError("ours")
    assert {o: count(o) - before[o] for o in before} == {"ok": 1, "error": 1, "aborted": 1}


async def test_metrics_are_served_on_their_own_address() -> None:
    port = free_port()
    stop = webmetrics.listen(f"127.0.0.1:{port}")
    try:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{port}/metrics")
        assert answer.status_code == 200
        assert "metalmend_serve_requests_total" in answer.text
        assert "metalmend_serve_drive_erases_running" in answer.text
    finally:
        stop()
    assert webmetrics.listen("")() is None  # not asked: nothing to stop


@pytest.mark.parametrize("bind", ["9090", "127.0.0.1:", "127.0.0.1:99999", "host:x"])
def test_a_metrics_bind_that_is_not_host_port_is_refused(bind: str) -> None:
    with pytest.raises(ServeSettingsError, match=r"serve\.metrics_bind must be host:port"):
        check(ServeSettings(metrics_bind=bind))


def test_hosts_are_counted_by_power_state() -> None:
    hosts = [{"status": {"poweredOn": True}}, {"status": {"poweredOn": False}}, {"status": {}}]
    samples = run_metrics.power_samples([*hosts, {"status": {"poweredOn": "yes"}}])
    assert {s[1][0]: s[2] for s in samples} == {"on": 1, "off": 1, "unknown": 2}


def test_health_checks_holding_remediation_back_by_reason() -> None:
    def check_with(status: str, reason: str) -> dict[str, object]:
        condition = {"type": "RemediationAllowed", "status": status, "reason": reason}
        return {"status": {"conditions": [condition]}}

    checks = [
        check_with("False", "TooManyUnhealthy"),
        check_with("False", "InvalidSpec"),
        check_with("False", "SomethingNew"),
        check_with("True", ""),
        {"status": {"conditions": "not a list"}},
    ]
    samples = run_metrics.blocked_check_samples(checks)
    assert {s[1][0]: s[2] for s in samples} == {
        "TooManyUnhealthy": 1,
        "InvalidSpec": 1,
        "other": 1,
    }
