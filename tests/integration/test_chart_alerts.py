"""The chart's monitoring (docs/observability.md): its PrometheusRule passes Prometheus's own
checker and unit tests (promtool, built by tools/prometheus/build.sh), each alert has
what an operator needs (summary, description, severity, a runbook section that exists),
the thresholds follow the settings metalmend runs with, and every metric the alerts and
the dashboard query is one metalmend exports: renaming a metric fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import metalmend.bmc.metrics
import metalmend.controllers.metrics
import metalmend.db.metrics
import metalmend.destroy.metrics
import metalmend.heap
import metalmend.kube.admission
import metalmend.siteactions.metrics
import metalmend.teardown.metrics
import metalmend.web.metrics  # noqa: F401
from metalmend.kube.leader import LeaseTiming
from metalmend.kube.metrics import FROM_CACHES
from metalmend.policy.remediation import Spec
from metalmend.settings import DEFAULTS
from tests.integration.test_chart import KUBE_VERSION, NAMESPACE, VALUES

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart"
UNIT_TESTS = REPO / "tests" / "alerts" / "metalmend.test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
DASHBOARD = CHART / "dashboards" / "metalmend.json"
ON = ["--set", "monitoring.prometheusRule.enabled=true"]


def _built(script: str, what: str) -> Path:
    built = subprocess.run(
        ["bash", str(REPO / "tools" / script)], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, f"tools/{script} failed (make {what}):\n{built.stderr}"
    return Path(built.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def helm() -> Path:
    return _built("helm/build.sh", "helm")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return _built("prometheus/build.sh", "promtool")


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(helm), "template", "metalmend", str(CHART), "--namespace", NAMESPACE,
         "--kube-version", KUBE_VERSION, *VALUES, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def rule_spec(helm: Path, *args: str) -> dict[str, Any]:
    (found,) = [d for d in render(helm, *ON, *args) if d["kind"] == "PrometheusRule"]
    spec: dict[str, Any] = found["spec"]
    return spec


def alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}


def seconds(duration: str) -> float:
    assert duration.endswith("s"), duration
    return float(duration[:-1])


@pytest.fixture(scope="module")
def default_alerts(helm: Path) -> dict[str, dict[str, Any]]:
    return alerts(rule_spec(helm))


def test_monitoring_is_off_by_default(helm: Path) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render(helm)}
    assert not {k for k in kinds if k[0] in ("PrometheusRule", "ServiceMonitor")}
    assert ("ConfigMap", "metalmend-dashboard") not in kinds


def test_promtool_checks_and_unit_tests_pass(helm: Path, promtool: Path, tmp_path: Path) -> None:
    spec = rule_spec(helm)
    for group in spec["groups"]:  # promtool's unit tests compare labels; annotations below
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    checked = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [str(promtool), "test", "rules", UNIT_TESTS.name],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_rules_with_their_annotations_pass_promtool_check(
    helm: Path, promtool: Path, tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec(helm)))
    checked = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_alert_is_unit_tested_firing_and_not_firing(
    default_alerts: dict[str, dict[str, Any]],
) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test["alert_rule_test"]:
            (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    assert set(default_alerts) == fired, "alerts without a case where they fire"
    assert set(default_alerts) <= quiet, "alerts without a case where they do not fire"


def test_every_alert_says_what_to_look_at_and_has_a_runbook_section(
    default_alerts: dict[str, dict[str, Any]],
) -> None:
    sections = {m.group(1).lower() for m in re.finditer(r"^## (\w+)$", RUNBOOKS.read_text(), re.M)}
    for name, rule in default_alerts.items():
        notes = rule["annotations"]
        assert notes["summary"], name
        assert notes["description"], name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page.endswith("docs/runbooks.md"), name
        assert anchor == name.lower(), name
        assert anchor in sections, f"docs/runbooks.md has no section ## {name}"
        for part in ("What it means", "What to check", "How to fix"):
            section = RUNBOOKS.read_text().split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
            assert part in section, f"docs/runbooks.md, {name}: no '{part}'"


def expected_thresholds(power_retry_cap: float, erase_timeout: float) -> dict[str, float]:
    """The thresholds docs/runbooks.md derives from the settings (and two upstream
    defaults), computed here from metalmend's own objects."""
    d = DEFAULTS
    return {
        "MetalmendHostsInBmcError.for": 5 * power_retry_cap,
        "MetalmendBmcAuthenticationRefused.window": 2 * d.power_retry.authentication_first,
        "MetalmendRebootPendingTooLong.above": d.power.soft_timeout
        + 2 * d.power.command_retry
        + d.power.poll_interval,
        "MetalmendRemediationStuck.for": 2 * d.remediation.retry_cap,
        "MetalmendRemediationFailed.window": d.remediation.retry_cap,
        "MetalmendRemediationShortCircuited.for": 2 * d.health_checks.template_retry,
        "MetalmendFencingEvidenceMissing.for": 2 * d.power.command_retry,
        "MetalmendFenceFailed.window": d.remediation.retry_cap,
        "MetalmendNoLeader.for": 4 * LeaseTiming().lease_duration,
        "MetalmendHostsWithoutLiveShard.for": 4 * LeaseTiming().lease_duration,
        "MetalmendReconcileErrors.for": 5 * power_retry_cap,
        "MetalmendLongGcPauses.above": LeaseTiming().retry_period / 2,
        "MetalmendDriveEraseNotFinished.above": erase_timeout / 2,
        "MetalmendServeDatabaseErrors.for": 5 * power_retry_cap,
    }


