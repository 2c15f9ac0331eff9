"""The settings of ``metalmend serve`` (section ``serve`` of ``metalmend.settings``)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path


def default_database_url() -> str:
    """A SQLite file in the user's state directory (XDG: ``$XDG_STATE_HOME``, else
    ``~/.local/state``): ``metalmend/serve.sqlite``. Not the working directory, which a
    Pod or a service manager may not let us write; in a Pod, give a path on a volume."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return f"sqlite:///{Path(state) / 'metalmend' / 'serve.sqlite'}"


@dataclass(frozen=True)
class ServeSettings:
    """Where and how ``metalmend serve`` listens."""

    bind_address: str = "127.0.0.1"
    """Address to listen on. Loopback by default: nothing is exposed until the operator
    chooses to (in a Pod, its own address or 0.0.0.0, with TLS)."""

    port: int = 8443
    """TCP port to listen on."""

    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; with ``tls_key``. Without both the
    service speaks plain HTTP, which is allowed on a loopback address only: callers send
    bearer tokens."""

    tls_key: Path | None = None
    """PEM private key of ``tls_cert``."""

    database_url: str = field(default_factory=default_database_url)
    """Where the design revisions (docs/design-store.md) and tasks are kept: SQLite,
    ``sqlite:////var/lib/metalmend/serve.sqlite`` (one replica; the default, a file in the
    user's state directory), or PostgreSQL, ``postgresql+psycopg://USER:PASSWORD@HOST/DB``
    (for more than one replica). Created and upgraded when ``metalmend serve`` starts."""

    site_namespaces: tuple[str, ...] = ()
    """The namespaces whose BareMetalHosts and Machines deploy_site and update_site may
    write (docs/site-actions.md). Empty by default: a site action applies no namespaced
    object until the operator names them (comma-separated in the environment)."""

    # ---- site designs (deploy_site, update_site, redeploy_server): what a design may hold
    site_label_prefixes: tuple[str, ...] = ()
    """Label key prefixes of the ``kubernetes.io`` and ``k8s.io`` domains a site design may
    set, say ``node-role.kubernetes.io/`` (docs/site-actions.md, "What a design may hold").
    None by default: those domains are the kubelet's and the control plane's (its
    hostname, node-restriction, topology), and a label there moves workloads or makes a
    Node pass for another; an operator allows only the prefixes their site uses."""


class ServeSettingsError(ValueError):
    """Settings ``metalmend serve`` cannot start with; the message says which and why."""


def check(settings: ServeSettings) -> None:
    """Raise ServeSettingsError for combinations the settings loader cannot see alone."""
    if settings.port > 65535:
        raise ServeSettingsError(f"serve.port must be at most 65535, not {settings.port}")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ServeSettingsError("serve.tls_cert and serve.tls_key go together: give both")
    for path in (settings.tls_cert, settings.tls_key):
        if path is not None and not path.is_file():
            raise ServeSettingsError(f"cannot read {path}: no such file")
    if settings.tls_cert is None and not is_loopback(settings.bind_address):
        raise ServeSettingsError(
            f"serve.bind_address {settings.bind_address} is not a loopback address: give"
            " serve.tls_cert and serve.tls_key (callers send bearer tokens)"
        )


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
