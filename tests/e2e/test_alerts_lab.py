"""The chart's alerts in a real Prometheus (built from the same module as promtool:
tools/prometheus/build.sh) scraping both processes in the lab: `metalmend run` (host-power)
and `metalmend serve` (its own /metrics address). A BMC refuses a host's credentials: the
authentication and BMC-error alerts fire; the Secret is fixed: both resolve. A host hangs
while its health check's short-circuit holds remediation back: that alert fires; lifted,
the host is remediated while nothing powers it off (host-power not running): the stuck and
missing-evidence alerts fire, then the failed attempt's; host-power starts, the host is
fenced and back: all resolve (the test prints the timeline).

The alerts are rendered by the chart from shortened settings, and the process runs with
the same settings (by environment), as the chart does it with its settings file: seconds
here, minutes in a cluster."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Secret
from lightkube.types import PatchType

from metalmend.api.resources import (
    BareMetalHost,
    MachineHealthCheck,
    Metal3Remediation,
    Metal3RemediationTemplate,
)
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend_lab import lab
from metalmend_lab import servedeploy as lab_serve
from metalmend_lab.controlplane import free_port
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from tests.e2e.conftest import Metalmend, host
from tests.integration.test_chart import KUBE_VERSION, VALUES
from tests.support import until

REPO = Path(__file__).resolve().parents[2]
# Short enough for a test; the process gets the same values (METALMEND_<SECTION>_<FIELD>).
# Refused logins are retried every 2 s here (no growing wait), so that the fix is seen soon.
# A remediation is stuck after 2 x retry_cap (10 s), its evidence missing after
# 2 x command_retry (6 s), a failed attempt counted over retry_cap (5 s), a health check's
# short-circuit alerted after 2 x template_retry (4 s).
SETTINGS = {
    "power_retry": {
        "cap": 1.0, "authentication_first": 2.0, "authentication_factor": 1.0,
        "authentication_cap": 2.0,
    },
    "power": {"command_retry": 3.0},
    "remediation": {"retry_cap": 5.0},
    "health_checks": {"template_retry": 2.0},
}  # fmt: skip
NAME = "alerting-host"
AUTH, BMC_ERROR = "MetalmendBmcAuthenticationRefused", "MetalmendHostsInBmcError"
STUCK, EVIDENCE = "MetalmendRemediationStuck", "MetalmendFencingEvidenceMissing"
FAILED, BLOCKED = "MetalmendRemediationFailed", "MetalmendRemediationShortCircuited"
REMEDIATION_ALERTS = {BLOCKED, STUCK, EVIDENCE, FAILED}
# The template's powerOffTimeoutSeconds: the attempt fails after it (longer than the stuck
# and evidence alerts wait, so that both fire first).
POWER_OFF_TIMEOUT = 20
REMEDIATING = "machine-health-check,metal3-remediation"


def built(*args: str) -> Path:
    done = subprocess.run(
        ["bash", str(REPO / "tools" / args[0]), *args[1:]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"tools/{args[0]} failed:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def rules(tmp: Path) -> Path:
    helm = built("helm/build.sh")
    sets = [f"settings.{s}.{k}={v}" for s, fields in SETTINGS.items() for k, v in fields.items()]
    result = subprocess.run(
        [str(helm), "template", "metalmend", str(REPO / "deploy" / "chart"),
         "--kube-version", KUBE_VERSION, *VALUES, "--set", "monitoring.prometheusRule.enabled=true",
         *(a for s in sets for a in ("--set", s))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (rule,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "PrometheusRule"]
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


class Prometheus:
    def __init__(self, tmp: Path, targets: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules(tmp))],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [address]}]}
                for job, address in targets.items()
            ],
        }
        (tmp / "prometheus.yaml").write_text(yaml.safe_dump(config))
        self.log = tmp / "prometheus.log"
        argv = [
            str(built("prometheus/build.sh", "prometheus")),
            f"--config.file={tmp / 'prometheus.yaml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]  # fmt: skip
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=5)
        answer.raise_for_status()
        return answer.json()["data"]

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def targets_up(self) -> set[str]:
        found = self.get("/api/v1/targets")["activeTargets"]
        return {t["labels"]["job"] for t in found if t["health"] == "up"}

    def firing(self) -> set[str]:
        found = self.get("/api/v1/alerts")["alerts"]
        return {a["labels"]["alertname"] for a in found if a["state"] == "firing"}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes started in this test run with SETTINGS, as the rules are rendered."""
    for section, fields in SETTINGS.items():
        for key, setting in fields.items():
            monkeypatch.setenv(f"METALMEND_{section}_{key}".upper(), f"{setting:g}")


