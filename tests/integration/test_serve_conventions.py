"""Airship's API conventions in ``metalmend serve`` as an operator runs it (a process,
HTTPS, the ServiceAccount of deploy/rbac/serve.yaml, the real API server): ``/health``
answers 204 to anyone, and a request's ``X-Context-Marker`` comes back on the answer and
is on every line the service logs while handling it."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from lightkube import ApiError, Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend_lab.controlplane import ControlPlane, free_port
from tests.integration.test_serve_cli import SERVE_RBAC, metalmend, wait_serving
from tests.integration.test_serve_promenade import budget_blocks, make_pod, set_status, token

PROMENADE = "/promenade/api/v1.0"
MARKER = "X-Context-Marker"


@dataclass
class Service:
    base: str
    trust: ssl.SSLContext
    process: subprocess.Popen[str]

    def stop(self) -> str:
        """Stop the service; its log (stderr)."""
        self.process.terminate()
        _, stderr = self.process.communicate(timeout=10)
        return stderr


@pytest.fixture
def service(control_plane: ControlPlane, kube: Client, tmp_path: Path) -> Iterator[Service]:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    account = control_plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")
    serving = control_plane.ca.issue(
        "serve", "metalmend-serve", ip_addresses=("127.0.0.1",), server=True
    )
    port = free_port()
    # (its own database: the default, in the user's state directory, is any other run's)
    process = metalmend("serve", "--kubeconfig", str(account), "--port", str(port),
                        "--tls-cert", str(serving.cert), "--tls-key", str(serving.key),
                        "--database-url", f"sqlite:///{tmp_path / 'serve.sqlite'}")  # fmt: skip
    running = Service(
        f"https://127.0.0.1:{port}",
        ssl.create_default_context(cafile=str(control_plane.ca.pair.cert)),
        process,
    )
    wait_serving(f"{running.base}/healthz", running.trust, process)
    yield running
    if process.poll() is None:
        running.stop()


@pytest.fixture
def blocked_node(kube: Client, namespace: str) -> Iterator[str]:
    """A Node whose one pod a PodDisruptionBudget keeps: every drain of it logs refusals."""
    name = f"{namespace}-node"
    kube.create(Node(metadata=ObjectMeta(name=name)))
    make_pod(kube, namespace, name, "web-0", labels={"app": "web"})
    set_status(kube, namespace, "web-0", "Running", ready=True)
    budget_blocks(kube, namespace, "web")
    yield name
    with contextlib.suppress(ApiError):
        kube.delete(Node, name)


def test_health_answers_204_to_anyone_over_https(service: Service) -> None:
    answer = httpx.get(f"{service.base}{PROMENADE}/health", verify=service.trust)
    assert answer.status_code == 204
    assert answer.content == b""
    assert uuid.UUID(answer.headers[MARKER]).version == 4


def test_a_requests_marker_is_echoed_and_on_every_line_logged_for_it(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str,
    blocked_node: str,
) -> None:  # fmt: skip
    caller = token(control_plane, kube, namespace, "ops", "metalmend-promenade-admin")
    drain = f"{service.base}{PROMENADE}/nodes/{blocked_node}/drain?timeout=3&grace-period=1"
    given = str(uuid.uuid4())
    headers = {"Authorization": f"Bearer {caller}"}
    answer = httpx.post(drain, headers={**headers, MARKER: given}, verify=service.trust, timeout=30)
    assert (answer.status_code, answer.json()["reason"]) == (500, "DrainNodeError")
    assert answer.headers[MARKER] == given
    unmarked = httpx.post(drain, headers=headers, verify=service.trust, timeout=30)
    made = unmarked.headers[MARKER]
    assert made != given
    bad = httpx.post(drain, headers={**headers, MARKER: "42"}, verify=service.trust)
    assert (bad.status_code, bad.json()["reason"]) == (400, "BadRequest")

    log = service.stop().splitlines()
    refusals = [line for line in log if "eviction refused" in line]
    # The budget refuses each drain's eviction, asked again until its timeout: each of
    # those lines names the request it was logged for, and no other.
    for marker in (given, made):
        mine = [line for line in refusals if f"context_marker={marker}" in line]
        assert mine, "\n".join(log)
        assert all(f"pod={namespace}/web-0" in line for line in mine)
    assert all(line.count("context_marker=") == 1 for line in refusals)
    assert len(refusals) == sum(
        1
        for line in refusals
        if f"context_marker={given}" in line or f"context_marker={made}" in line
    )
    assert any("request refused" in line and "X-Context-Marker" in line for line in log)
