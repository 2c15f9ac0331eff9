"""How metalmend reaches one etcd cluster: with no credentials, or with those of the
Secret the design names (``credentials: {secret: {namespace, name}}``).

Which Secret may be used is not the design's to decide (a design is input: docs/security.md,
"Design references and etcd credentials"). A Secret is used for cluster C only when it
carries the label ``metalmend.dev/etcd-credentials: "true"`` (ours, not the BMC one) and is
either listed in ``serve.etcd_credentials_secrets`` or bound to C by its annotation
``metalmend.dev/etcd-clusters`` (cluster names, comma-separated): both are set by whoever
may edit the Secret, who can read the password anyway. ``usable`` is that rule. And a
cluster with credentials is reached over https only: a design listing an ``http://``
client URL for it is refused before the Secret is even read.

The Secret's keys, all optional: ``username`` and ``password`` (etcd's own auth: a token
from ``/v3/auth/authenticate``, sent as ``Authorization``), ``ca.crt`` (the CA that signed
the members' serving certificates, for https client URLs), ``tls.crt`` and ``tls.key``
(a client certificate, for members started with ``--client-cert-auth``). Secret values
never reach a log or an answer: messages name the Secret and the key, never a value.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Secret

from metalmend.kube import errors
from metalmend.log import fields
from metalmend.teardown.etcd.client import DEADLINE, EtcdClient, EtcdError
from metalmend.teardown.etcd.design import ClusterDesign, SecretRef

# Reads the credentials Secret of the named cluster, values decoded, once ``usable``
# allows it; raises CredentialsRefused when it cannot or may not.
SecretReader = Callable[[SecretRef, str], Awaitable[Mapping[str, bytes]]]

SECRET_LABEL = "metalmend.dev/etcd-credentials"
SECRET_LABEL_VALUE = "true"
CLUSTERS_ANNOTATION = "metalmend.dev/etcd-clusters"

log = logging.getLogger(__name__)


class CredentialsRefused(Exception):
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
                raise CredentialsRefused(
                    f"Secret {ref.namespace}/{ref.name}: {key} is not UTF-8 text"
                ) from None

        found = cls(
            text("username"), text("password"),
            data.get("ca.crt", b""), data.get("tls.crt", b""), data.get("tls.key", b""),
        )  # fmt: skip
        if bool(found.username) != bool(found.password):
            raise CredentialsRefused(
                f"Secret {ref.namespace}/{ref.name} must hold both username and password, or"
                " neither"
            )
        if bool(found.cert) != bool(found.key):
            raise CredentialsRefused(
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
            raise CredentialsRefused(
                f"{where}: ca.crt, tls.crt or tls.key is not usable PEM ({type(error).__name__})"
            ) from None
        return context


def bound_clusters(annotations: Mapping[str, str] | None) -> frozenset[str]:
    """The cluster names a Secret's ``metalmend.dev/etcd-clusters`` annotation lists."""
    value = (annotations or {}).get(CLUSTERS_ANNOTATION, "")
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def usable(
    ref: SecretRef,
    cluster: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    named: Iterable[str],
) -> str | None:
    """Why the Secret ``ref`` may not serve as the credentials of etcd cluster
    ``cluster`` (None: it may). ``named``: ``serve.etcd_credentials_secrets``
    (``namespace/name``)."""
    if (labels or {}).get(SECRET_LABEL) != SECRET_LABEL_VALUE:
        return f"not labelled {SECRET_LABEL}={SECRET_LABEL_VALUE}"
    if f"{ref.namespace}/{ref.name}" in set(named) or cluster in bound_clusters(annotations):
        return None
    return (
        f"not bound to etcd cluster {cluster!r} (annotation {CLUSTERS_ANNOTATION}) nor named"
        " in serve.etcd_credentials_secrets"
    )


def cleartext(cluster: ClusterDesign) -> list[str]:
    """The design's client URLs of ``cluster`` that are not https."""
    return [url for url in cluster.endpoints if not url.lower().startswith("https://")]


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
    if plain := cleartext(cluster):
        raise CredentialsRefused(
            f"{where}: not used: the design lists client URL(s) that are not https"
            f" ({', '.join(u[:100] for u in plain[:3])}), and credentials are sent over https"
            " only; nothing was sent"
        )
    if secrets is None:
        raise CredentialsRefused(f"{where}: this caller cannot read Secrets")
    credentials = Credentials.from_secret(ref, await secrets(ref, cluster.name))
    context = credentials.tls(where)
    http = httpx.AsyncClient(
        timeout=DEADLINE, verify=context if context is not None else True, follow_redirects=False
    )
    client = EtcdClient(http, owned=True)
    client.secure_only = True
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
        raise CredentialsRefused(f"{where}: no member accepted them: {'; '.join(problems[:3])}")
    return client


def secret_reader(client: AsyncClient, named: Sequence[str] = ()) -> SecretReader:
    """Reads a cluster's credentials Secret as metalmend serve's own identity, and uses it
    only when ``usable`` says so: labelled metalmend.dev/etcd-credentials, and
    bound to the cluster or ``named`` (``serve.etcd_credentials_secrets``). Whether the
    Secret is missing, unreadable, unlabelled or unbound, the caller reads one message (it
    does not learn which Secrets exist); the log says which, never a value."""

    async def read(ref: SecretRef, cluster: str) -> Mapping[str, bytes]:
        secret_name = f"{ref.namespace}/{ref.name}"
        where = f"credentials Secret {secret_name}"
        refused = CredentialsRefused(
            f"{where}: not found, not readable by metalmend serve, not labelled"
            f" {SECRET_LABEL}={SECRET_LABEL_VALUE}, or not bound to etcd cluster"
            f" {cluster!r} ({CLUSTERS_ANNOTATION}); nothing was sent (docs/teardown.md)"
        )
        try:
            secret = await client.get(Secret, ref.name, namespace=ref.namespace)
        except ApiError as error:
            why = f"the API server answered {errors.code(error)} {error.status.message}"
            log.warning("etcd credentials refused", extra=fields(secret=secret_name, why=why))
            raise refused from None
        except (httpx2.HTTPError, OSError) as error:
            raise CredentialsRefused(f"{where}: cannot reach the API server: {error}") from None
        meta = secret.metadata
        why_not = usable(
            ref, cluster, meta.labels if meta else None, meta.annotations if meta else None, named
        )
        if why_not is not None:
            log.warning("etcd credentials refused", extra=fields(secret=secret_name, why=why_not))
            raise refused
        try:
            return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        except (binascii.Error, ValueError):
            raise CredentialsRefused(f"{where}: its data is not base64") from None

    return read
