"""Which binaries the lab runs: envtest's variables first, then the version-keyed cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from metalmend_lab import assets


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in (*assets._ENV_NAMES.values(), "KUBEBUILDER_ASSETS"):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("METALMEND_CACHE", str(cache))
    return cache


def fill_cache(cache: Path) -> None:
    versions = assets.pinned_versions()
    executable(cache / "k8s" / f"etcd-{versions['ETCD_VERSION']}" / "etcd")
    for name in ("kube-apiserver", "kube-controller-manager", "kubectl"):
        executable(cache / "k8s" / f"kube-{versions['KUBE_VERSION']}" / name)


def test_cache_is_keyed_by_pinned_versions(clean_env: Path) -> None:
    fill_cache(clean_env)
    found = assets.find_binaries(build_missing=False)
    versions = assets.pinned_versions()
    assert found.etcd.parent.name == f"etcd-{versions['ETCD_VERSION']}"
    assert found.kube_apiserver.parent.name == f"kube-{versions['KUBE_VERSION']}"


def test_kubebuilder_assets_take_precedence(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_cache(clean_env)
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        executable(tmp_path / "kb" / name)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "kb"))
    found = assets.find_binaries(build_missing=False)
    assert found.etcd == tmp_path / "kb" / "etcd"
    assert found.kube_controller_manager == tmp_path / "kb" / "kube-controller-manager"


def test_test_asset_variables_take_precedence_over_kubebuilder_assets(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        executable(tmp_path / "kb" / name)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path / "kb"))
    monkeypatch.setenv(
        "TEST_ASSET_KUBE_APISERVER", str(executable(tmp_path / "mine" / "apiserver"))
    )
    found = assets.find_binaries(build_missing=False)
    assert found.kube_apiserver == tmp_path / "mine" / "apiserver"
    assert found.etcd == tmp_path / "kb" / "etcd"


def test_missing_binaries_name_what_to_do(clean_env: Path) -> None:
    with pytest.raises(assets.AssetsError, match="KUBEBUILDER_ASSETS"):
        assets.find_binaries(build_missing=False)


def test_a_test_asset_variable_naming_nothing_is_refused(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ASSET_ETCD", "/nonexistent/etcd")
    with pytest.raises(assets.AssetsError, match="TEST_ASSET_ETCD=/nonexistent/etcd"):
        assets.find_binaries(build_missing=False)


def test_build_script_without_go_says_what_to_install(clean_env: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # a PATH with bash's helpers but no go
    for tool in ("bash", "dirname", "mktemp", "mkdir", "tail", "rm", "mv", "basename"):
        target = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if target:
            bin_dir.mkdir(exist_ok=True)
            (bin_dir / tool).symlink_to(target)
    result = subprocess.run(
        ["bash", str(assets.BUILD_SCRIPT)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(bin_dir)},
        check=False,
    )
    assert result.returncode == 1
    assert "'go' is not on PATH" in result.stderr
    assert "install Go" in result.stderr
    assert "Traceback" not in result.stderr


def test_capi_manager_is_only_looked_for_never_built(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache: the error names `make capi` and nothing is built (the cache stays
    empty); a filled one (manager and CRDs) is found; METALMEND_CAPI names another."""
    monkeypatch.delenv("METALMEND_CAPI", raising=False)
    with pytest.raises(assets.AssetsError, match=r"make capi"):
        assets.capi_manager()
    assert not (clean_env / "capi").exists() or not any((clean_env / "capi").rglob("manager"))
    version = "v1.14.2"
    for line in (assets.REPO_ROOT / "tools" / "capi" / "versions.env").read_text().splitlines():
        if line.startswith("CAPI_VERSION="):
            version = line.partition("=")[2].strip()
    manager = executable(clean_env / "capi" / version / "manager")
    crds = manager.parent / "crds"
    crds.mkdir()
    for kind in ("machines", "machinehealthchecks", "clusters"):
        (crds / f"cluster.x-k8s.io_{kind}.yaml").write_text("")
    assert assets.capi_manager() == assets.CapiAssets(manager, crds)
    other = executable(clean_env / "elsewhere" / "manager")
    monkeypatch.setenv("METALMEND_CAPI", str(other))
    with pytest.raises(assets.AssetsError, match=r"no Cluster API CRDs"):
        assets.capi_manager()
    (other.parent / "crds").mkdir()
    (other.parent / "crds" / "cluster.x-k8s.io_machines.yaml").write_text("")
    assert assets.capi_manager().manager == other
