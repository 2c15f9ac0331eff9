"""The chart's alerts in a real Prometheus (built from the same module as promtool:
tools/prometheus/build.sh) scraping both processes in the lab: `metalmend run` (host-power)
and `metalmend serve` (its own /metrics address). A BMC refuses a host's credentials: the
authentication and BMC-error alerts fire; the Secret is fixed: both resolve.

The alerts are rendered by the chart from shortened settings, and the process runs with
the same settings (by environment), as the chart does it with its settings file: seconds
here, minutes in a cluster."""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend_lab import lab
from metalmend_lab import servedeploy as lab_serve
from metalmend_lab.controlplane import free_port
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import Metalmend, host
from tests.integration.test_chart import KUBE_VERSION, VALUES
from tests.support import until

REPO = Path(__file__).resolve().parents[2]
# Short enough for a test; the process gets the same values (METALMEND_<SECTION>_<FIELD>).
# Refused logins are retried every 2 s here (no growing wait), so that the fix is seen soon.
SETTINGS = {
    "power_retry": {
        "cap": 1.0, "authentication_first": 2.0, "authentication_factor": 1.0,
        "authentication_cap": 2.0,
    }
}  # fmt: skip
NAME = "alerting-host"
AUTH, BMC_ERROR = "MetalmendBmcAuthenticationRefused", "MetalmendHostsInBmcError"


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
def controller(hosts_lab: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for section, fields in SETTINGS.items():
        for key, setting in fields.items():
            monkeypatch.setenv(f"METALMEND_{section}_{key}".upper(), f"{setting:g}")
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
