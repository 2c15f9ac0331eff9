"""``pip install metalmend`` without extras, as a user installs it: the wheel built from this
checkout, in a clean virtualenv, without the lab and the demos (metalmend-lab);
``metalmend run`` from it reboots a lab host and ``metalmend serve`` from it answers
(docs/install.md)."""

from __future__ import annotations

import signal
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.types import PatchType

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.api.stamps import parse_stamp
from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import host
from tests.packaging import REPO, Installed, build_wheel, clean_env, install_without_extras
from tests.support import Deadline, answers, started

PACKAGE = REPO / "src" / "metalmend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    wheel = build_wheel(tmp_path_factory.mktemp("dist"))
    return install_without_extras(wheel, tmp_path_factory.mktemp("venv"))


def metalmend(installed: Installed, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """From a directory outside the checkout, so that only the installed wheel is imported."""
    return subprocess.run(
        [str(installed.metalmend), *args], capture_output=True, text=True, cwd=cwd,
        env=clean_env(), timeout=60, check=False,
    )  # fmt: skip


def data_files_of_the_package() -> set[str]:
    """Every file under src/metalmend that is not Python source: read at run time."""
    return {
        f"metalmend/{path.relative_to(PACKAGE).as_posix()}"
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".py", ".pyc")
    }


def test_the_wheel_carries_every_file_the_package_reads(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert data_files_of_the_package() <= names
    assert "metalmend/crds/metal3.io_baremetalhosts.yaml" in names


def test_the_wheel_carries_neither_the_lab_nor_the_demos(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert [n for n in names if n.startswith("metalmend_lab") or "/lab/" in n] == []
    assert [n for n in names if "demo" in n] == []
    assert all(n.startswith(("metalmend/", "metalmend-")) for n in names)


def test_run_and_serve_help_without_the_lab(installed: Installed, tmp_path: Path) -> None:
    for module in ("metalmend_lab", "sushy_tools", "bcrypt"):
        probe = subprocess.run(
            [str(installed.python), "-c", f"import {module}"], cwd=tmp_path, check=False
        )
        assert probe.returncode != 0, f"{module} must not come with metalmend"
    for command in ("run", "serve"):
        result = metalmend(installed, command, "--help", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "Usage" in result.stdout
        assert "Traceback" not in result.stderr


def test_lab_commands_without_the_lab_say_how_to_get_it_in_one_line(
    installed: Installed, tmp_path: Path
) -> None:
    for args in (("lab", "up"), ("lab", "status"), ("demo",), ("demo-site",)):
        result = metalmend(installed, *args, cwd=tmp_path)
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            "metalmend: the lab and the demos come with metalmend-lab, which is not installed"
            " here: in a checkout of metalmend, run 'pip install ./lab' (make venv does)"
        ]


def rebooted_since(kube: Client, name: str, asked: float) -> bool:
    provisioning = (kube.get(BareMetalHost, name, namespace=NAMESPACE).get("status") or {}).get(
        "provisioning"
    ) or {}
    pending = parse_stamp(provisioning.get("pendingRebootSince"))
    last = parse_stamp(provisioning.get("lastPoweredOn"))
    return (
        pending is not None and last is not None and asked <= pending.timestamp() < last.timestamp()
    )


@pytest.fixture
def installed_run(
    installed: Installed, hosts_lab: lab.RunningLab
) -> Iterator[subprocess.Popen[str]]:
    """The installed ``metalmend run --controllers host-power``, with the lab's flags."""
    port = free_port()
    argv = lab.controller_argv(
        hosts_lab.kubeconfig, hosts_lab.plane.ca.pair.cert, "host-power", port, 3.0
    )
    assert argv[1:4] == ["-m", "metalmend", "run"]
    process = subprocess.Popen(
        [str(installed.metalmend), *argv[3:]], stderr=subprocess.PIPE, text=True,
        cwd=installed.venv, env=clean_env(),
    )  # fmt: skip
    try:
        started(
            answers(f"http://127.0.0.1:{port}/readyz"),
            f"the installed metalmend run to answer 200 on http://127.0.0.1:{port}/readyz",
            process,
        )
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        assert "Traceback" not in stderr, stderr


def test_installed_run_reboots_a_host_on_request(
    hosts_lab: lab.RunningLab, installed_run: subprocess.Popen[str]
) -> None:
    kube = Client(KubeConfig.from_file(hosts_lab.kubeconfig), field_manager="metalmend-tests")
    spec = host(hosts_lab, "ipmi")
    asked = time.time() - 1
    kube.patch(
        BareMetalHost, spec.name, {"metadata": {"annotations": {REBOOT: ""}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    deadline = Deadline(60)
    while not rebooted_since(kube, spec.name, asked):
        assert installed_run.poll() is None, "metalmend run exited"
        assert not deadline.expired(), "the host was not rebooted within 60 s"
        time.sleep(0.5)
    annotations = kube.get(BareMetalHost, spec.name, namespace=NAMESPACE).metadata.annotations
    assert REBOOT not in (annotations or {})


def test_installed_serve_answers(
    installed: Installed, hosts_lab: lab.RunningLab, tmp_path: Path
) -> None:
    port = free_port()
    process = subprocess.Popen(
        [str(installed.metalmend), "serve", "--kubeconfig", str(hosts_lab.kubeconfig),
         "--bind-address", "127.0.0.1", "--port", str(port),
         "--database-url", f"sqlite:///{tmp_path / 'serve.sqlite'}"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        # A store of its own, recorded beside the lab's serve's (docs/design-store.md):
        # the lab's record in metalmend-system names the lab's database.
        env={**clean_env(), "METALMEND_SERVE_STORE_NAMESPACE": NAMESPACE},
    )  # fmt: skip
    try:
        started(
            answers(f"http://127.0.0.1:{port}/healthz"),
            f"the installed metalmend serve to answer 200 on http://127.0.0.1:{port}/healthz",
            process,
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert "Traceback" not in stderr, stderr
