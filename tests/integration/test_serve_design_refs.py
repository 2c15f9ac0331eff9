"""Design references and etcd credentials (docs/security.md, "Design references and etcd
credentials") on the real API server: ``metalmend serve`` runs with the ServiceAccount and
ClusterRoles of deploy/rbac/serve.yaml, callers are real ServiceAccount tokens bound to the
narrowest shipped role that reaches each path.

A recording listener (a loopback server that records every connection it is offered,
http or TLS alike) stands for a caller's server: named as the design reference, or as the
etcd client URLs of a design, it must receive nothing that is refused. A real etcd with
TLS and its own auth shows the credentials still reach the cluster they are bound to."""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import AsyncClient, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node

from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.serve.app import create_app
from metalmend.serve.root import compose
from metalmend.teardown.etcd.routes import EtcdAccess
from metalmend_lab.assets import find_binaries
from metalmend_lab.controlplane import LOOPBACK, Component, ControlPlane, free_port
from metalmend_lab.pki import CertificateAuthority
from tests.integration import test_serve_promenade as promenade_tests
from tests.integration.test_serve_promenade import bearer, status_of, token
from tests.integration.test_shipyard_api import also
from tests.support import Deadline

serve_kubeconfig = promenade_tests.serve_kubeconfig  # a fixture, by the name asked for

PROMENADE = "/promenade/api/v1.0"
PASSWORD = "s3cret-bmc-password"


# ---- a listener that records whatever reaches it ------------------------------------------


@dataclass
class Listener:
    url: str
    connections: list[Any] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def heard(self) -> str:
        return f"{len(self.connections)} connection(s), requests {self.requests}"


@contextlib.contextmanager
def listening(
    answer: str = "", tls: ssl.SSLContext | None = None, redirect: str = ""
) -> Iterator[Listener]:
    """A server on 127.0.0.1 that records every connection and request; it answers GET
    with ``answer`` (or a 302 to ``redirect``) and anything else with 200 {}."""
    scheme = "https" if tls else "http"
    found = Listener("")

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            found.requests.append(f"{self.command} {self.path} {dict(self.headers)} {body}")

        def do_GET(self) -> None:
            self._record()
            if redirect:
                self.send_response(302)
                self.send_header("Location", redirect)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = answer.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            self._record()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            found.connections.append(client_address)
            return True

    server = Server((LOOPBACK, 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    found.url = f"{scheme}://{LOOPBACK}:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        server.shutdown()
        server.server_close()


def etcd_design(client_urls: list[str], secret: tuple[str, str] | None, node: str = "n1") -> str:
    cluster: dict[str, Any] = {
        "name": "kubernetes", "minimum_functionality": {"healthy_members": 1},
        "members": [{"node": node, "client_urls": client_urls}],
    }  # fmt: skip
    if secret is not None:
        cluster["credentials"] = {"secret": {"namespace": secret[0], "name": secret[1]}}
    return yaml.safe_dump({
        "schema": "promenade/EtcdClusters/v1",
        "metadata": {"schema": "metadata/Document/v1", "name": "etcd-clusters"},
        "data": {"clusters": [cluster]},
    })  # fmt: skip


# ---- the service, its store, its callers -------------------------------------------------


@dataclass
class Serve:
    http: httpx.AsyncClient
    store: DesignStore

    def put(self, text: str, bucket: str = "etcd") -> str:
        """The design reference of a new revision holding ``text``."""
        revision = self.store.put(bucket, parse(text)).revision
        return f"deckhand+https://deckhand/api/v1.0/revisions/{revision}/rendered-documents"


@pytest.fixture
async def serve(serve_kubeconfig: Path, database_url: str) -> AsyncIterator[Serve]:
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    database = Database.open(database_url)
    database.upgrade()
    app = create_app(compose(client, database=database))  # the default settings: nothing allowed
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as h:
        yield Serve(h, DesignStore(database))
    await client.close()
    database.dispose()


@pytest.fixture
def viewer(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """Only the promenade viewer role: ``get etcdclusters/health``."""
    return token(control_plane, kube, namespace, "viewer", "metalmend-promenade-viewer")


@pytest.fixture
def design_viewer(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """The promenade viewer who may also read the design revisions (deckhand viewer)."""
    value = token(control_plane, kube, namespace, "dviewer", "metalmend-promenade-viewer")
    also(kube, namespace, "dviewer", "metalmend-deckhand-viewer")
    return value


@pytest.fixture
def etcd_role(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """remove-etcd's role: ``create nodes/remove-etcd``, ``get etcdclusters/health``."""
    return token(control_plane, kube, namespace, "etcd", "metalmend-promenade-etcd")


@pytest.fixture
def decommissioner(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """The only shipped role with ``create nodes/decommission`` (the teardown admin)."""
    return token(control_plane, kube, namespace, "admin", "metalmend-promenade-admin")


@pytest.fixture
def node(kube: Client, namespace: str) -> Iterator[str]:
    name = f"{namespace}-n1"
    kube.create(Node(metadata=ObjectMeta(name=name)))
    yield name
    with contextlib.suppress(Exception):
        kube.delete(Node, name)


def bmc_secret(kube: Client, namespace: str) -> tuple[str, str]:
    """A BMC Secret exactly as metalmend's BMC model wants it (labelled, bound to every
    host), and serve's BMC role bound in its namespace, as docs/security.md says to do
    for each namespace with hosts: serve CAN read it."""
    kube.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "worker-0-bmc", "namespace": namespace,
                     "labels": {"metalmend.dev/bmc-credentials": "true"},
                     "annotations": {"metalmend.dev/bmc-hosts": "*"}},
        "stringData": {"username": "admin", "password": PASSWORD},
    }))  # fmt: skip
    kube.create(codecs.from_dict({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "metalmend-serve-bmc-credentials", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "metalmend-serve-bmc-credentials"},
        "subjects": [{"kind": "ServiceAccount", "name": "metalmend-serve",
                      "namespace": "metalmend-system"}],
    }))  # fmt: skip
    return namespace, "worker-0-bmc"


def etcd_secret(
    kube: Client, namespace: str, name: str, data: dict[str, str], clusters: str = "kubernetes"
) -> tuple[str, str]:
    """An etcd credentials Secret, labelled and bound to ``clusters``, and the Role the
    chart renders for it (get, resourceNames: that Secret)."""
    kube.create(codecs.from_dict({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"metalmend.dev/etcd-credentials": "true"},
                     "annotations": {"metalmend.dev/etcd-clusters": clusters}},
        "stringData": data,
    }))  # fmt: skip
    for document in [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"etcd-{name}", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                    "resourceNames": [name]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"etcd-{name}", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": f"etcd-{name}"},
         "subjects": [{"kind": "ServiceAccount", "name": "metalmend-serve",
                       "namespace": "metalmend-system"}]},
    ]:  # fmt: skip
        kube.create(codecs.from_dict(document))
    return namespace, name


