"""``metalmend serve`` as ``lab up`` starts it: found through ``.lab/endpoints.json`` alone
(URL, CA, token), called over TLS like any client would, restarted when it dies, and the
``metalmend node ...`` commands against it, in a shell. The shutdown-kubelet DaemonSet runs
in the lab and stops a lab kubelet for real (its Lease stops)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lightkube.resources.core_v1 import Node

from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from tests.support import Deadline

PROMENADE = "/promenade/api/v1.0"


@pytest.fixture(scope="module")
def serving_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=6.0,
        hosts=2,
        bmc="ipmi",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        wait_for(lambda: len(list(running.client().list(Node))) == 2, "both lab Nodes registered")
        yield running


def wait_for(check: object, what: str, within: float = 60.0) -> None:
    deadline = Deadline(within)
    while not check():  # type: ignore[operator]
        assert not deadline.expired(), f"timed out waiting for {what}"
        time.sleep(0.2)


def trusting(data: dict[str, str]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=data["ca"])


def endpoints(running: lab.RunningLab) -> dict[str, str]:
    path = running.plane.workdir.parent / "endpoints.json"
    data: dict[str, str] = json.loads(path.read_text())
    return data


def post(data: dict[str, str], path: str) -> httpx.Response:
    return httpx.post(
        data["url"] + path,
        headers={"Authorization": f"Bearer {data['token']}"},
        verify=trusting(data),
        timeout=120,
    )


def node_cli(running: lab.RunningLab, *args: str) -> subprocess.CompletedProcess[str]:
    lab_dir = str(running.plane.workdir.parent)
    environ = {k: v for k, v in os.environ.items() if k != "METALMEND_LAB_DIR"}
    return subprocess.run(
        [sys.executable, "-m", "metalmend", "node", *args, "--dir", lab_dir],
        capture_output=True, text=True, timeout=180, check=False, env=environ,
    )  # fmt: skip


def test_endpoints_json_says_exactly_where_and_how_to_call_the_service(
    serving_lab: lab.RunningLab,
) -> None:
    path = serving_lab.plane.workdir.parent / "endpoints.json"
    data = endpoints(serving_lab)
    assert set(data) <= {"url", "ca", "token", "design_ref", "metrics"}
    assert {"url", "ca", "token"} <= set(data)
    assert data["url"].startswith("https://127.0.0.1:")
    assert Path(data["ca"]).is_absolute()
    assert Path(data["ca"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds a token
    # The certificate is the lab CA's, for 127.0.0.1: verification needs nothing else.
    answer = httpx.get(
        data["url"] + "/openapi.json",
        headers={"Authorization": f"Bearer {data['token']}"},
        verify=trusting(data),
        timeout=10,
    )
    assert f"{PROMENADE}/nodes/{{node_id}}/drain" in answer.json()["paths"]


def test_the_token_of_endpoints_json_drains_a_lab_node(serving_lab: lab.RunningLab) -> None:
    data = endpoints(serving_lab)
    answer = post(data, f"{PROMENADE}/nodes/worker-0/drain?timeout=60&grace-period=5")
    document = answer.json()
    assert (answer.status_code, document["reason"]) == (200, "Success"), document
    assert [m["message"] for m in document["details"]["messageList"]][-1] == (
        "node/worker-0 drained"
    )
    assert serving_lab.client().get(Node, "worker-0").spec.unschedulable is True
    anonymous = httpx.post(
        data["url"] + f"{PROMENADE}/nodes/worker-0/drain", verify=trusting(data), timeout=30
    )
    assert anonymous.status_code == 401


def test_the_cli_shuts_a_lab_kubelet_down_through_the_daemonset(
    serving_lab: lab.RunningLab,
) -> None:
    done = node_cli(serving_lab, "shutdown-kubelet", "worker-1")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "Node worker-1 kubelet shut down" in done.stdout
    assert "- Info: node/worker-1 labelled promenade-decomission=enabled" in done.stdout
    assert "shutting worker-1's kubelet down" in done.stderr  # progress, while it ran
    hardware = json.loads(
        (serving_lab.plane.workdir.parent / "hardware" / "status.json").read_text()
    )
    assert hardware["worker-1"]["kubelet"] == "disabled"
    assert hardware["worker-1"]["power"] == "on"  # the server runs; its kubelet does not


def test_the_cli_reports_a_refusal_with_a_failing_exit_code(serving_lab: lab.RunningLab) -> None:
    refused = node_cli(serving_lab, "remove-from-cluster", "worker-1")
    assert refused.returncode == 1
    assert "Error: Node worker-1 cannot be removed yet" in refused.stdout
    assert "Reason: Conflict" in refused.stdout
    assert "- Error: Node worker-1 is not cordoned: drain it first" in refused.stdout


def test_the_cli_says_in_one_line_when_the_service_cannot_be_reached(
    serving_lab: lab.RunningLab,
) -> None:
    closed = f"https://127.0.0.1:{free_port()}"
    failed = node_cli(serving_lab, "drain", "worker-0", "--url", closed, "--token", "x")
    assert failed.returncode == 3
    *progress, error = failed.stderr.strip().splitlines()
    assert progress == [f"draining worker-0 ({closed})"]
    assert error.startswith(f"metalmend: cannot reach metalmend serve at {closed}: ")
    assert "Traceback" not in failed.stderr


def test_the_lab_restarts_the_service_when_it_dies(serving_lab: lab.RunningLab) -> None:
    serve = serving_lab.extras["metalmend-serve"]
    old = serve.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    data = endpoints(serving_lab)

    def answers_again() -> bool:
        serving_lab.check()  # what the supervisor's loop does twice a second
        try:
            return post(
                data, f"{PROMENADE}/nodes/worker-0/drain?timeout=30&grace-period=1"
            ).is_success
        except httpx.HTTPError:
            return False

    wait_for(answers_again, "metalmend serve to be restarted and answer")
    assert serve.pid != old
    assert serving_lab.state.restarts["metalmend-serve"] == 1
