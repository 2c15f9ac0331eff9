"""BMC credentials: which Secrets metalmend reads, which hosts may use each, and decoding.

The security model (docs/security.md, "Security model: BMC credentials"):

- metalmend reads only Secrets labelled ``metalmend.dev/bmc-credentials: "true"``, from a
  cache (an informer restricted to that label and to the hosts' namespaces), never with a
  GET per reconcile. Our own label, not baremetal-operator's ``environment.metal3.io``:
  baremetal-operator's Secret manager has long added that label by itself to any Secret
  a host names, so it says nothing about whether the Secret's owner meant it for BMCs.
  Ours is only ever set by someone who may edit the Secret, and so who may read the
  password anyway.
- A Secret is used only by the hosts its annotation ``metalmend.dev/bmc-hosts`` names
  (comma-separated host names of the Secret's namespace, or ``*`` for every host there).
  The binding lives on the Secret, so only those who can already read the password can
  widen it; anything a tenant controls on the host (labels, spec) could not be trusted.
- A host names a Secret of its own namespace only.
- A Secret bound with ``*`` trusts whoever may create a host in its namespace to name
  the BMC: it is sent only inside the allowed BMC networks, to a certificate of the
  operator's CA bundle, never without a certificate check (bmc/address.py).

None of the messages here carries a password, and none echoes a Secret's data.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from metalmend.bmc.errors import CredentialsError
from metalmend.bmc.pool import Credentials

SECRET_LABEL = "metalmend.dev/bmc-credentials"
SECRET_LABEL_VALUE = "true"
HOSTS_ANNOTATION = "metalmend.dev/bmc-hosts"
EVERY_HOST = "*"
SECURITY_DOC = "docs/security.md"


def from_secret_data(data: Mapping[str, str] | None, where: str) -> Credentials:
    """Decode a Secret's base64 ``data``; surrounding whitespace is trimmed."""
    values: dict[str, str] = {}
    for key in ("username", "password"):
        raw = (data or {}).get(key)
        if raw is None:
            raise CredentialsError(f"Secret {where} has no {key!r} key")
        try:
            values[key] = base64.b64decode(raw, validate=True).decode().strip()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsError(f"Secret {where}: {key!r} is not valid base64 text") from None
        if not values[key]:
            raise CredentialsError(f"Secret {where}: {key!r} is empty")
    return Credentials(values["username"], values["password"])


def bound_hosts(annotations: Mapping[str, str] | None) -> frozenset[str]:
    """The host names a Secret's binding annotation lists (``*`` stays ``*``)."""
    value = (annotations or {}).get(HOSTS_ANNOTATION, "")
    return frozenset(name.strip() for name in value.split(",") if name.strip())


def binding_value(hosts: Iterable[str]) -> str:
    """The annotation value binding ``hosts`` (sorted, so re-running bind changes nothing)."""
    names = set(hosts)
    return EVERY_HOST if EVERY_HOST in names else ",".join(sorted(names))


def check_bound(annotations: Mapping[str, str] | None, where: str, host: str) -> None:
    """Refuse unless the Secret's binding names ``host`` (or every host of its namespace)."""
    hosts = bound_hosts(annotations)
    if EVERY_HOST in hosts or host in hosts:
        return
    if not hosts:
        raise CredentialsError(
            f"Secret {where} is not bound to any host: an operator who may edit it adds"
            f" annotation {HOSTS_ANNOTATION}: {host!r} (or runs 'metalmend credentials"
            f" bind'); see {SECURITY_DOC}"
        )
    raise CredentialsError(
        f"Secret {where} is not bound to host {host!r}: its annotation {HOSTS_ANNOTATION}"
        f" does not name it; an operator who may edit the Secret decides which hosts may use"
        f" it (see {SECURITY_DOC})"
    )


