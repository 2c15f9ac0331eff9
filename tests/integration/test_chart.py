"""The Helm chart (deploy/chart): it lints, renders what deploy/ holds (the same RBAC rules,
admission policies, shutdown DaemonSet and CRDs), passes the API server's own validation,
and installs into a real control plane creating every object. Its Pods cannot start here
(the control plane has no kubelets: they stay Pending); the image test runs the image with
the chart's ServiceAccount instead (tests/e2e/test_image.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from metalmend_lab.assets import find_binaries
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig, free_port
from tests.support import Deadline, answers, started

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart"
NAMESPACE = "metalmend-system"
HOST_NAMESPACES = ("metal3", "edge")
HOSTS = ["--set", f"run.secretNamespaces={{{','.join(HOST_NAMESPACES)}}}"]
# serve's SQLite on a claim the chart creates (an emptyDir is refused: below)
VALUES = [*HOSTS, "--set", "serve.database.persistentVolumeClaim.create=true"]
KUBE_VERSION = "1.36.3"
# The optional admission policies, so that every one of deploy/policies/ is rendered.
OPTIONAL_POLICIES = [
    "--set", "policies.rebootAnnotationWriters.enabled=true",
    "--set", "policies.shardLabelWriters.enabled=true",
]  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    """Built by ``make helm`` before the tests: never here, under a test's timeout."""
    built = subprocess.run(
        ["bash", str(REPO / "tools" / "helm" / "build.sh"), "--cached"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(f"helm missing (make helm builds it):\n{built.stderr}")
    return Path(built.stdout.strip().splitlines()[-1])


def render(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "template", "metalmend", str(CHART), "--namespace", NAMESPACE,
         "--kube-version", KUBE_VERSION, *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind_and_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def deploy_objects(*parts: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for part in parts:
        for path in sorted((REPO / "deploy" / part).glob("*.yaml")):
            docs += objects(path.read_text())
    return by_kind_and_name(docs)


@pytest.fixture(scope="module")
def rendered(helm: Path) -> dict[tuple[str, str], dict[str, Any]]:
    result = render(helm, *VALUES, *OPTIONAL_POLICIES)
    assert result.returncode == 0, result.stderr
    return by_kind_and_name(objects(result.stdout))


def test_chart_lints_strictly(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), *VALUES],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_without_host_namespaces_says_what_to_set(helm: Path) -> None:
    result = render(helm, "--set", "serve.database.acceptDataLoss=true")
    assert result.returncode == 1
    assert "run.secretNamespaces: name the namespaces holding BareMetalHosts" in result.stderr


def test_more_serve_replicas_without_postgresql_are_refused(helm: Path) -> None:
    result = render(helm, *VALUES, "--set", "serve.replicas=2")
    assert result.returncode == 1
    assert "serve.replicas > 1 needs serve.database.urlSecret" in result.stderr


def test_serve_without_persistent_storage_is_refused_unless_the_loss_is_accepted(
    helm: Path,
) -> None:
    refused = render(helm, *HOSTS)
    assert refused.returncode == 1
    assert "serve.database: SQLite on an emptyDir loses every design revision" in refused.stderr
    assert "serve.database.acceptDataLoss=true" in refused.stderr

    accepted = render(helm, *HOSTS, "--set", "serve.database.acceptDataLoss=true")
    assert accepted.returncode == 0, accepted.stderr
    docs = by_kind_and_name(objects(accepted.stdout))
    assert ("PersistentVolumeClaim", "metalmend-serve-data") not in docs
    pod = docs[("Deployment", "metalmend-serve")]["spec"]["template"]["spec"]
    (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
    assert data == {"name": "data", "emptyDir": {}}
    # each restart's empty store recorded without asking: told to serve, not hidden
    assert {"name": "METALMEND_SERVE_STORE_LOSS_ACCEPTED", "value": "true"} in pod["containers"][0][
        "env"
    ]


@pytest.mark.parametrize(
    ("values", "claim"),
    [
        (["--set", "serve.database.persistentVolumeClaim.create=true"], "metalmend-serve-data"),
        (["--set", "serve.database.sqliteClaim=site-serve"], "site-serve"),
    ],
)
def test_serve_keeps_its_sqlite_file_on_a_persistent_volume_claim(
    helm: Path, values: list[str], claim: str
) -> None:
    result = render(helm, *HOSTS, *values)
    assert result.returncode == 0, result.stderr
    docs = by_kind_and_name(objects(result.stdout))
    pod = docs[("Deployment", "metalmend-serve")]["spec"]["template"]["spec"]
    (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
    assert data == {"name": "data", "persistentVolumeClaim": {"claimName": claim}}
    assert "env" not in pod["containers"][0]
    created = docs.get(("PersistentVolumeClaim", "metalmend-serve-data"))
    assert (created is not None) == (claim == "metalmend-serve-data")
    if created is not None:
        assert created["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert created["spec"]["resources"]["requests"]["storage"] == "1Gi"


def test_chart_grants_what_deploy_rbac_grants_and_nothing_more(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    deploy = deploy_objects("rbac")
    roles = [k for k in deploy if k[0] in ("ClusterRole", "Role")]
    assert roles
    for key in roles:
        assert rendered[key]["rules"] == deploy[key]["rules"], (
            f"{key}: deploy/rbac/ changed; run tools/helm/sync-serve-rbac.py (serve), or edit"
            " deploy/chart/templates/rbac-run.yaml the same way (run)"
        )
    chart_roles = {k for k in rendered if k[0] in ("ClusterRole", "Role")}
    assert chart_roles == set(roles), "run tools/helm/sync-serve-rbac.py"


def test_etcd_credentials_secrets_get_a_role_naming_exactly_them(helm: Path) -> None:
    """docs/security.md: serve may get the etcd credentials Secrets the values name, each
    by name in its namespace (those of serve.etcdCredentialsSecrets and those the settings
    make usable for any cluster), and no other Secret through this role."""
    result = render(
        helm, *VALUES,
        "--set", "serve.etcdCredentialsSecrets={kube-system/etcd-client,kube-system/etcd-b,site-a/etcd}",
        "--set", "settings.serve.etcd_credentials_secrets={site-a/etcd,site-a/other}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = objects(result.stdout)
    named = "metalmend-serve-etcd-credentials"
    roles = {d["metadata"]["namespace"]: d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Role", named)}  # fmt: skip
    assert roles["kube-system"]["rules"] == [{
        "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["etcd-b", "etcd-client"],
        "verbs": ["get"],
    }]  # fmt: skip
    assert roles["site-a"]["rules"][0]["resourceNames"] == ["etcd", "other"]
    bindings = [d for d in docs if (d["kind"], d["metadata"]["name"]) == ("RoleBinding", named)]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["kube-system", "site-a"]
    assert all(b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                "name": named} for b in bindings)  # fmt: skip
    assert all(b["subjects"][0]["name"] == "metalmend-serve" for b in bindings)
    bad = render(helm, *VALUES, "--set", "serve.etcdCredentialsSecrets={etcd-client}")
    assert bad.returncode != 0
    assert "is not namespace/name" in bad.stderr


def test_chart_admission_policies_and_daemonset_are_deploys(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    deploy = deploy_objects("policies", "teardown")
    for key, wanted in deploy.items():
        if key[0] == "Namespace":
            continue
        assert key in rendered, key
        assert rendered[key].get("spec") == wanted.get("spec"), key
        assert rendered[key].get("data") == wanted.get("data"), key


def test_chart_crds_are_the_repositorys(helm: Path) -> None:
    shipped = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    ours = sorted(p.name for p in (REPO / "deploy" / "crds").glob("*.yaml"))
    assert shipped == ours
    for name in ours:
        assert (CHART / "crds" / name).read_bytes() == (
            REPO / "deploy" / "crds" / name
        ).read_bytes(), f"deploy/chart/crds/{name} differs from deploy/crds/{name}: copy it over"


def test_controller_deployment_leads_probes_and_requests(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    run = rendered[("Deployment", "metalmend")]["spec"]
    assert run["replicas"] == 2
    (container,) = run["template"]["spec"]["containers"]
    assert "--leader-elect" in container["args"]
    assert f"--leader-election-namespace={NAMESPACE}" in container["args"]
    assert f"--secret-namespaces={','.join(HOST_NAMESPACES)}" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["ports"] == [{"name": "metrics", "containerPort": 8081}]
    assert container["resources"]["requests"] == {"cpu": "50m", "memory": "160Mi"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert run["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


SHARDED = ["--set", "run.shard.enabled=true", "--set", "run.replicas=4"]


def test_sharded_replicas_are_a_statefulset_spread_over_nodes_with_a_disruption_budget(
    helm: Path, rendered: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """docs/sharding.md: every replica works on its share; stable Pod names (each
    replica's name in the ring), spread over Nodes, at most one down for a drain."""
    result = render(helm, *VALUES, *SHARDED)
    assert result.returncode == 0, result.stderr
    sharded = by_kind_and_name(objects(result.stdout))
    assert ("Deployment", "metalmend") not in sharded
    run = sharded[("StatefulSet", "metalmend")]["spec"]
    assert run["replicas"] == 4
    assert run["podManagementPolicy"] == "Parallel"
    (container,) = run["template"]["spec"]["containers"]
    assert "--shard" in container["args"]
    assert "--leader-elect" in container["args"]  # the leader assigns the hosts
    pods = run["selector"]["matchLabels"]
    assert run["template"]["spec"]["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": pods}},
    ]  # fmt: skip
    budget = sharded[("PodDisruptionBudget", "metalmend")]["spec"]
    assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": pods}}
    # Not sharded (the default): the Deployment, one leading, no --shard; a budget too.
    (default,) = rendered[("Deployment", "metalmend")]["spec"]["template"]["spec"]["containers"]
    assert "--shard" not in default["args"]
    assert ("PodDisruptionBudget", "metalmend") in rendered
    one = by_kind_and_name(objects(render(helm, *VALUES, "--set", "run.replicas=1").stdout))
    assert ("PodDisruptionBudget", "metalmend") not in one, "one replica: nothing to keep up"
    # Sharded: only metalmend (and named operators) may move a host (docs/sharding.md).
    assert ("ValidatingAdmissionPolicy", "metalmend-shard-label-writers") in sharded
    assert ("ValidatingAdmissionPolicy", "metalmend-shard-label-writers") not in one


def test_the_bmc_ca_bundle_comes_from_a_configmap(
    helm: Path, rendered: dict[tuple[str, str], dict[str, Any]]
) -> None:
    (plain,) = rendered[("Deployment", "metalmend")]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--bmc-ca-bundle") for a in plain["args"])
    result = render(helm, *VALUES, "--set", "run.bmcCaBundle.configMap=bmc-ca")
    assert result.returncode == 0, result.stderr
    run = by_kind_and_name(objects(result.stdout))[("Deployment", "metalmend")]["spec"]
    pod = run["template"]["spec"]
    (container,) = pod["containers"]
    assert "--bmc-ca-bundle=/etc/metalmend/bmc-ca/ca.crt" in container["args"]
    assert {"name": "bmc-ca", "mountPath": "/etc/metalmend/bmc-ca", "readOnly": True} in (
        container["volumeMounts"]
    )
    assert {"name": "bmc-ca", "configMap": {"name": "bmc-ca"}} in pod["volumes"]
    # serve wipes drives through the same BMCs (destroy): the same CA, by its settings
    serve = by_kind_and_name(objects(result.stdout))[("Deployment", "metalmend-serve")]
    spec = serve["spec"]["template"]["spec"]
    (serving,) = spec["containers"]
    assert {"name": "METALMEND_BMC_CA_BUNDLE", "value": "/etc/metalmend/bmc-ca/ca.crt"} in (
        serving["env"]
    )
    assert {"name": "bmc-ca", "mountPath": "/etc/metalmend/bmc-ca", "readOnly": True} in (
        serving["volumeMounts"]
    )
    assert {"name": "bmc-ca", "configMap": {"name": "bmc-ca"}} in spec["volumes"]


def test_serve_takes_tls_from_a_secret_or_cert_manager(helm: Path) -> None:
    result = render(
        helm, *VALUES, "--set", "serve.tls.certManager.enabled=true",
        "--set", "serve.tls.certManager.issuerRef.name=site-ca",
        "--set", "serve.tls.certManager.issuerRef.kind=ClusterIssuer",
        "--set", "serve.database.urlSecret.name=metalmend-db", "--set", "serve.replicas=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = by_kind_and_name(objects(result.stdout))
    certificate = docs[("Certificate", "metalmend-serve")]["spec"]
    assert certificate["secretName"] == "metalmend-serve-tls"
    assert certificate["issuerRef"] == {"name": "site-ca", "kind": "ClusterIssuer"}
    assert "metalmend-serve.metalmend-system.svc" in certificate["dnsNames"]
    serve = docs[("Deployment", "metalmend-serve")]["spec"]["template"]["spec"]
    (env,) = serve["containers"][0]["env"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "metalmend-db", "key": "url"}
    tls = next(v for v in serve["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == "metalmend-serve-tls"
    # Probes: /healthz, the one path without a token (/openapi.json now asks for one).
    for probe in ("readinessProbe", "livenessProbe"):
        get = serve["containers"][0][probe]["httpGet"]
        assert (get["path"], get["scheme"]) == ("/healthz", "HTTPS")


@pytest.mark.parametrize(
    ("values", "expected"), [((), 4 << 20), (("serve.maxBodyBytes=16777216",), 16 << 20)]
)
def test_serve_takes_its_body_limit_from_the_values(
    helm: Path, values: tuple[str, ...], expected: int
) -> None:
    sets = [part for value in values for part in ("--set", value)]
    result = render(helm, *VALUES, *sets)
    assert result.returncode == 0, result.stderr
    docs = by_kind_and_name(objects(result.stdout))
    serve = docs[("Deployment", "metalmend-serve")]["spec"]["template"]["spec"]
    assert f"--max-body-bytes={expected}" in serve["containers"][0]["args"]


# Against a real API server: its own control plane, since the chart installs cluster-wide
# admission policies that must not reach the other tests' objects.


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path_factory.mktemp("chart-plane")))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def kubectl(plane: ControlPlane, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    binary = find_binaries().kubectl
    assert binary is not None, "kubectl is built by make k8s"
    return subprocess.run(
        [str(binary), "--kubeconfig", str(plane.kubeconfig), *args],
        input=stdin, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_rendered_chart_passes_server_side_dry_run(helm: Path, plane: ControlPlane) -> None:
    """The CRDs (deploy/chart/crds, which helm installs before anything else), then every
    other object as `helm install` would send it (no object is of our CRDs' kinds)."""
    crds_text = "\n---\n".join(p.read_text() for p in sorted((CHART / "crds").glob("*.yaml")))
    crds = kubectl(plane, "apply", "--dry-run=server", "-f", "-", stdin=crds_text)
    assert crds.returncode == 0, crds.stderr
    for namespace in (NAMESPACE, *HOST_NAMESPACES):
        kubectl(plane, "create", "namespace", namespace)
    result = render(helm, *VALUES, *OPTIONAL_POLICIES)
    applied = kubectl(plane, "apply", "--dry-run=server", "-f", "-", stdin=result.stdout)
    assert applied.returncode == 0, applied.stderr
    assert "(server dry run)" in applied.stdout
    sharded = render(helm, *VALUES, *SHARDED)  # the StatefulSet, its spread and budget
    applied = kubectl(plane, "apply", "--dry-run=server", "-f", "-", stdin=sharded.stdout)
    assert applied.returncode == 0, applied.stderr
    assert "statefulset.apps/metalmend created (server dry run)" in applied.stdout


def test_helm_install_creates_every_object(
    helm: Path, plane: ControlPlane, rendered: dict[tuple[str, str], dict[str, Any]]
) -> None:
    for namespace in HOST_NAMESPACES:
        kubectl(plane, "create", "namespace", namespace)
    installed = subprocess.run(
        [str(helm), "install", "metalmend", str(CHART), "--kubeconfig", str(plane.kubeconfig),
         "--namespace", NAMESPACE, "--create-namespace", *VALUES,
         *OPTIONAL_POLICIES],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    kube = Client(KubeConfig.from_file(plane.kubeconfig))
    for (kind, name), obj in rendered.items():
        api_version = obj["apiVersion"]
        namespace = obj["metadata"].get("namespace")
        found = kubectl(plane, "get", f"{kind}.{api_version.split('/')[0]}" if "/" in api_version else kind,
                        name, *(["-n", namespace] if namespace else []), "-o", "name")  # fmt: skip
        assert found.returncode == 0, f"{kind}/{name}: {found.stderr}"
    for namespace in HOST_NAMESPACES:
        assert (
            kubectl(
                plane, "get", "rolebinding", "metalmend-bmc-credentials", "-n", namespace
            ).returncode
            == 0
        )
    for path in sorted((CHART / "crds").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        assert kubectl(plane, "get", "crd", name).returncode == 0, name
    # No kubelet here: the controller's two Pods are created and stay Pending.
    deadline = Deadline(30)
    pods: list[Pod] = []
    while not deadline.expired() and len(pods) < 2:
        try:
            pods = list(
                kube.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": "metalmend"})
            )
        except ApiError:
            pods = []
        time.sleep(0.5)
    assert len(pods) == 2
    assert {p.status.phase for p in pods if p.status} <= {"Pending"}


def test_run_with_the_charts_service_account_takes_the_lease(
    plane: ControlPlane, tmp_path: Path
) -> None:
    """What the chart's Pod would do, as a process: the chart's ServiceAccount and flags
    (every controller, leader election, the host namespaces' Secrets), nothing more."""
    test_helm_install_ran = kubectl(plane, "get", "sa", "metalmend", "-n", NAMESPACE)
    assert test_helm_install_ran.returncode == 0, (
        "runs after test_helm_install_creates_every_object"
    )
    account = plane.service_account_kubeconfig(NAMESPACE, "metalmend")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(account),
         "--controllers", "all", "--leader-elect", "--leader-election-namespace", NAMESPACE,
         "--secret-namespaces", ",".join(HOST_NAMESPACES), "--health-bind", f"127.0.0.1:{port}"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        started(
            answers(f"http://127.0.0.1:{port}/readyz"),
            f"metalmend run (leader-elect) to answer 200 on http://127.0.0.1:{port}/readyz",
            process,
        )
        lease = kubectl(plane, "get", "lease", "metalmend", "-n", NAMESPACE, "-o",
                        "jsonpath={.spec.holderIdentity}")  # fmt: skip
        assert lease.returncode == 0
        assert lease.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "forbidden" not in stderr.lower(), stderr


# The Machine kinds of each deployment (docs/install.md, "Which of the four deployments is
# yours"; deploy/examples/chart-values/): run's ClusterRole grants exactly these.
EXAMPLE_VALUES = REPO / "deploy" / "examples" / "chart-values"
MACHINE_GROUPS = {"cluster.x-k8s.io", "machine.openshift.io", "infrastructure.cluster.x-k8s.io"}
CLUSTER_API = {
    ("cluster.x-k8s.io", "machines"): {"get", "list", "watch", "patch", "delete"},
    ("cluster.x-k8s.io", "machines/status"): {"patch"},
    ("cluster.x-k8s.io", "machinehealthchecks"): {"get", "list", "watch"},
    ("cluster.x-k8s.io", "machinehealthchecks/status"): {"patch"},
    ("cluster.x-k8s.io", "clusters"): {"get", "list", "watch"},
}
METAL3_MACHINES = {("infrastructure.cluster.x-k8s.io", "metal3machines"): {"get", "list", "watch"}}
OPENSHIFT = {
    ("machine.openshift.io", "machines"): {"get", "list", "watch", "patch", "delete"},
    ("machine.openshift.io", "machines/status"): {"patch"},
}
SERVE_READS = {("cluster.x-k8s.io", "machines"): {"list"},
               ("machine.openshift.io", "machines"): {"list"}}  # fmt: skip


def machine_grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule.get("apiGroups", []):
            if group in MACHINE_GROUPS:
                for resource in rule["resources"]:
                    found.setdefault((group, resource), set()).update(rule["verbs"])
    return found


@pytest.mark.parametrize(
    ("deployment", "grants"),
    [
        ("plain", {}),
        ("cluster-api", CLUSTER_API),
        ("capm3", {**CLUSTER_API, **METAL3_MACHINES}),
        ("openshift", OPENSHIFT),
    ],
)
def test_each_deployments_values_grant_exactly_its_machine_kinds(
    helm: Path, deployment: str, grants: dict[tuple[str, str], set[str]]
) -> None:
    values = EXAMPLE_VALUES / f"{deployment}.yaml"
    result = render(helm, "-f", str(values), *VALUES)
    assert result.returncode == 0, result.stderr
    docs = by_kind_and_name(objects(result.stdout))
    assert machine_grants(docs[("ClusterRole", "metalmend")]) == grants
    # serve's teardown claim reads every Machine kind, whatever the deployment: it must
    # see each remediation request (docs/security.md)
    assert machine_grants(docs[("ClusterRole", "metalmend-serve")]) == SERVE_READS
    run = docs[("Deployment", "metalmend")]["spec"]["template"]["spec"]["containers"][0]
    wanted = yaml.safe_load(values.read_text())["run"]["controllers"]
    assert f"--controllers={','.join(wanted)}" in run["args"]


def test_the_default_values_grant_every_machine_kind(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    every = {**CLUSTER_API, **METAL3_MACHINES, **OPENSHIFT}
    assert machine_grants(rendered[("ClusterRole", "metalmend")]) == every


def test_an_unknown_machine_kind_is_refused(helm: Path) -> None:
    result = render(helm, *VALUES, "--set", "run.machines={capi}")
    assert result.returncode == 1
    assert 'run.machines: "capi" is not clusterAPI, metal3Machines or openshift' in result.stderr
