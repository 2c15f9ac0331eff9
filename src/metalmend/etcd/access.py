"""How metalmend reaches one etcd cluster: with no credentials, or with those of the
Secret the design names (``credentials: {secret: {namespace, name}}``).

The Secret's keys, all optional: ``username`` and ``password`` (etcd's own auth: a token
from ``/v3/auth/authenticate``, sent as ``Authorization``), ``ca.crt`` (the CA that signed
the members' serving certificates, for https client URLs), ``tls.crt`` and ``tls.key``
(a client certificate, for members started with ``--client-cert-auth``). Secret values
never reach a log or an answer: messages name the Secret and the key, never a value.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from metalmend.etcd.client import DEADLINE, EtcdClient, EtcdError
from metalmend.etcd.design import ClusterDesign, SecretRef

# Reads a Secret's data, values decoded; raises CredentialsError when it cannot.
SecretReader = Callable[[SecretRef], Awaitable[Mapping[str, bytes]]]


class CredentialsError(Exception):
    """The cluster's credentials cannot be had or used; the message says which and why."""


@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = field(default="", repr=False)
    ca: bytes = field(default=b"", repr=False)
    cert: bytes = field(default=b"", repr=False)
    key: bytes = field(default=b"", repr=False)

    @classmethod
    def from_secret(cls, ref: SecretRef, data: Mapping[str, bytes]) -> Credentials:
        def text(key: str) -> str:
            try:
                return data.get(key, b"").decode("utf-8").strip()
            except UnicodeDecodeError:
                raise CredentialsError(
                    f"Secret {ref.namespace}/{ref.name}: {key} is not UTF-8 text"
                ) from None

        found = cls(
            text("username"), text("password"),
            data.get("ca.crt", b""), data.get("tls.crt", b""), data.get("tls.key", b""),
        )  # fmt: skip
        if bool(found.username) != bool(found.password):
            raise CredentialsError(
                f"Secret {ref.namespace}/{ref.name} must hold both username and password, or"
                " neither"
            )
        if bool(found.cert) != bool(found.key):
            raise CredentialsError(
                f"Secret {ref.namespace}/{ref.name} must hold both tls.crt and tls.key, or neither"
            )
        return found

    def tls(self, where: str) -> ssl.SSLContext | None:
        if not (self.ca or self.cert):
            return None
        context = ssl.create_default_context()
        try:
            if self.ca:
                context.load_verify_locations(cadata=self.ca.decode("ascii", "replace"))
            if self.cert:
                _load_client_certificate(context, self.cert, self.key)
        except (ssl.SSLError, ValueError, OSError) as error:
            raise CredentialsError(
                f"{where}: ca.crt, tls.crt or tls.key is not usable PEM ({type(error).__name__})"
            ) from None
        return context


def _load_client_certificate(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate chain from files only: a private directory for the moment
    it takes, removed at once."""
    with tempfile.TemporaryDirectory(prefix="metalmend-etcd-") as directory:
        os.chmod(directory, 0o700)
        cert_path, key_path = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        for path, data in ((cert_path, cert), (key_path, key)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as out:
                out.write(data)
        context.load_cert_chain(cert_path, key_path)


async def connect(cluster: ClusterDesign, secrets: SecretReader | None) -> EtcdClient:
    """A client for ``cluster``, authenticated as its design says. Close it after use."""
    ref = cluster.credentials
    if ref is None:
        return EtcdClient()
    where = f"etcd cluster {cluster.name}: credentials Secret {ref.namespace}/{ref.name}"
    if secrets is None:
        raise CredentialsError(f"{where}: this caller cannot read Secrets")
    credentials = Credentials.from_secret(ref, await secrets(ref))
    context = credentials.tls(where)
    http = httpx.AsyncClient(timeout=DEADLINE, verify=context if context is not None else True)
    client = EtcdClient(http, owned=True)
    if credentials.username:
        problems = []
        for endpoint in cluster.endpoints:
            try:
                token = await client.authenticate(
                    endpoint, credentials.username, credentials.password
                )
            except EtcdError as error:
                problems.append(error.message)
                continue
            client.headers["Authorization"] = token
            return client
        await client.aclose()
        raise CredentialsError(f"{where}: no member accepted them: {'; '.join(problems[:3])}")
    return client
