"""``metalmend site`` against ``metalmend serve`` as an operator runs it (a process, HTTPS,
the ServiceAccount of deploy/rbac/serve.yaml): Shipyard's verbs end to end, the refusals
as Status lines with their exit codes, and an action followed live to its end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import Client

from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_design_cli import Serve, serve
from tests.integration.test_serve_promenade import token

# The command line over SQLite only: what it adds (arguments, Status lines, exit codes, an
# action followed live) does not depend on the database, and both kinds of store are run by
# the API and store tests (test_shipyard_api.py, test_design_store.py, ...).
pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

__all__ = ["serve"]  # a fixture this module uses

Run = Callable[..., subprocess.CompletedProcess[str]]  # `metalmend site ARGS...`


def documents(value: str) -> str:
    return f"""---
schema: promenade/Node/v1
metadata: {{schema: metadata/Document/v1, name: node-1}}
data: {{value: {value}}}
"""


@pytest.fixture
def site(serve: Serve, control_plane: ControlPlane, kube: Client, namespace: str) -> Run:
    caller = token(control_plane, kube, namespace, "operator", "metalmend-shipyard-admin")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "metalmend", "site", *args, "--url", serve.url,
             "--ca", str(control_plane.ca.pair.cert), "--token", caller],
            capture_output=True, text=True, timeout=120,
            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    return run


def test_configdocs_from_the_command_line(site: Run, tmp_path: Path) -> None:
    run = site
    file = tmp_path / "site.yaml"
    file.write_text(documents("1"))
    created = run("create", "configdocs", "site", "--filename", str(file))
    assert created.returncode == 0, created.stdout + created.stderr
    assert "collection site is in the buffer (design revision 1)" in created.stdout
    refused = run("create", "configdocs", "other", "--filename", str(file))
    assert refused.returncode == 1
    assert "Reason: Conflict" in refused.stdout
    assert (
        run(
            "create", "configdocs", "x", "--append", "--replace", "--filename", str(file)
        ).returncode
        == 2
    )
    committed = run("commit", "configdocs")
    assert committed.returncode == 0, committed.stdout
    assert "configdocs committed: design revision 1" in committed.stdout
    file.write_text(documents("2"))
    run("create", "configdocs", "site", "--filename", str(file))
    compared = run("get", "configdocs")
    assert (
        "Comparing Base: committed (Deckhand revision 1) to New: buffer (Deckhand revision 2)"
        in compared.stdout
    )
    assert "modified" in compared.stdout
    same = run("get", "configdocs", "--base-version", "committed", "--diff-version", "buffer")
    assert same.stdout == compared.stdout
    old = run("get", "configdocs", "site", "--committed")
    assert "value: 1" in old.stdout
    assert "value: 2" in run("get", "configdocs", "site").stdout
    both = run("get", "configdocs", "site", "--committed", "--buffer")
    assert both.returncode == 2
    assert "mutually exclusive" in both.stderr + both.stdout
    # Shipyard's own flags: --collection and -b/-c/-l/-s, the messages naming them
    assert run("get", "configdocs", "--collection", "site", "-c").stdout == old.stdout
    assert "value: 2" in run("get", "configdocs", "--collection=site", "-b").stdout
    assert "value: 1" in run("get", "renderedconfigdocs", "-c").stdout
    short = run("get", "configdocs", "--collection", "site", "-c", "-b")
    assert short.returncode == 2
    assert "with --collection give at most one version flag" in short.stderr
    assert "given: -b/--buffer, -c/--committed" in short.stderr
    twice = run("get", "configdocs", "site", "--collection", "site")
    assert twice.returncode == 2
    assert "COLLECTION 'site' and --collection 'site'" in twice.stderr
    two = run("get", "configdocs", "-c", "-b")  # two version flags: a comparison
    assert two.returncode == 0, two.stdout + two.stderr
    assert "modified" in two.stdout
    one = run("get", "configdocs", "-l")
    assert one.returncode == 2
    assert "given: -l/--last-site-action" in one.stderr


def test_actions_from_the_command_line(site: Run, tmp_path: Path) -> None:
    run = site
    file = tmp_path / "site.yaml"
    for value in ("1", "2"):
        file.write_text(documents(value))
        run("create", "configdocs", "site", "--filename", str(file))
        run("commit", "configdocs")
    refused = run("create", "action", "deploy_site")
    assert refused.returncode == 1
    assert "Reason: Intermediate commit detected" in refused.stdout
    assert "revision(s) 1 were committed since the last site action" in refused.stdout
    # redeploy_server: nothing deployed successfully yet, so it fails as a missing
    # precondition; --watch follows it live and exits 1
    watched = run("create", "action", "redeploy_server", "--param", "target_nodes=n1", "--watch")
    assert watched.returncode == 1, watched.stdout + watched.stderr
    assert "design_lookup" in watched.stdout
    assert "missing precondition" in watched.stdout
    assert "Lifecycle:      Failed" in watched.stdout
    action = watched.stdout.split("action/", 1)[1].split()[0]
    listed = run("get", "actions")
    assert action in listed.stdout
    assert "1/1/5" in listed.stdout  # preflight succeeded, design_lookup failed, 5 not run
    described = run("describe", "action", f"action/{action}")
    assert "upstream_failed" in described.stdout
    assert "invoke" in described.stdout
    # Shipyard's forms: action/ID, step/ID/STEP, step STEP --action ID (-a)
    assert run("describe", f"action/{action}").stdout == described.stdout
    step = run("describe", f"step/{action}/design_lookup")
    assert step.returncode == 0, step.stdout + step.stderr
    assert f"step/{action}/design_lookup" in step.stdout
    assert "missing precondition" in step.stdout
    assert run("describe", "step", "design_lookup", "-a", action).stdout == step.stdout
    unnamed = run("describe", "step", "design_lookup")
    assert unnamed.returncode == 2
    assert "step STEP --action ID" in unnamed.stderr
    other = run("describe", f"workflow/{action}")
    assert other.returncode == 2
    assert "name an action (action/ID" in other.stderr
    stopped = run("stop", "action", action)
    assert stopped.returncode == 1
    assert "cannot be stopped" in stopped.stdout
    assert run("stop", f"action/{action}").stdout == stopped.stdout
