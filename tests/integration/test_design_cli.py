"""``metalmend design`` against ``metalmend serve`` as an operator runs it (a process,
HTTPS, the ServiceAccount of deploy/rbac/serve.yaml, a SQLite file or PostgreSQL), and
``metalmend serve``'s database at start: created and upgraded, kept across a kill, a bad
URL refused in one line."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client, codecs

from metalmend_lab.controlplane import ControlPlane, free_port
from tests.integration.test_serve_cli import SERVE_RBAC, metalmend, wait_serving
from tests.integration.test_serve_promenade import token

SITE = """---
schema: promenade/Node/v1
metadata: {schema: metadata/Document/v1, name: node-1, labels: {role: worker}}
data: {ip: 10.0.0.1}
---
schema: drydock/Region/v1
metadata: {schema: metadata/Document/v1, name: region}
data: {tag: one}
"""

Run = Callable[..., subprocess.CompletedProcess[str]]  # `metalmend design ARGS...`


@dataclass
class Serve:
    control_plane: ControlPlane
    database_url: str
    port: int = 0
    process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        account = self.control_plane.service_account_kubeconfig(
            "metalmend-system", "metalmend-serve"
        )
        serving = self.control_plane.ca.issue(
            "serve", "metalmend-serve", ip_addresses=("127.0.0.1",), server=True
        )
        self.port = self.port or free_port()
        self.process = metalmend(
            "serve", "--kubeconfig", str(account), "--port", str(self.port),
            "--tls-cert", str(serving.cert), "--tls-key", str(serving.key),
            "--database-url", self.database_url,
        )  # fmt: skip
        trust = ssl.create_default_context(cafile=str(self.control_plane.ca.pair.cert))
        wait_serving(f"{self.url}/healthz", trust, self.process)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=10)


@pytest.fixture
def serve(control_plane: ControlPlane, kube: Client, database_url: str) -> Iterator[Serve]:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    running = Serve(control_plane, database_url)
    running.start()
    yield running
    if running.process is not None and running.process.poll() is None:
        running.process.terminate()
        running.process.communicate(timeout=10)


@pytest.fixture
def design(
    serve: Serve, control_plane: ControlPlane, kube: Client, namespace: str
) -> Iterator[object]:
    caller = token(control_plane, kube, namespace, "designer", "metalmend-deckhand-editor")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "metalmend", "design", *args, "--url", serve.url,
             "--ca", str(control_plane.ca.pair.cert), "--token", caller],
            capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    return run


# The command line over SQLite only (tests/integration/test_site_cli.py says why); the
# kill of the service runs on both kinds of store.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_put_revisions_documents_tag_and_diff_from_the_command_line(
    design: Run, tmp_path: Path
) -> None:
    run = design
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    first = run("put", "site", str(site))
    assert first.returncode == 0, first.stderr
    assert "revision 1" in first.stdout
    assert "holds 2 document(s)" in first.stdout
    again = run("put", "site", str(site))
    assert "unchanged" in again.stdout
    site.write_text(SITE.replace("tag: one", "tag: two"))
    assert "revision 2" in run("put", "site", str(site)).stdout

    tagged = run("tag", "1", "reviewed", "--data", "by=alice", "--data", "ticket=42")
    assert tagged.returncode == 0, tagged.stderr
    assert "revision 1 tagged reviewed" in tagged.stdout
    listed = run("revisions")
    assert "reviewed" in listed.stdout
    assert "2 revision(s)" in listed.stdout
    only = run("revisions", "--tag", "reviewed")
    assert "1 revision(s)" in only.stdout

    documents = run("documents", "2", "--schema", "promenade")
    assert "node-1" in documents.stdout
    assert "region" not in documents.stdout
    as_yaml = run("documents", "2", "--yaml", "--name", "region")
    assert "tag: two" in as_yaml.stdout

    diff = run("diff", "2", "1")
    assert "site" in diff.stdout
    assert "modified" in diff.stdout


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_refusals_are_status_lines_not_tracebacks(design: Run, tmp_path: Path) -> None:
    run = design
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        SITE + "---\nschema: x/Y/v1\nmetadata: {schema: metadata/Document/v1}\ndata: {}\n"
    )
    refused = run("put", "site", str(bad))
    assert refused.returncode == 1
    assert "Error:" in refused.stdout
    assert "document 3 (line 10)" in refused.stdout
    assert "no metadata.name" in refused.stdout
    missing = run("documents", "7")
    assert missing.returncode == 1
    assert "revision 7 not found" in missing.stdout
    assert run("put", "site", str(tmp_path / "absent.yaml")).returncode == 2
    assert "Traceback" not in refused.stderr + missing.stderr


def test_revisions_survive_a_killed_service(serve: Serve, design: Run, tmp_path: Path) -> None:
    run = design
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    assert run("put", "site", str(site)).returncode == 0
    serve.kill()
    serve.start()  # same port, same database: upgraded again, nothing lost
    site.write_text(SITE.replace("tag: one", "tag: two"))
    assert "revision 2" in run("put", "site", str(site)).stdout
    assert "2 revision(s)" in run("revisions").stdout


def test_serve_with_a_database_it_cannot_use_says_so_in_one_line(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    for url, message in [
        ("mysql://u@h/db", "is not supported"),
        (f"sqlite:///{blocked}/under/a/file.sqlite", "cannot create the directory"),
    ]:
        process = metalmend(
            "serve", "--kubeconfig", str(control_plane.kubeconfig), "--database-url", url
        )
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 2
        assert message in stderr
        assert len(stderr.strip().splitlines()) == 1, stderr
