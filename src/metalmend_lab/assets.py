"""Where the lab's upstream binaries come from.

Order of precedence, as envtest does it:
1. ``TEST_ASSET_ETCD``, ``TEST_ASSET_KUBE_APISERVER``, ``TEST_ASSET_KUBE_CONTROLLER_MANAGER``
   (and ``TEST_ASSET_KUBE_SCHEDULER``, ``TEST_ASSET_KUBECTL``) name one binary each;
2. ``KUBEBUILDER_ASSETS`` names a directory holding them;
3. the version-keyed cache that ``tools/k8s/build.sh`` fills (built on first use).

The Cluster API manager (``capi_manager``) is found as the other Go tools' binaries are:
``METALMEND_CAPI`` names one, else the cache ``tools/capi/build.sh`` fills (``make capi``);
it is never built here, inside a test's timeout (``tools/capi/build.sh --cached`` only
checks). OpenShift's machine-healthcheck and machine-api CRDs (``openshift_assets``) the same
way: ``METALMEND_OPENSHIFT``, else the cache ``tools/openshift/build.sh`` fills (``make
openshift``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "k8s" / "build.sh"
CAPI_BUILD_SCRIPT = REPO_ROOT / "tools" / "capi" / "build.sh"
OPENSHIFT_BUILD_SCRIPT = REPO_ROOT / "tools" / "openshift" / "build.sh"
VERSIONS_FILE = REPO_ROOT / "tools" / "k8s" / "versions.env"

_ENV_NAMES = {
    "etcd": "TEST_ASSET_ETCD",
    "kube-apiserver": "TEST_ASSET_KUBE_APISERVER",
    "kube-controller-manager": "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    "kube-scheduler": "TEST_ASSET_KUBE_SCHEDULER",
    "kubectl": "TEST_ASSET_KUBECTL",
}
REQUIRED = ("etcd", "kube-apiserver", "kube-controller-manager")
# envtest's asset directories have no scheduler; the lab builds one when it is missing, so
# that pods are scheduled (workloads move when a node is fenced).
WANTED = (*REQUIRED, "kube-scheduler")


class AssetsError(RuntimeError):
    """The binaries cannot be found or built; the message says what to install or set."""


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path | None
    kube_scheduler: Path | None = None


def pinned_versions() -> dict[str, str]:
    """KUBE_VERSION and ETCD_VERSION from tools/k8s/versions.env."""
    versions: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, _, value = line.partition("=")
            versions[name.strip()] = value.strip()
    return versions


def cache_root() -> Path:
    if root := os.environ.get("METALMEND_CACHE"):
        return Path(root) / "k8s"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "metalmend" / "k8s"


def _cached(name: str) -> Path:
    versions = pinned_versions()
    if name == "etcd":
        return cache_root() / f"etcd-{versions['ETCD_VERSION']}" / name
    return cache_root() / f"kube-{versions['KUBE_VERSION']}" / name


def _from_environment(name: str) -> Path | None:
    if named := os.environ.get(_ENV_NAMES[name]):
        path = Path(named)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise AssetsError(f"{_ENV_NAMES[name]}={named} is not an executable file")
        return path
    if assets := os.environ.get("KUBEBUILDER_ASSETS"):
        candidate = Path(assets) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def build() -> None:
    """Run tools/k8s/build.sh (a no-op when the cache is filled); its stderr shows progress."""
    if shutil.which("bash") is None:
        raise AssetsError("bash is needed to run tools/k8s/build.sh")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL, check=False)
    if result.returncode != 0:
        raise AssetsError(
            "building the control plane failed (see the message above); or set KUBEBUILDER_ASSETS"
            " to a directory holding etcd, kube-apiserver and kube-controller-manager"
        )


def find_binaries(*, build_missing: bool = True) -> Binaries:
    """Locate every binary, building the cached ones on first use."""
    found: dict[str, Path | None] = {name: _from_environment(name) for name in _ENV_NAMES}
    missing = [n for n in WANTED if found[n] is None and not _cached(n).exists()]
    if missing and build_missing:
        build()
    for name in _ENV_NAMES:
        if found[name] is None and _cached(name).exists():
            found[name] = _cached(name)
    still_missing = [n for n in REQUIRED if found[n] is None]
    if still_missing:
        raise AssetsError(
            f"missing {', '.join(still_missing)}: run 'make k8s' (needs Go), or set"
            " KUBEBUILDER_ASSETS or TEST_ASSET_* to existing binaries"
        )
    etcd, apiserver, kcm = (found[n] or Path() for n in REQUIRED)
    return Binaries(etcd, apiserver, kcm, found["kubectl"], found["kube-scheduler"])


@dataclass(frozen=True)
class CapiAssets:
    """The Cluster API core manager and the CRDs of the same module version beside it."""

    manager: Path
    crds: Path  # cluster.x-k8s.io_machines.yaml and the rest, as the module generates them


def capi_manager() -> CapiAssets:
    """The cached Cluster API manager (``tools/capi/build.sh --cached``: nothing is
    built); AssetsError naming ``make capi`` when it is not there."""
    if shutil.which("bash") is None:
        raise AssetsError("bash is needed to run tools/capi/build.sh")
    result = subprocess.run(
        ["bash", str(CAPI_BUILD_SCRIPT), "--cached"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AssetsError(
            result.stderr.strip() or "the Cluster API manager is not built (run: make capi)"
        )
    manager = Path(result.stdout.strip().splitlines()[-1])
    crds = manager.parent / "crds"
    if not (crds / "cluster.x-k8s.io_machines.yaml").is_file():
        raise AssetsError(f"no Cluster API CRDs in {crds} beside {manager} (run: make capi)")
    return CapiAssets(manager, crds)


@dataclass(frozen=True)
class OpenShiftAssets:
    """OpenShift's machine-healthcheck, its nodelink-controller where it built (None where
    it did not: tools/openshift/build.sh says why), and the machine-api CRDs beside them."""

    machine_healthcheck: Path
    nodelink_controller: Path | None
    crds: Path  # install/..._02_machine.Default.crd.yaml and the rest, as the module has them

    @property
    def machine_crd(self) -> Path:
        return self.crds / "0000_30_machine-api-operator_02_machine.Default.crd.yaml"


def openshift_assets() -> OpenShiftAssets:
    """The cached OpenShift machine-api build (``tools/openshift/build.sh --cached``: nothing
    is built); AssetsError naming ``make openshift`` when it is not there."""
    if shutil.which("bash") is None:
        raise AssetsError("bash is needed to run tools/openshift/build.sh")
    result = subprocess.run(
        ["bash", str(OPENSHIFT_BUILD_SCRIPT), "--cached"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        missing = "OpenShift's machine-healthcheck is not built (run: make openshift)"
        raise AssetsError(result.stderr.strip() or missing)
    binary = Path(result.stdout.strip().splitlines()[-1])
    crds = binary.parent / "crds"
    found = OpenShiftAssets(binary, None, crds)
    if not found.machine_crd.is_file():
        raise AssetsError(f"no machine-api CRDs in {crds} beside {binary} (run: make openshift)")
    nodelink = binary.parent / "nodelink-controller"
    return OpenShiftAssets(binary, nodelink if os.access(nodelink, os.X_OK) else None, crds)
