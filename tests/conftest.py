"""Shared fixtures: one real control plane per test session, a fresh namespace per test.

Tests are marked by directory: tests/unit -> unit, tests/integration -> integration,
tests/e2e -> e2e. Only tests that ask for a control-plane fixture start one.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, settings
from lightkube import ApiError, AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace

from metalmend.kube.crds import install_crds
from metalmend_lab.controlplane import ADMIN_USER, ControlPlane, ControlPlaneConfig
from metalmend_lab.policies import POLICIES, name_writers

# The databases of metalmend serve's stores: `database_url` is a SQLite file or a fresh
# PostgreSQL database of a throwaway cluster (tests/postgres.py), one test per kind.
from tests.postgres import database_url, postgres_server  # noqa: F401
from tests.support import THOROUGH, slowness

# Property tests are tables of generated cases, not timing tests: no per-example deadline
# and no "too slow" health check (a loaded 2-core CI runs an example 10x slower than an idle
# laptop). The short form (CI) draws the same cases on every run, so that a red run can be
# rerun and a green one means the same thing everywhere; the thorough form
# (tests/support.py, THOROUGH) draws fresh ones every run.
settings.register_profile(
    "short", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("thorough" if THOROUGH else "short")

# Short enough that node-lifecycle tests take seconds, long enough for a loaded 2-core CI.
NODE_MONITOR_GRACE_PERIOD = 6.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for kind in ("unit", "integration", "e2e"):
            if f"tests/{kind}/" in Path(item.path).as_posix():
                item.add_marker(getattr(pytest.mark, kind))


# pytest-xdist's `--dist loadfile` keeps a test file in one worker, so its module fixtures
# start once. The e2e lab with hosts (`hosts_lab`, tests/e2e/conftest.py) is a session
# fixture: every worker that runs one of the files asking for it starts a lab of its own
# (a control plane, BMCs, kubelet simulators: 15 % of a core each, idle, for the rest of
# the run). Those files go to one worker, one after another: one lab per run. And the
# files go out in the order collected (tests/e2e first, whose labs take minutes, the quick
# unit tables last), not xdist's default of the most tests first, which left one worker
# running a lab test for ten minutes at the end while the others had nothing to do.
SHARED_LAB = "hosts_lab"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` with every file that asks for ``SHARED_LAB`` as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))
    uses_lab: dict[str, bool] = {}

    class OneLabPerRun(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            if scope not in uses_lab:
                path = root / scope
                uses_lab[scope] = path.name != "conftest.py" and path.is_file() and (
                    SHARED_LAB in path.read_text(encoding="utf-8")
                )
            return SHARED_LAB if uses_lab[scope] else scope

    config.option.loadscopereorder = False
    return OneLabPerRun(config, log)  # type: ignore[arg-type]


# The most a stretched limit grows to: a test stuck in a wait that cannot end costs a run at
# most this long (on two cores, a third of the suite's time), not its limit times 5.
LONGEST = 1500.0


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """pytest-timeout's limit for this test (its ``timeout`` mark, else the ini's) stretched
    by the machine's slowness as the test starts, as every wait's deadline is
    (tests/support.py, "deadlines that follow the machine's load"): set before
    pytest-timeout reads it."""
    del nextitem
    factor = slowness()
    if factor > 1.0:
        mark = item.get_closest_marker("timeout")
        base = item.config.getini("timeout")
        if mark is not None:
            base = mark.args[0] if mark.args else mark.kwargs.get("timeout", base)
        if base and float(base) > 0:
            limit = min(float(base) * factor, max(float(base), LONGEST))
            item.add_marker(pytest.mark.timeout(limit), append=False)
    return (yield)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    config = ControlPlaneConfig(
        workdir=tmp_path_factory.mktemp("controlplane"),
        node_monitor_grace_period=NODE_MONITOR_GRACE_PERIOD,
        node_monitor_period=1.0,
        # PodTemplates bypass the watch cache, so that compacting etcd makes a resumed
        # watch answer 410 Gone for real (tests of the informer's re-list use them).
        apiserver_args=("--watch-cache-sizes=podtemplates#0",),
    )
    plane = ControlPlane(config)
    plane.start()
    try:
        client = Client(KubeConfig.from_file(plane.kubeconfig))
        install_crds(client)
        keep_param_informers(client)
        yield plane
    finally:
        plane.stop()


def keep_param_informers(client: Client) -> None:
    """One admission policy per parameter kind that the tests' policies use (deploy/policies:
    ConfigMap, Secret), bound to no namespace, for the whole session. The API server starts
    an informer for a kind of parameters when a policy first names it and stops it when the
    last one goes; the tests install and remove their policies one after another, and in two
    of three full runs (load 7 to 20) the informer started again that way never saw a
    new namespace's ConfigMap: "failed to configure binding: no params found" for minutes,
    the policy never in force. With these, the informers start once and stay."""
    for kind, resource in (("ConfigMap", "configmaps"), ("Secret", "secrets")):
        name = f"tests-keep-{resource}-params"
        client.create(codecs.from_dict({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "paramKind": {"apiVersion": "v1", "kind": kind},
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                    "resources": [resource],
                }]},
                "validations": [{"expression": "true"}],
            },
        }))  # fmt: skip
        client.create(codecs.from_dict({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "paramRef": {"name": "none", "namespace": "none",
                             "parameterNotFoundAction": "Allow"},
                "matchResources": {"namespaceSelector": {
                    "matchLabels": {"metalmend.dev/tests-never": "true"}}},
            },
        }))  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_store_record(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test that starts a ``metalmend serve`` gives it a database of its own, so the
    record of the store an earlier test's serve kept in the cluster (docs/design-store.md,
    "When the store is replaced") is removed after each test on the control plane, as an
    operator would for a deliberately new store. Without it the next serve refuses to
    start, as it should on a real cluster."""
    yield
    if "control_plane" not in request.fixturenames:
        return
    plane: ControlPlane = request.getfixturevalue("control_plane")
    with contextlib.suppress(ApiError):
        Client(KubeConfig.from_file(plane.kubeconfig)).delete(
            ConfigMap, "metalmend-serve-store", namespace="metalmend-system"
        )


@pytest.fixture
def kube(control_plane: ControlPlane) -> Client:
    """A synchronous admin client (a new one per test: connections kept alive across an
    apiserver restart would fail their next request)."""
    return Client(KubeConfig.from_file(control_plane.kubeconfig), field_manager="metalmend-tests")


@pytest.fixture
async def aclient(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    """An asynchronous admin client, closed after the test."""
    client = AsyncClient(
        KubeConfig.from_file(control_plane.kubeconfig), field_manager="metalmend-tests"
    )
    yield client
    await client.close()


@pytest.fixture
def namespace(kube: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace, deleted (without waiting) after the test."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"{stem}-{secrets.token_hex(3)}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


@pytest.fixture
def node_names_guarded(kube: Client) -> None:
    """deploy/policies/node-name-writers.yaml in force in this session's cluster (applied
    again by each test that asks: one that removes it puts it back), with the tests' admin
    its one writer: without it, metalmend trusts no host's ``metalmend.dev/node-name``
    (api/links.node_host)."""
    guard_node_names(kube)


def guard_node_names(kube: Client) -> None:
    for document in yaml.safe_load_all((POLICIES / "node-name-writers.yaml").read_text()):
        if document["kind"] == "ValidatingAdmissionPolicy":
            name_writers(document, ADMIN_USER)
        kube.apply(codecs.from_dict(document), force=True)
