"""What a BMC Secret's binding trusts, against recording HTTPS listeners, with `metalmend
run --controllers host-power` as a process (the lab's settings: its own BMC CA bundle,
no allowed BMC networks, nothing else allowed). Each host below names a listener of a
host creator's choosing; the listener must receive nothing.

- a listener whose certificate the system CAs trust (a CA the process's OpenSSL trusts
  through SSL_CERT_FILE): the system CAs are not trusted unless the operator allows it;
- a listener with a certificate nobody trusts and ``disableCertificateVerification``:
  refused unless the operator allows it, and never for a Secret bound with ``*``;
- a Secret bound with ``*``: only inside the allowed BMC networks (none here).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Secret

from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL
from metalmend_lab import lab
from metalmend_lab.pki import CertificateAuthority
from tests.e2e.conftest import Metalmend
from tests.support import until

TENANT = "t11"
PASSWORD = "the-namespaces-bmc-password"


class Listener:
    """An HTTPS server on 127.0.0.1 that records every request it is sent."""

    def __init__(self, ca: CertificateAuthority, stem: str) -> None:
        pair = ca.issue(stem, "127.0.0.1", ip_addresses=("127.0.0.1",), server=True)
        self.requests: list[dict[str, str]] = []
        requests = self.requests

        class Record(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append({"path": self.path, **dict(self.headers)})
                self.send_response(401)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Record)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pair.cert, pair.key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"redfish+https://127.0.0.1:{self.server.server_address[1]}/redfish/v1/Systems/1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners(tmp_path: Path) -> Iterator[dict[str, Listener]]:
    public = CertificateAuthority(tmp_path / "public-ca")  # "trusted by the system"
    nobody = CertificateAuthority(tmp_path / "nobodys-ca")  # as good as self-signed
    made = {"system-trusted": Listener(public, "listener"), "untrusted": Listener(nobody, "l")}
    yield made
    for listener in made.values():
        listener.close()


@pytest.fixture
def controller(
    hosts_lab: lab.RunningLab, listeners: dict[str, Listener], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Metalmend]:  # fmt: skip
    # The system CAs of the controller's process: OpenSSL's default store, read from here.
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "public-ca" / "ca.crt"))
    power = Metalmend(hosts_lab, "host-power", 3.0)
    power.start()
    yield power
    power.stop()


@pytest.fixture
async def kube(hosts_lab: lab.RunningLab) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    await client.create(Namespace(metadata=ObjectMeta(name=TENANT)))
    yield client
    await client.delete(Namespace, TENANT)
    await client.close()


async def host_with(
    kube: AsyncClient, name: str, address: str, binding: str, *, unchecked: bool = False
) -> None:
    await kube.create(
        Secret(
            metadata=ObjectMeta(
                name=name, labels={SECRET_LABEL: "true"}, annotations={HOSTS_ANNOTATION: binding}
            ),
            stringData={"username": "admin", "password": PASSWORD},
        ),
        namespace=TENANT,
    )
    bmc: dict[str, Any] = {"address": address, "credentialsName": name}
    if unchecked:
        bmc["disableCertificateVerification"] = True
    await kube.create(
        BareMetalHost(metadata=ObjectMeta(name=name), spec={"online": True, "bmc": bmc}),
        namespace=TENANT,
    )


async def test_no_binding_lets_a_host_creator_choose_where_the_password_goes(
    hosts_lab: lab.RunningLab,
    listeners: dict[str, Listener],
    controller: Metalmend,
    kube: AsyncClient,
) -> None:
    trusted, untrusted = listeners["system-trusted"].address, listeners["untrusted"].address
    expected = {
        # (was: delivered; the system CAs were always trusted)
        "by-name-system-ca": "certificate is not trusted",
        # (was: delivered; disableCertificateVerification was always honoured)
        "by-name-unchecked": "--bmc-allow-disable-certificate-verification",
        "star-unchecked": "never honoured for a Secret bound to every host",
        # (was: delivered, as every host of the namespace may use a '*' Secret)
        "star-system-ca": "none are set (--bmc-allowed-network)",
    }
    await host_with(kube, "by-name-system-ca", trusted, "by-name-system-ca")
    await host_with(kube, "by-name-unchecked", untrusted, "by-name-unchecked", unchecked=True)
    await host_with(kube, "star-unchecked", untrusted, "*", unchecked=True)
    await host_with(kube, "star-system-ca", trusted, "*")

    async def messages() -> dict[str, str]:
        found = {}
        for name in expected:
            host = await kube.get(BareMetalHost, name, namespace=TENANT)
            found[name] = str((host.get("status") or {}).get("errorMessage") or "")
        return found

    async def all_refused() -> bool:
        found = await messages()
        print(found)
        return all(expected[name] in found[name] for name in expected)

    await until(all_refused, within=60)
    for name, listener in listeners.items():
        assert listener.requests == [], f"the {name} listener received {listener.requests}"
    assert PASSWORD not in str(await messages())
