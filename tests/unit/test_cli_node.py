"""Which service ``metalmend node ...`` calls, and as whom: --url, else the lab's
endpoints.json; --token, else the kubeconfig's token, except that the lab admin's token
serves in the lab unless a kubeconfig is named; a clear line when none of it is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from metalmend.cli.client import CliError, resolve
from metalmend.cli.node import query

LAB = {"url": "https://127.0.0.1:4321", "ca": "/lab/ca.crt", "token": "lab-admin",
       "design_ref": "http://127.0.0.1:99/api/v1.0/revisions/1/rendered-documents"}  # fmt: skip


def lab_dir(tmp_path: Path, data: dict[str, str] | None = LAB) -> Path:
    if data is not None:
        (tmp_path / "endpoints.json").write_text(json.dumps(data))
    return tmp_path


def kubeconfig(tmp_path: Path, user: dict[str, str]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://k"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }))  # fmt: skip
    return path


def test_in_the_lab_everything_comes_from_endpoints_json(tmp_path: Path) -> None:
    service = resolve(None, None, None, None, lab_dir(tmp_path))
    assert (service.url, service.ca, service.token) == (LAB["url"], LAB["ca"], LAB["token"])
    assert service.design_ref == LAB["design_ref"]


def test_a_named_kubeconfig_token_wins_over_the_lab_admins(tmp_path: Path) -> None:
    mine = kubeconfig(tmp_path, {"token": "operator"})
    assert resolve(None, None, None, mine, lab_dir(tmp_path)).token == "operator"
    assert resolve(None, None, "given", mine, lab_dir(tmp_path)).token == "given"


def test_a_url_ignores_the_lab_and_sends_the_kubeconfig_token(tmp_path: Path) -> None:
    mine = kubeconfig(tmp_path, {"token": "operator"})
    service = resolve("https://teardown:8443/", None, None, mine, lab_dir(tmp_path))
    assert (service.url, service.ca, service.token) == ("https://teardown:8443", None, "operator")


def test_no_url_and_no_lab_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(CliError, match="which metalmend serve\\? give --url"):
        resolve(None, None, "t", None, lab_dir(tmp_path, None))


def test_a_kubeconfig_with_a_client_certificate_cannot_lend_a_token(tmp_path: Path) -> None:
    certificate = kubeconfig(
        tmp_path, {"client-certificate-data": "eA==", "client-key-data": "eA=="}
    )
    with pytest.raises(CliError, match=r"has no bearer token .*: give --token"):
        resolve("https://teardown", None, None, certificate, lab_dir(tmp_path))


def test_only_the_parameters_given_are_sent_with_the_services_names() -> None:
    assert query(timeout=60, grace_period=None, drain_node_grace_period=0) == {
        "timeout": "60",
        "drain-node-grace-period": "0",
    }
