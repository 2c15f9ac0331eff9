"""``metalmend serve`` as an operator starts it: HTTPS with a given certificate, on
loopback, with the ServiceAccount of deploy/rbac/serve.yaml; refuses to expose plain HTTP
beyond loopback."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from lightkube import Client, codecs

from metalmend.lab.controlplane import ControlPlane, free_port

SERVE_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "serve.yaml"


def metalmend(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metalmend", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_serving(url: str, verify: ssl.SSLContext, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            httpx.get(url, verify=verify, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("metalmend serve did not answer")


def test_serve_speaks_https_with_the_given_certificate_and_answers_status_bodies(
    control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    account = control_plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")
    serving = control_plane.ca.issue(
        "serve", "metalmend-serve", ip_addresses=("127.0.0.1",), server=True
    )
    port = free_port()
    process = metalmend("serve", "--kubeconfig", str(account), "--port", str(port),
                        "--tls-cert", str(serving.cert), "--tls-key", str(serving.key))  # fmt: skip
    trust = ssl.create_default_context(cafile=str(control_plane.ca.pair.cert))
    base = f"https://127.0.0.1:{port}"
    try:
        wait_serving(f"{base}/openapi.json", trust, process)
        openapi = httpx.get(f"{base}/openapi.json", verify=trust).json()
        assert "/promenade/api/v1.0/nodes/{node_id}/drain" in openapi["paths"]

        anonymous = httpx.post(f"{base}/promenade/api/v1.0/nodes/n1/drain", verify=trust)
        assert (anonymous.status_code, anonymous.json()["reason"]) == (401, "Unauthorized")

        caller = control_plane.service_account_kubeconfig(namespace, "caller")
        token = yaml.safe_load(caller.read_text())["users"][0]["user"]["token"]
        refused = httpx.post(f"{base}/promenade/api/v1.0/nodes/n1/drain", verify=trust,
                             headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert (refused.status_code, refused.json()["reason"]) == (403, "Forbidden")
    finally:
        process.terminate()
        process.wait(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--bind-address", "0.0.0.0"],
            "is not a loopback address: give serve.tls_cert and serve.tls_key",
        ),
        (["--tls-cert", "/nonexistent.crt"], "serve.tls_cert and serve.tls_key go together"),
        (["--port", "70000"], "serve.port must be at most 65535, not 70000"),
        (["--max-body-bytes", "0"], "--max-body-bytes must be a positive whole number, not 0"),
    ],
)
def test_serve_refuses_settings_that_would_expose_tokens_or_cannot_work(
    control_plane: ControlPlane, args: list[str], message: str
) -> None:
    process = metalmend("serve", "--kubeconfig", str(control_plane.kubeconfig), *args)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert message in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_serve_on_a_port_already_taken_says_so_in_one_line(control_plane: ControlPlane) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = metalmend(
            "serve", "--kubeconfig", str(control_plane.kubeconfig), "--port", str(port)
        )
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert f"metalmend: cannot listen on 127.0.0.1:{port}" in stderr