@pytest.fixture
def controller(hosts_lab: lab.RunningLab, settings_env: None) -> Iterator[Metalmend]:
    process = Metalmend(hosts_lab, "host-power", 3.0)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def serve_metrics(hosts_lab: lab.RunningLab) -> Iterator[str]:
    lab_dir = hosts_lab.plane.workdir.parent
    component, endpoints = lab_serve.start(hosts_lab.plane, hosts_lab.client(), lab_dir)
    assert endpoints.metrics is not None
    yield endpoints.metrics.removeprefix("http://").removesuffix("/metrics")
    component.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    yield client
    await client.close()


def secret(username: str, password: str) -> Any:
    data = {"username": username, "password": password}
    return Secret(
        metadata=ObjectMeta(
            name=NAME, labels={SECRET_LABEL: SECRET_LABEL_VALUE},
            annotations={HOSTS_ANNOTATION: NAME},
        ),
        data={k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    )  # fmt: skip


async def test_a_refused_login_fires_the_alerts_and_fixing_it_resolves_them(
    hosts_lab: lab.RunningLab,
    controller: Metalmend,
    serve_metrics: str,
    kube: AsyncClient,
    tmp_path: Path,
) -> None:
    redfish = host(hosts_lab, "redfish")
    prometheus = Prometheus(
        tmp_path, {"metalmend": f"127.0.0.1:{controller.port}", "metalmend-serve": serve_metrics}
    )
    try:
        await until(prometheus.ready, within=60)
        await until(lambda: prometheus.targets_up() == {"metalmend", "metalmend-serve"}, within=30)
        series = prometheus.get("/api/v1/series", **{"match[]": "metalmend_serve_requests_total"})
        assert series, "serve's own metrics reach Prometheus"
        assert not prometheus.firing() & {AUTH, BMC_ERROR}

        await kube.create(
            secret(redfish.username, redfish.password + "-wrong"), namespace=NAMESPACE
        )
        failing: Any = BareMetalHost(
            metadata=ObjectMeta(name=NAME),
            spec={"online": True, "bmc": {"address": redfish.address, "credentialsName": NAME}},
        )
        await kube.create(failing, namespace=NAMESPACE)
        await until(lambda: {AUTH, BMC_ERROR} <= prometheus.firing(), within=90)

        right = {"data": {"password": base64.b64encode(redfish.password.encode()).decode()}}
        await kube.patch(Secret, NAME, right, namespace=NAMESPACE, patch_type=PatchType.MERGE)
        await until(lambda: not prometheus.firing() & {AUTH, BMC_ERROR}, within=90)
    finally:
        prometheus.stop()
        for kind in (BareMetalHost, Secret):
            with contextlib.suppress(ApiError):  # not created: nothing to clean
                await kube.delete(kind, NAME, namespace=NAMESPACE)


class AlertTimeline:
    """What Prometheus says is firing, and the phase of each remediation, read every 0.25 s
    in a thread; with the test's own marks, a timeline printed at the end."""

    def __init__(self, prometheus: Prometheus, running: lab.RunningLab, watched: set[str]):
        self.prometheus, self.client, self.watched = prometheus, running.client(), watched
        self.began = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.seen: set[str] = set()  # every watched alert seen firing
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def mark(self, what: str) -> None:
        self.lines.append((time.monotonic() - self.began, what))

    def start(self) -> AlertTimeline:
        self.thread.start()
        return self

    def run(self) -> None:
        firing: set[str] = set()
        phases: dict[str, str] = {}
        while not self.stopping.wait(0.25):
            with contextlib.suppress(httpx.HTTPError):
                now = self.prometheus.firing() & self.watched
                for name in sorted(now - firing):
                    self.mark(f"{name} firing")
                for name in sorted(firing - now):
                    self.mark(f"{name} resolved")
                self.seen |= now
                firing = now
            with contextlib.suppress(ApiError):
                found = {
                    r.metadata.name: (r.get("status") or {}).get("phase") or "(none)"
                    for r in self.client.list(Metal3Remediation, namespace=NAMESPACE)
                }
                for name, phase in found.items():
                    if phases.get(name) != phase:
                        self.mark(f"Metal3Remediation {name}: phase {phase}")
                for name in phases.keys() - found.keys():
                    self.mark(f"Metal3Remediation {name} deleted")
                phases = found

    def stop(self) -> str:
        self.stopping.set()
        if self.thread.ident is not None:  # started
            self.thread.join()
        return "\n".join(f"{at:6.1f}s  {what}" for at, what in self.lines)


def short_circuit(client: Any, max_unhealthy: int | str) -> None:
    patch = {"spec": {"maxUnhealthy": max_unhealthy}}
    client.patch(MachineHealthCheck, "workers", patch, namespace=NAMESPACE,
                 patch_type=PatchType.MERGE)  # fmt: skip


def node_ready(running: lab.RunningLab, name: str) -> bool:
    try:
        node = running.client().get(Node, name)
    except ApiError:
        return False
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


@pytest.mark.long
async def test_a_stuck_remediation_fires_its_alerts_and_they_resolve_when_it_ends(
    hosts_lab: lab.RunningLab, settings_env: None, serve_metrics: str, tmp_path: Path
) -> None:
    """A hung host is not remediated while its check's maxUnhealthy is 0
    (MetalmendRemediationShortCircuited). Lifted, its remediation asks for power-off
    while host-power is not running: no one reports the host off, so it is not fenced (MetalmendFencingEvidenceMissing), its
    phase does not move (MetalmendRemediationStuck), and after the template's power-off
    timeout the attempt fails (MetalmendRemediationFailed). host-power starts: the host is
    powered off, its Node fenced, the host powered on and its Node Ready again, the health
    check deletes the remediation: every one of them resolves."""
    client = hosts_lab.client()
    victim = host(hosts_lab, "ipmi").name  # an IPMI lab BMC obeys at once (power_delay 0)
    await until(lambda: node_ready(hosts_lab, victim), within=60)
    remediating = Metalmend(hosts_lab, REMEDIATING, 3.0)
    power = Metalmend(hosts_lab, "host-power", 3.0)
    remediating.start()
    try:
        prometheus = Prometheus(
            tmp_path,
            {"metalmend": f"127.0.0.1:{remediating.port}", "metalmend-serve": serve_metrics},
        )
        timeline = AlertTimeline(prometheus, hosts_lab, REMEDIATION_ALERTS)
        try:
            fence_health_check(client, 2, power_off=POWER_OFF_TIMEOUT, power_on=60)
            short_circuit(client, 0)  # one unhealthy Machine is too many
            await until(prometheus.ready, within=60)
            await until(
                lambda: prometheus.targets_up() == {"metalmend", "metalmend-serve"}, within=30
            )
            assert not prometheus.firing() & REMEDIATION_ALERTS
            timeline.start()
            lab.inject_fault(hosts_lab.plane.workdir.parent, victim, "hang")
            timeline.mark(f"{victim} hung; maxUnhealthy 0; host-power not running")
            await until(lambda: BLOCKED in prometheus.firing(), within=90)
            short_circuit(client, "100%")
            timeline.mark("short-circuit seen firing; maxUnhealthy 100%")

            def phase() -> str | None:
                found = list(client.list(Metal3Remediation, namespace=NAMESPACE))
                return (found[0].get("status") or {}).get("phase") if found else None

            await until(lambda: phase() == "power-off", within=90)
            await until(lambda: {STUCK, EVIDENCE} <= prometheus.firing(), within=60)
            timeline.mark("stuck and evidence missing: seen firing")
            await until(lambda: FAILED in prometheus.firing(), within=60)
            timeline.mark("the attempt failed: seen firing")

            power.start()
            timeline.mark("host-power started")

            def ended() -> bool:
                return phase() is None and node_ready(hosts_lab, victim)

            await until(ended, within=120)
            timeline.mark(f"remediation ended: {victim} fenced, on and Ready")
            await until(lambda: not prometheus.firing() & REMEDIATION_ALERTS, within=60)
            timeline.mark("every remediation alert resolved")
            assert timeline.seen >= REMEDIATION_ALERTS
        finally:
            print(f"\nremediation alerts in Prometheus:\n{timeline.stop()}")
            prometheus.stop()
            await _clean_remediation(hosts_lab, victim, power)
    finally:
        remediating.stop()
        power.stop()


async def _clean_remediation(running: lab.RunningLab, victim: str, power: Metalmend) -> None:
    """Leave the session's lab as found: no check, no template, no remediation (its
    finalizer, run by the process still up, gives the host back), the host on and Ready."""
    client = running.client()
    for kind, name in ((MachineHealthCheck, "workers"), (Metal3RemediationTemplate, "fence")):
        with contextlib.suppress(ApiError):
            client.delete(kind, name, namespace=NAMESPACE)
    lab.inject_fault(running.plane.workdir.parent, victim, "recover")
    for remediation in client.list(Metal3Remediation, namespace=NAMESPACE):
        with contextlib.suppress(ApiError):
            client.delete(Metal3Remediation, remediation.metadata.name, namespace=NAMESPACE)
    if power.process is None:
        power.start()
    await until(lambda: not list(client.list(Metal3Remediation, namespace=NAMESPACE)), within=60)
    await until(lambda: node_ready(running, victim), within=120)
