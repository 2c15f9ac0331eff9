"""`metalmend run` on a cluster whose CRDs are older than the controllers asked for (a Helm
upgrade, which never installs a chart's new CRDs): it refuses at start, in one line naming
each kind that is not served, which controller needs it and the command that installs it,
instead of informers retrying forever behind a 503 /readyz. Controllers whose kinds are
served start as before. A CRD deleted while run runs is named in /readyz and said once in
the log, and watched again once reinstalled. The real API server, with every CRD but the
two newest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from metalmend.api.resources import CRD_DIR
from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig, free_port
from tests.support import answers, started

NOT_INSTALLED = (
    "remediation.metalmend.dev_fenceremediations.yaml",
    "healthcheck.metalmend.dev_nodehealthchecks.yaml",
)


@pytest.fixture(scope="module")
def older_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    crds = tmp_path_factory.mktemp("crds")
    for path in CRD_DIR.glob("*.yaml"):
        if path.name not in NOT_INSTALLED:
            shutil.copy(path, crds)
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path_factory.mktemp("older-plane")))
    plane.start()
    try:
        install_crds(Client(KubeConfig.from_file(plane.kubeconfig)), crds)
        yield plane
    finally:
        plane.stop()


def run(plane: ControlPlane, controllers: str, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(plane.kubeconfig),
         "--controllers", controllers, "--health-bind", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_controllers_whose_kinds_are_not_served_are_refused_in_one_line(
    older_plane: ControlPlane,
) -> None:
    process = run(older_plane, "node-link,fence-remediation,node-health-check", free_port())
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("metalmend: the API server does not serve "), line
    assert "fenceremediations.remediation.metalmend.dev/v1alpha1 (for fence-remediation)" in line
    assert "nodehealthchecks.healthcheck.metalmend.dev/v1alpha1 (for node-health-check)" in line
    for name in NOT_INSTALLED:
        assert f"-f deploy/crds/{name}" in line
    assert "never on an upgrade" in line
    assert "nodes" not in line.split(":")[1]  # a served kind is not named


def test_controllers_whose_kinds_are_served_start(older_plane: ControlPlane) -> None:
    port = free_port()
    process = run(older_plane, "node-link,machine-health-check", port)
    try:
        started(
            answers(f"http://127.0.0.1:{port}/readyz"),
            f"metalmend run (node-link, machine-health-check) to answer 200 on"
            f" http://127.0.0.1:{port}/readyz",
            process,
        )
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    assert "Traceback" not in stderr


GONE = "cluster.x-k8s.io_machinehealthchecks.yaml"  # machine-health-check's own kind


def test_a_crd_deleted_under_a_running_run_is_named_in_readyz_and_said_once(
    older_plane: ControlPlane, tmp_path: Path
) -> None:
    """Issue 36, point 8: after a CRD was deleted mid-run /readyz said "API server out of
    reach ... 404". Now it names the kind and the fix, the log says it in one line (no
    retry loop), /healthz stays ok (a restart would only refuse to start), and once the
    CRD is back the replica watches it again and is ready without a restart."""
    kube = Client(KubeConfig.from_file(older_plane.kubeconfig))
    port = free_port()
    process = run(older_plane, "node-link,machine-health-check", port)
    readyz, healthz = f"http://127.0.0.1:{port}/readyz", f"http://127.0.0.1:{port}/healthz"
    try:
        started(answers(readyz), f"metalmend run to answer 200 on {readyz}", process)
        kube.delete(CustomResourceDefinition, "machinehealthchecks.cluster.x-k8s.io")
        started(
            answers(readyz, ok=lambda code: code == 503),
            f"{readyz} to answer 503 once machinehealthchecks are not served",
            process,
        )
        text = httpx.get(readyz, timeout=5).text
        assert (
            "the API server no longer serves machinehealthchecks.cluster.x-k8s.io/v1beta1" in text
        ), text
        assert f"kubectl apply --server-side -f deploy/crds/{GONE}" in text, text
        assert "out of reach" not in text, text
        assert httpx.get(healthz, timeout=5).status_code == 200
        back = tmp_path / "crds"
        back.mkdir()
        shutil.copy(CRD_DIR / GONE, back)
        install_crds(kube, back)
        started(answers(readyz), f"{readyz} to answer 200 again once the CRD is back", process)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
        if "machinehealthchecks.cluster.x-k8s.io" not in [
            c.metadata.name for c in kube.list(CustomResourceDefinition) if c.metadata
        ]:
            install_crds(kube, CRD_DIR)  # the module's other tests need it
    assert "Traceback" not in stderr, stderr
    said = [line for line in stderr.splitlines() if "machinehealthchecks" in line]
    gone = [line for line in said if "no longer serves" in line]
    assert len(gone) == 1, stderr
    assert [line for line in said if line not in gone and "served again" not in line] == [], said


NOT_SERVED = "Machines of this API are not served: not read"


def _said(stderr: str, api: str) -> list[str]:
    return [line for line in stderr.splitlines() if NOT_SERVED in line and api in line]


def test_a_machine_kind_not_served_is_skipped_in_one_log_line(older_plane: ControlPlane) -> None:
    """Issue 37, point 6: OpenShift's Machines on a cluster that serves only Cluster API's
    (this plane: metalmend's CRDs), then neither (Cluster API's CRD deleted): the
    controllers that follow Machines start and are ready; each kind not served is one log
    line, never an informer retrying."""
    kube = Client(KubeConfig.from_file(older_plane.kubeconfig))
    controllers = "node-link,machine-remediation"
    for deployment in ("cluster-api", "neither"):
        if deployment == "neither":
            kube.delete(CustomResourceDefinition, "machines.cluster.x-k8s.io")
        port = free_port()
        process = run(older_plane, controllers, port)
        readyz = f"http://127.0.0.1:{port}/readyz"
        try:
            started(answers(readyz), f"metalmend run ({deployment}) to answer 200 on {readyz}",
                    process)  # fmt: skip
            # ready is after the kinds were decided and every informer synced: a retrying
            # informer would have said so again by the next reads
            for _ in range(3):
                assert httpx.get(readyz, timeout=5).status_code == 200
        finally:
            process.terminate()
            _, stderr = process.communicate(timeout=30)
            if deployment == "neither":
                install_crds(kube, CRD_DIR)  # the module's other tests need it
        assert "Traceback" not in stderr, stderr
        assert len(_said(stderr, "machine.openshift.io/v1beta1")) == 1, stderr
        capi = _said(stderr, "cluster.x-k8s.io/v1beta1")
        assert len(capi) == (1 if deployment == "neither" else 0), stderr
        assert "machines" not in " ".join(
            line for line in stderr.splitlines() if "WARNING" in line or "ERROR" in line
        ), stderr
