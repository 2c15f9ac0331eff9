"""Warm start of the lab control plane: seconds until etcd answers /health, kube-apiserver
answers /readyz ok, and kube-controller-manager's controllers act (the default
ServiceAccount exists); then the CRDs established; then a full stop.

Warm means the binaries are already built and cached. Prints one row per run and the
median; asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from lightkube import Client, KubeConfig

from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig


def one_run(workdir: Path) -> dict[str, float]:
    plane = ControlPlane(ControlPlaneConfig(workdir=workdir))
    began = time.monotonic()
    plane.start()
    install_crds(Client(KubeConfig.from_file(plane.kubeconfig)))
    crds = time.monotonic() - began
    stopping = time.monotonic()
    plane.stop()
    return {
        "etcd": plane.ready_after["etcd"],
        "readyz": plane.ready_after["kube-apiserver"],
        "controllers": plane.ready_after["kube-controller-manager"],
        "crds": crds,
        "stop": time.monotonic() - stopping,
    }


def main(runs: int = 3) -> None:
    print(f"control plane warm start, {runs} runs (seconds)")
    columns = ("etcd", "readyz", "controllers", "crds", "stop")
    print("run  " + "  ".join(f"{c:>11}" for c in columns))
    results = []
    for run in range(runs):
        with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
            result = one_run(Path(workdir))
        results.append(result)
        print(f"{run + 1:>3}  " + "  ".join(f"{result[c]:>11.2f}" for c in columns))
    medians = {c: statistics.median(r[c] for r in results) for c in columns}
    print("med  " + "  ".join(f"{medians[c]:>11.2f}" for c in columns))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
