"""The settings of ``metalmend serve`` (section ``serve`` of ``metalmend.settings``): what the
service binds, accepts and reads. Checked as a whole by ``metalmend.serve.settings.check``."""

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

    metrics_bind: str = ""
    """host:port for serve's own /metrics (plain HTTP, no token: nothing in it names a
    node, host, user or design; docs/observability.md). Empty: not served. The chart binds
    the Pod's address on its serve.metricsPort."""

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

    # ---- the store's identity (docs/design-store.md, "When the store is replaced") ----

    store_namespace: str = ""
    """The namespace of the ConfigMap ``metalmend-serve-store``, where serve records which
    store (design revisions, tasks, actions) it serves, so that a database replaced under
    it (a SQLite file lost with its volume) is noticed at the next start. Empty: the
    namespace of serve's own ServiceAccount (the chart's release namespace), else
    ``metalmend-system``; deploy/rbac/serve.yaml grants that ConfigMap there."""

    accept_store: str = ""
    """The id of a store serve may serve in place of the one it recorded (printed by the
    refusal to start). Empty by default: a replaced store is never served silently. It
    names one store, so left set it accepts no later replacement."""

    store_loss_accepted: bool = False
    """The store is known to be lost at every restart (SQLite on an emptyDir: the chart's
    ``serve.database.acceptDataLoss``, a test install): each new store is recorded without
    asking, with a warning. Off by default: losing the records of destroys and site
    actions is never silent."""

    # ---- authentication: the TokenReview cache and the failed-authentication limit
    token_cache_seconds: float = 10.0
    """How long a TokenReview answer (authenticated or not) is kept, by the token's SHA-256:
    10 s, as Kubernetes' delegating authenticator keeps extension API servers' TokenReviews
    (k8s.io/apiserver, ``--authentication-token-webhook-cache-ttl``). Longer spares the API
    server more; a revoked token keeps working for up to this long (docs/teardown.md,
    "Authorization")."""

    token_cache_size: int = 10_000
    """At most this many TokenReview answers are kept (the oldest dropped first): a bound on
    memory, which a stream of distinct garbage tokens would otherwise fill (about 300 bytes
    an answer)."""

    auth_failures_burst: int = 10
    """TokenReviews of unproven tokens (neither proved valid by an earlier review nor
    signed by the cluster's ServiceAccount issuer) one client address may cost at once
    before it gets 429 and costs no TokenReview: a person retyping a token, or a CLI with
    a stale one, fails a few times; a client sending hundreds is guessing or broken. Each
    review claims one before it is sent; a token that proves valid gives it back."""

    auth_failure_interval: float = 1.0
    """Seconds for one of them to come back to an address: a steady garbage sender costs at
    most one TokenReview a second per address, however many connections it opens."""

    # -- design references and etcd credentials (docs/security.md) --------------------------

    design_url_prefixes: tuple[str, ...] = ()
    """https URL prefixes (``https://HOST[:PORT][/PATH]``) a design reference may point
    at besides serve's own design store (``deckhand+https://.../revisions/N/...``). Empty
    by default: a design reference is caller input, and fetching any URL a caller names
    would let a caller make serve reach internal addresses (docs/teardown.md). https only,
    no user name or password; a URL must match host, port and a path under PATH."""

    design_ca_bundle: Path | None = None
    """PEM CA certificates to verify the servers of ``design_url_prefixes`` with, for a
    design server whose certificate a private CA signed. None by default: the system's
    trusted CAs (certifi's)."""

    etcd_credentials_secrets: tuple[str, ...] = ()
    """etcd credentials Secrets (``namespace/name``) usable for any etcd cluster a design
    names, if labelled ``metalmend.dev/etcd-credentials: "true"``. Empty by default: a
    Secret is then used only for the clusters its ``metalmend.dev/etcd-clusters``
    annotation lists. The chart grants serve ``get`` on exactly these Secrets."""

    # --- request bodies and YAML (docs/design-store.md, "Limits") ---------------------------

    max_body_bytes: int = 4 << 20
    """Largest design body (Deckhand's document put, Shipyard's configdocs), in bytes; a
    larger one is refused with 413 before it is read. 4 MiB: the 2,000-host design of
    benchmarks/design_store.py is 1.3 MB, so three times the largest site designs we
    measured fit; what a put holds in memory grows with it (benchmarks/body_memory.py:
    raise the chart's memory limit with it). Every other body (JSON requests, design
    references, a tag's data) is limited to 64 KiB, fixed."""

    max_design_documents: int = 5_000
    """YAML documents in one design body: 2.5 times the 2,000-host design (one document
    per host, and its networks and racks); past it, 400 before the rest is read."""

    max_design_values: int = 500_000
    """YAML values (scalars, lists, mappings) in one design body, each alias counted as a
    copy of what it names; past it, 400. A site design holds one value per ~9 bytes of
    YAML (the 2,000-host design: ~150,000), so a realistic body of ``max_body_bytes``
    (~470,000) fits; dense YAML (``[ab,ab,...]``), which costs ~200 bytes of memory a value,
    and alias bombs do not."""

    # ---- site designs (deploy_site, update_site, redeploy_server): what a design may hold
    site_label_prefixes: tuple[str, ...] = ()
    """Label key prefixes of the ``kubernetes.io`` and ``k8s.io`` domains a site design may
    set, say ``node-role.kubernetes.io/`` (docs/site-actions.md, "What a design may hold").
    None by default: those domains are the kubelet's and the control plane's (its
    hostname, node-restriction, topology), and a label there moves workloads or makes a
    Node pass for another; an operator allows only the prefixes their site uses."""


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