def body(href: str) -> dict[str, str]:
    return {"rel": "design", "href": href, "type": "application/x-yaml"}


async def ask(serve: Serve, path: str, caller: str, href: str, node: str) -> httpx.Response:
    if path == "health":
        return await serve.http.get(
            f"{PROMENADE}/etcd-cluster-health-statuses", params={"design_ref": href},
            headers=bearer(caller),
        )  # fmt: skip
    return await serve.http.post(
        f"{PROMENADE}/nodes/{node}/{path}", json=body(href), headers=bearer(caller)
    )


PATHS = ["health", "remove-etcd", "decommission"]


@pytest.fixture
def callers(viewer: str, etcd_role: str, decommissioner: str) -> dict[str, str]:
    return {"health": viewer, "remove-etcd": etcd_role, "decommission": decommissioner}


# ---- a design reference the caller chose is not fetched ------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("form", ["http", "https", "userinfo"])
async def test_a_design_reference_to_a_callers_listener_is_refused_and_nothing_reaches_it(
    serve: Serve, callers: dict[str, str], node: str, kube: Client, namespace: str,
    path: str, form: str, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    secret = bmc_secret(kube, namespace)
    with listening() as listener:
        port = listener.url.rsplit(":", 1)[1]
        design = etcd_design([listener.url], secret, node)
        with listening(design) as design_server:
            href = {
                "http": f"{design_server.url}/design",
                "https": f"https://{LOOPBACK}:{design_server.url.rsplit(':', 1)[1]}/design",
                "userinfo": f"https://admin:{PASSWORD}@{LOOPBACK}:{port}/design?token={PASSWORD}",
            }[form]
            answer = await ask(serve, path, callers[path], href, node)
            heard = design_server.heard()
            assert not design_server.connections, heard
        assert not listener.connections, listener.heard()
    document = status_of(answer, 400, "BadRequest")
    message = document["message"]
    if form == "http":
        assert "only deckhand+https://" in message, message
    elif form == "https":
        assert "is not allowed" in message
        assert "serve.design_url_prefixes (none)" in message
        assert "nothing was fetched" in message
    else:
        assert "a user name or password in the URL is refused" in message, message
    assert PASSWORD not in answer.text
    served = [r.getMessage() for r in caplog.records if r.name.startswith(("metalmend", "uvicorn"))]
    assert not [line for line in served if PASSWORD in line]


@pytest.mark.parametrize("path", PATHS)
async def test_a_revision_the_caller_may_not_read_is_403_naming_the_permission(
    serve: Serve, callers: dict[str, str], node: str, path: str
) -> None:
    with listening() as listener:
        href = serve.put(etcd_design([listener.url], None, node))
        answer = await ask(serve, path, callers[path], href, node)
        assert not listener.connections, listener.heard()
    document = status_of(answer, 403, "Forbidden")
    assert "revisions" in document["message"], document


# ---- a design naming a Secret not meant for etcd -------------------------------------------


@pytest.fixture
def design_callers(
    control_plane: ControlPlane, kube: Client, namespace: str, design_viewer: str
) -> dict[str, str]:
    """Each path's narrowest role that reaches the Secret from a store revision: the
    path's Promenade role and the Deckhand viewer (``get revisions``)."""
    found = {"health": design_viewer}
    for path, account, role in (
        ("remove-etcd", "detcd", "metalmend-promenade-etcd"),
        ("decommission", "dadmin", "metalmend-promenade-admin"),
    ):
        found[path] = token(control_plane, kube, namespace, account, role)
        also(kube, namespace, account, "metalmend-deckhand-viewer")
    return found


def refused_detail(answer: httpx.Response, path: str) -> str:
    """What the path answered of the refused credentials: health's cluster entry (200, the
    cluster "Unable to access Etcd"); remove-etcd's and decommission's failure (not 200),
    whose lines say why."""
    if path == "health":
        [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
        assert (entry["message"], entry["error"]) == ("Unable to access Etcd", True), entry
        detail: str = entry["detail"]
        return detail
    assert answer.status_code >= 400, (path, answer.status_code, answer.text)
    return answer.text


@pytest.mark.parametrize("path", PATHS)
async def test_a_design_naming_a_bmc_secret_gets_nothing_and_sends_nothing(
    serve: Serve, design_callers: dict[str, str], node: str, kube: Client, namespace: str,
    tmp_path: Path, path: str,
) -> None:  # fmt: skip
    secret = bmc_secret(kube, namespace)
    ca = CertificateAuthority(tmp_path / "ca")
    pair = ca.issue("listener", "listener", ip_addresses=(LOOPBACK,), server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pair.cert, pair.key)
    with listening(tls=tls) as listener:
        href = serve.put(etcd_design([listener.url], secret, node))
        answer = await ask(serve, path, design_callers[path], href, node)
        assert not listener.connections, listener.heard()
    detail = refused_detail(answer, path)
    assert f"credentials Secret {namespace}/worker-0-bmc: not found, not readable" in detail
    assert "metalmend.dev/etcd-credentials=true" in detail
    assert PASSWORD not in answer.text


async def test_a_missing_secret_reads_as_a_refused_one(
    serve: Serve, design_viewer: str, namespace: str
) -> None:
    """The caller cannot tell a missing Secret from an existing one it may not use."""
    href = serve.put(etcd_design(["https://127.0.0.1:9"], (namespace, "nothing-here")))
    answer = await ask(serve, "health", design_viewer, href, "")
    [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
    said = entry["detail"]
    assert f"credentials Secret {namespace}/nothing-here: not found, not readable" in said


@pytest.mark.parametrize("path", PATHS)
async def test_a_secret_bound_to_another_cluster_is_not_used(
    serve: Serve, design_callers: dict[str, str], node: str, kube: Client, namespace: str,
    path: str,
) -> None:  # fmt: skip
    secret = etcd_secret(kube, namespace, "etcd-other", {"username": "root", "password": "pw"},
                         clusters="other")  # fmt: skip
    with listening() as listener:
        https = f"https://{LOOPBACK}:{listener.url.rsplit(':', 1)[1]}"
        href = serve.put(etcd_design([https], secret, node))
        answer = await ask(serve, path, design_callers[path], href, node)
        assert not listener.connections, listener.heard()
    assert "or not bound to etcd cluster 'kubernetes'" in refused_detail(answer, path)


@pytest.mark.parametrize("path", PATHS)
async def test_credentials_are_never_sent_to_an_http_client_url(
    serve: Serve, design_callers: dict[str, str], node: str, kube: Client, namespace: str,
    path: str,
) -> None:  # fmt: skip
    secret = etcd_secret(kube, namespace, "etcd-root", {"username": "root", "password": PASSWORD})
    with listening() as listener:
        href = serve.put(etcd_design([listener.url], secret, node))
        answer = await ask(serve, path, design_callers[path], href, node)
        assert not listener.connections, listener.heard()
    detail = refused_detail(answer, path)
    assert "client URL(s) that are not https" in detail, detail
    assert "nothing was sent" in detail
    assert PASSWORD not in answer.text


# ---- an allowed URL that redirects -----------------------------------------------------------


async def test_an_allowed_design_url_that_redirects_is_not_followed(
    serve_kubeconfig: Path, design_viewer: str, namespace: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    pair = ca.issue("designs", "designs", ip_addresses=(LOOPBACK,), server=True)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pair.cert, pair.key)
    with listening("internal: answer\n") as target:
        with listening(tls=tls, redirect=f"{target.url}/internal") as allowed:
            # allowed, and its CA trusted (serve.design_ca_bundle)
            access = EtcdAccess.from_settings([f"{allowed.url}/designs/"], [], ca.pair.cert)
            client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
            app = create_app(compose(client, etcd_access=access))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as h:
                answer = await h.get(
                    f"{PROMENADE}/etcd-cluster-health-statuses",
                    params={"design_ref": f"{allowed.url}/designs/site.yaml"},
                    headers=bearer(design_viewer),
                )
            await client.close()
            assert len(allowed.requests) == 1, allowed.heard()  # allowed: fetched, once
        assert not target.connections, target.heard()
    document = status_of(answer, 500, "EtcdNotAccessible")
    assert "answered HTTP 302 (a redirect, not followed)" in document["message"]
    assert "internal" not in answer.text


# ---- the credentials of a bound Secret do reach their cluster, over https --------------------


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One upstream etcd member serving https (the lab CA's certificate), auth enabled
    with user root: its client URL and the CA file."""
    workdir = tmp_path_factory.mktemp("tls-etcd")
    ca = CertificateAuthority(workdir / "pki")
    pair = ca.issue("etcd", "etcd", ip_addresses=(LOOPBACK,), server=True)
    client_url = f"https://{LOOPBACK}:{free_port()}"
    peer_url = f"http://{LOOPBACK}:{free_port()}"
    argv = [
        str(find_binaries().etcd), "--name=tls", f"--data-dir={workdir / 'data'}",
        f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=tls={peer_url}", f"--cert-file={pair.cert}",
        f"--key-file={pair.key}", "--unsafe-no-fsync", "--log-level=warn",
    ]  # fmt: skip
    process = Component("etcd-tls", argv, workdir / "etcd.log")
    process.start()
    trusted = ssl.create_default_context(cafile=str(ca.pair.cert))
    try:
        deadline = Deadline(60)
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{client_url}/health", verify=trusted, timeout=1).status_code == 200:
                    break
            assert not deadline.expired(), f"etcd did not start (log: {workdir})"
            time.sleep(0.1)
        for path, payload in [
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/add", {"name": "root", "password": PASSWORD}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/enable", {}),
        ]:
            answer = httpx.post(f"{client_url}{path}", json=payload, verify=trusted, timeout=5)
            assert answer.status_code == 200, answer.text
        yield client_url, ca.pair.cert
    finally:
        process.stop()


async def test_a_labelled_bound_secret_reaches_its_https_cluster(
    serve: Serve, design_viewer: str, kube: Client, namespace: str, tls_etcd: tuple[str, Path]
) -> None:
    url, ca = tls_etcd
    root = {"username": "root", "password": PASSWORD, "ca.crt": ca.read_text()}
    secret = etcd_secret(kube, namespace, "etcd-root", root)
    wrong = etcd_secret(kube, namespace, "etcd-wrong", {**root, "password": "not-it"})
    good = await ask(serve, "health", design_viewer, serve.put(etcd_design([url], secret)), "")
    [entry] = status_of(good, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Healthy", False), entry
    bad = await ask(serve, "health", design_viewer, serve.put(etcd_design([url], wrong)), "")
    [entry] = status_of(bad, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Unable to access Etcd", True)
    assert "no member accepted them" in entry["detail"]
    assert "not-it" not in bad.text
    assert PASSWORD not in bad.text + good.text


async def test_a_secret_named_in_the_settings_needs_no_binding_but_its_label(
    serve_kubeconfig: Path, database_url: str, design_viewer: str, kube: Client,
    namespace: str, tls_etcd: tuple[str, Path],
) -> None:  # fmt: skip
    url, ca = tls_etcd
    secret = etcd_secret(kube, namespace, "etcd-any",
                         {"username": "root", "password": PASSWORD, "ca.crt": ca.read_text()},
                         clusters="")  # fmt: skip
    client = AsyncClient(KubeConfig.from_file(serve_kubeconfig))
    database = Database.open(database_url)
    database.upgrade()
    access = EtcdAccess.from_settings([], [f"{namespace}/etcd-any"])
    app = create_app(compose(client, database=database, etcd_access=access))
    store = DesignStore(database)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://serve", timeout=60
    ) as h:
        answer = await ask(Serve(h, store), "health", design_viewer,
                           Serve(h, store).put(etcd_design([url], secret)), "")  # fmt: skip
    await client.close()
    database.dispose()
    [entry] = status_of(answer, 200, "Success")["details"]["messageList"]
    assert (entry["message"], entry["error"]) == ("Healthy", False), entry