def credentials_changed(old: Any | None, new: Any | None) -> bool:
    """Whether a Secret's change can change what its hosts get: it appeared, went away
    (deleted, or its label removed), or its data or binding changed. Other metadata
    changes (and relists that bring nothing new) are not worth a BMC login."""
    if old is None or new is None:
        return True
    if old.data != new.data:
        return True
    return bound_hosts(old.metadata.annotations) != bound_hosts(new.metadata.annotations)


def secret_scopes(
    namespace: str | None, secret_namespaces: Sequence[str] | None
) -> list[str | None]:
    """The namespaces whose BMC Secrets are cached: one informer each (None: all).

    ``--namespace`` confines everything to one namespace; ``--secret-namespaces`` names
    the hosts' namespaces when metalmend watches all of them but may read Secrets only
    where a RoleBinding lets it (least privilege); neither: all namespaces, which needs
    list/watch on Secrets cluster-wide.
    """
    if namespace:
        return [namespace]
    if secret_namespaces:
        return list(dict.fromkeys(secret_namespaces))
    return [None]


class SecretCache(Protocol):
    """What is read of an informer's store: a Secret by ``namespace/name``."""

    def get(self, key: str) -> Any | None: ...


class CredentialStore:
    """BMC credentials from the cached, labelled Secrets of the configured namespaces
    (``caches``: one per namespace, or one under None for all namespaces)."""

    def __init__(self, caches: Mapping[str | None, SecretCache]) -> None:
        self.caches = dict(caches)

    def lookup(self, namespace: str, host: str, credentials_name: str | None) -> Credentials:
        """The credentials of host ``namespace/host``, or CredentialsError saying why not."""
        if not credentials_name:
            raise CredentialsError("spec.bmc.credentialsName is not set")
        if "/" in credentials_name:
            raise CredentialsError(
                f"spec.bmc.credentialsName {credentials_name!r} points outside the host's"
                f" namespace; the Secret must be in {namespace!r}"
            )
        # (not "get(...) or get(None)": an empty store is falsy)
        cache = self.caches[namespace] if namespace in self.caches else self.caches.get(None)
        if cache is None:
            readable = ", ".join(sorted(n for n in self.caches if n))
            raise CredentialsError(
                f"metalmend reads BMC Secrets only in namespaces {readable}"
                f" (--secret-namespaces), not in {namespace!r}"
            )
        where = f"{namespace}/{credentials_name}"
        secret = cache.get(where)
        if secret is None:
            raise CredentialsError(
                f"Secret {where} not found, or not labelled {SECRET_LABEL}={SECRET_LABEL_VALUE}"
                f" (metalmend reads only Secrets so labelled; see {SECURITY_DOC})"
            )
        check_bound(secret.metadata.annotations, where, host)
        credentials = from_secret_data(secret.data, where)
        if EVERY_HOST in bound_hosts(secret.metadata.annotations):
            # Bound with '*': the pool sends it only inside the allowed BMC networks, to
            # certificates of the operator's CA bundle (bmc/address.py check_trust).
            return dataclasses.replace(credentials, every_host=True)
        return credentials


class _OneSecret:
    """A cache holding one Secret read now (None: not found, or not labelled)."""

    def __init__(self, key: str, secret: Any | None) -> None:
        self.key, self.secret = key, secret

    def get(self, key: str) -> Any | None:
        return self.secret if key == self.key else None


def lookup_read(
    namespace: str, host: str, credentials_name: str | None, secret: Any | None
) -> Credentials:
    """``CredentialStore.lookup`` over one Secret read now rather than from a cache (for
    ``metalmend serve``, which keeps none): the same checks, in the same words, as
    host-power. ``secret`` is what a GET of the host's ``credentialsName`` found (None:
    not found); an unlabelled Secret reads as not found, as it does in host-power's cache."""
    labels = (secret.metadata.labels or {}) if secret is not None and secret.metadata else {}
    if labels.get(SECRET_LABEL) != SECRET_LABEL_VALUE:
        secret = None
    key = f"{namespace}/{credentials_name}"
    return CredentialStore({namespace: _OneSecret(key, secret)}).lookup(
        namespace, host, credentials_name
    )