def rendered_thresholds(found: dict[str, dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, rule in found.items():
        if "for" in rule:
            out[f"{name}.for"] = seconds(rule["for"])
        expr = rule["expr"]
        if window := re.search(r"\[(\d+)s\]", expr):
            out[f"{name}.window"] = float(window.group(1))
        above = re.search(r"> (\d+(?:\.\d+)?)$", expr)
        if above and float(above.group(1)) != 0:
            out[f"{name}.above"] = float(above.group(1))
        if le := re.search(r'le="([\d.]+)"', expr):
            out[f"{name}.above"] = float(le.group(1))
    return out


def test_thresholds_come_from_metalmends_defaults(
    default_alerts: dict[str, dict[str, Any]],
) -> None:
    rendered = rendered_thresholds(default_alerts)
    expected = expected_thresholds(DEFAULTS.power_retry.cap, DEFAULTS.destroy.erase_timeout)
    assert {k: rendered.get(k) for k in expected} == expected


def test_remediation_alerts_fire_before_the_attempt_times_out() -> None:
    """A remediation's phase power-off ends at its power-off timeout (the attempt fails,
    backoff): an alert waiting longer on that phase could never fire. (Before, missing
    evidence waited twice Metal3Remediation's default timeout: never.)"""
    expected = expected_thresholds(DEFAULTS.power_retry.cap, DEFAULTS.destroy.erase_timeout)
    assert expected["MetalmendFencingEvidenceMissing.for"] < Spec().power_off_timeout


def test_thresholds_follow_the_settings_the_chart_renders(helm: Path) -> None:
    settings = ["settings.power_retry.cap=120", "settings.destroy.erase_timeout=7200"]
    found = alerts(rule_spec(helm, *(arg for s in settings for arg in ("--set", s))))
    rendered = rendered_thresholds(found)
    expected = expected_thresholds(120.0, 7200.0)
    assert {k: rendered.get(k) for k in expected} == expected


def test_alerts_of_a_disabled_process_are_not_rendered(helm: Path) -> None:
    groups = [g["name"] for g in rule_spec(helm, "--set", "serve.enabled=false")["groups"]]
    assert groups == ["metalmend-run"]


def test_service_monitors_scrape_both_processes(helm: Path) -> None:
    docs = render(
        helm, "--set", "monitoring.serviceMonitor.enabled=true",
        "--set", "monitoring.labels.release=prometheus",
    )  # fmt: skip
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sorted(m["metadata"]["name"] for m in monitors) == ["metalmend", "metalmend-serve"]
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        wanted = monitor["spec"]["selector"]["matchLabels"]
        (selected,) = [
            s for s in services.values() if wanted.items() <= s["metadata"]["labels"].items()
        ]
        ports = {p["name"] for p in selected["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    serve = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "metalmend-serve"
    )
    container = serve["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-bind=0.0.0.0:9090" in container["args"]
    assert {"name": "metrics", "containerPort": 9090} in container["ports"]


def test_the_dashboard_is_a_configmap_for_grafanas_sidecar(helm: Path) -> None:
    docs = render(helm, "--set", "monitoring.dashboard.enabled=true")
    (found,) = [d for d in docs if d["metadata"]["name"] == "metalmend-dashboard"]
    assert found["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(found["data"]["metalmend.json"]) == json.loads(DASHBOARD.read_text())


# ---- metric names -------------------------------------------------------------------------


def exported() -> set[str]:
    """Every series name metalmend's metrics produce (run's and serve's)."""
    names: set[str] = {g for g in FROM_CACHES.gauges}
    for collector in list(REGISTRY._collector_to_names):  # every collector
        for family in collector.collect() if collector is not FROM_CACHES else ():
            if not family.name.startswith("metalmend_"):
                continue
            if family.type == "counter":
                names |= {f"{family.name}_total", f"{family.name}_created"}
            elif family.type == "histogram":
                names |= {f"{family.name}_{s}" for s in ("bucket", "count", "sum", "created")}
            else:
                names.add(family.name)
    return names


def queried(expr: str) -> set[str]:
    return set(re.findall(r"\bmetalmend_[a-z0-9_]+\b", expr))


def dashboard_exprs() -> list[str]:
    return [
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", ())
    ]


def test_every_metric_the_alerts_query_is_exported(
    default_alerts: dict[str, dict[str, Any]],
) -> None:
    names = exported()
    for name, rule in default_alerts.items():
        assert queried(rule["expr"]) <= names, f"{name}: {queried(rule['expr']) - names}"


def test_every_metric_the_dashboard_queries_is_exported() -> None:
    names = exported()
    exprs = dashboard_exprs()
    assert exprs
    missing = {m for e in exprs for m in queried(e)} - names
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_the_check_fails_for_a_renamed_metric() -> None:
    names = exported() - {"metalmend_hosts_bmc_error"}  # as if renamed in the code
    assert queried("max by (error_type) (metalmend_hosts_bmc_error) > 0") - names
