"""What ``deploy_site`` and ``update_site`` apply, and what they refuse (docs/site-actions.md,
"deploy_site and update_site"): pure rules over a design revision's documents.

The design's Kubernetes objects are documents of schema ``metalmend/KubernetesObject/v1``
whose ``data`` is the object. A design is input an operator (or anyone who may put
configdocs) controls, and a site action applies it with metalmend's own identity, so
only what a site deployment needs is accepted:

- kinds: ``BareMetalHost`` (metal3.io/v1alpha1), ``Machine`` (cluster.x-k8s.io/v1beta1),
  and ``Node`` (v1) carrying **labels only** (a Node is the kubelet's; the design may
  only say how it is labelled);
- namespaced objects only in the namespaces the service is configured for
  (``serve.site_namespaces``): a design cannot reach into another tenant's hosts;
- metadata: name, namespace, labels, annotations, and no key that would make a
  controller act on a server: no annotation that asks for power (``reboot.metal3.io``)
  or remediation (``host.metal3.io/external-remediation``,
  ``cluster.x-k8s.io/remediate-machine``, ``remediation.metal3.io/``), no key of
  metalmend's own (``metalmend.dev``, its subdomains: the teardown claim among them), no
  teardown label (``promenade-decomission``, which stops a Node's kubelet): a design must
  not fence, power-cycle or stop a server by being applied;
- no label key of the ``kubernetes.io`` and ``k8s.io`` domains (and subdomains: the
  kubelet's and the control plane's own), but those under a prefix the operator allows
  (``serve.site_label_prefixes``, say ``node-role.kubernetes.io/``);
- a Node document only for a Node of the design's own hosts (a BareMetalHost of that
  name in the design; the step checks the Node in the cluster is that host's);
- no ``status`` (the controllers' own), no two objects of one kind, namespace and name;
- object references only in the object's own namespace: a host's ``spec.consumerRef``
  (pointed at another namespace's Machine, it took that Machine's nodeRef away), a
  Machine's ``spec.infrastructureRef`` and ``spec.bootstrap.configRef``;
- a BareMetalHost names its BMC credentials (``spec.bmc.credentialsName``): the Secret is
  referenced, never carried in the design; that it exists and host-power would use it
  for that host (labelled, bound), and that the address parses, is checked by each
  action's validation over what ``bmc_problems`` is given (one rule for all of them).

Each problem names the document and the key. ``read_site`` is the one function
deploy_site, update_site, redeploy_server and the configdocs commit check a design with.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from metalmend.api.names import (
    EXTERNAL_REMEDIATION,
    REBOOT,
    REBOOT_PREFIX,
    REMEDIATE_MACHINE,
    REMEDIATION_FINALIZER,
)
from metalmend.siteactions.policy import redeploy as policy_redeploy
from metalmend.siteactions.policy.redeploy import (
    HOST_KINDS,
    KUBERNETES_OBJECT,
    HostError,
    fails_wait,
)
from metalmend.teardown.policy.settings import DECOMMISSION_LABEL

MAX_OBJECTS = 20_000  # far beyond a site; a bound on what one action writes
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_METADATA = frozenset({"name", "namespace", "labels", "annotations"})
_NODE_METADATA = frozenset({"name", "labels"})
# Keys a design never carries (labels and annotations alike): each makes a controller act
# on a server (power, remediation, teardown) or is metalmend's own bookkeeping.
_POWER_KEYS = frozenset({REBOOT, EXTERNAL_REMEDIATION, REMEDIATE_MACHINE, DECOMMISSION_LABEL})
_POWER_PREFIXES = (REBOOT_PREFIX, f"{REMEDIATION_FINALIZER}/")
_OWN_DOMAIN = "metalmend.dev"
# The Kubernetes project's label domains: the kubelet's and the control plane's labels
# (node-role, node-restriction, topology, the kubelet's hostname/os/arch...).
_KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")
APPLY_ORDER = ("BareMetalHost", "Machine")  # a Machine's host exists before it


@dataclass(frozen=True)
class SiteObject:
    kind: str
    namespace: str  # "" for a Node
    name: str
    body: Mapping[str, Any]

    @property
    def key(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name}"
            if self.namespace
            else f"{self.kind} {self.name}"
        )


@dataclass(frozen=True)
class SiteDesign:
    """The objects to apply (hosts first, then machines), the Nodes' labels, and every
    problem found (an action applies nothing while there is one)."""

    objects: tuple[SiteObject, ...] = ()
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[SiteObject, ...]:
        return tuple(o for o in self.objects if o.kind == "BareMetalHost")


def read_site(
    documents: Iterable[Any], namespaces: Iterable[str], label_prefixes: Iterable[str] = ()
) -> SiteDesign:
    """The design's objects and every problem in it (``label_prefixes``: the
    ``kubernetes.io``/``k8s.io`` label prefixes the operator allows)."""
    allowed = frozenset(namespaces)
    keys = _Keys(tuple(label_prefixes))
    objects: list[SiteObject] = []
    labels: dict[str, Mapping[str, str]] = {}
    problems: list[str] = []
    seen: set[str] = set()
    nodes: dict[str, str] = {}  # Node name -> its document
    count = 0
    for where, data in _kubernetes_objects(documents, problems):
        count += 1
        if count > MAX_OBJECTS:
            problems.append(f"more than {MAX_OBJECTS} Kubernetes objects in the design")
            break
        found = _object(where, data, allowed, keys, problems)
        if found is None:
            continue
        if found.key in seen:
            problems.append(f"{where}: {found.key} is in the design twice")
            continue
        seen.add(found.key)
        if found.kind == "Node":
            labels[found.name] = dict(found.body["metadata"].get("labels") or {})
            nodes[found.name] = where
        else:
            objects.append(found)
    objects.sort(key=lambda o: APPLY_ORDER.index(o.kind))
    host_names = {o.name for o in objects if o.kind == "BareMetalHost"}
    for name, where in sorted(nodes.items()):
        if name not in host_names:
            problems.append(
                f"{where}: Node {name!r} is not a Node of the design's hosts (no"
                f" BareMetalHost {name!r} in the design): a design labels its own Nodes only"
            )
            del labels[name]
    if not allowed and objects:
        problems.append(
            "metalmend serve applies no namespaced object: serve.site_namespaces is empty"
            " (name the namespaces site actions may write)"
        )
    return SiteDesign(tuple(objects), labels, tuple(problems))


def _kubernetes_objects(
    documents: Iterable[Any], problems: list[str]
) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for document in documents:
        if not isinstance(document, Mapping) or document.get("schema") != KUBERNETES_OBJECT:
            continue
        meta = document.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        where = f"document {_shown(name)}"
        data = document.get("data")
        if not isinstance(data, Mapping):
            problems.append(f"{where}: data must be a Kubernetes object")
            continue
        yield where, data


def _object(
    where: str,
    data: Mapping[str, Any],
    allowed: frozenset[str],
    keys: _Keys,
    problems: list[str],
) -> SiteObject | None:
    kind, version = data.get("kind"), data.get("apiVersion")
    if not isinstance(kind, str) or HOST_KINDS.get(kind) != version:
        known = ", ".join(f"{k} ({v})" for k, v in HOST_KINDS.items())
        problems.append(
            f"{where}: {_shown(version)} {_shown(kind)} is not a kind site actions apply;"
            f" they apply {known}"
        )
        return None
    meta = data.get("metadata")
    if not isinstance(meta, Mapping):
        problems.append(f"{where}: {kind} has no metadata")
        return None
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        problems.append(f"{where}: {kind} name {_shown(name)} is not a valid name")
        return None
    before = len(problems)
    if kind == "Node":
        _node_problems(where, data, meta, keys, problems)
        namespace = ""
    else:
        _namespaced_problems(where, kind, data, meta, namespace, allowed, keys, problems)
    if len(problems) > before:
        return None
    return SiteObject(kind, str(namespace or ""), name, data)


def _node_problems(
    where: str, data: Mapping[str, Any], meta: Mapping[str, Any], keys: _Keys, problems: list[str]
) -> None:
    extra = sorted(str(k) for k in data if k not in ("apiVersion", "kind", "metadata"))
    extra += sorted(f"metadata.{k}" for k in meta if k not in _NODE_METADATA)
    if extra:
        problems.append(
            f"{where}: a Node in the design may carry only its labels, not {', '.join(extra)}"
        )
    _key_problems(where, "label", meta.get("labels"), keys, problems)


def _namespaced_problems(
    where: str,
    kind: str,
    data: Mapping[str, Any],
    meta: Mapping[str, Any],
    namespace: object,
    allowed: frozenset[str],
    keys: _Keys,
    problems: list[str],
) -> None:
    if not isinstance(namespace, str) or not namespace:
        problems.append(f"{where}: {kind} {meta.get('name')} has no metadata.namespace")
    elif allowed and namespace not in allowed:
        problems.append(
            f"{where}: namespace {_shown(namespace)} is not one site actions write"
            f" (serve.site_namespaces: {', '.join(sorted(allowed))})"
        )
    if "status" in data:
        problems.append(f"{where}: status is the controllers', not the design's")
    extra = sorted(f"metadata.{k}" for k in meta if k not in _METADATA)
    if extra:
        problems.append(f"{where}: {', '.join(extra)} cannot be set by the design")
    _key_problems(where, "label", meta.get("labels"), keys, problems)
    _key_problems(where, "annotation", meta.get("annotations"), keys, problems)
    if kind == "BareMetalHost":
        _host_problems(where, data.get("spec"), problems)
    if isinstance(namespace, str) and namespace:
        _reference_problems(where, kind, data.get("spec"), namespace, problems)


def _domain(key: str) -> str:
    """The prefix of a label or annotation key (``node-role.kubernetes.io``), "" if none."""
    prefix, slash, _ = key.partition("/")
    return prefix.lower() if slash else ""


def _in_domain(domain: str, parent: str) -> bool:
    return domain == parent or domain.endswith("." + parent)


@dataclass(frozen=True)
class _Keys:
    label_prefixes: tuple[str, ...]  # kubernetes.io / k8s.io prefixes the operator allows

    def refused(self, key: str, label: bool) -> str | None:
        """Why a design cannot carry ``key`` (None: it can)."""
        domain = _domain(key)
        if key in _POWER_KEYS or key.startswith(_POWER_PREFIXES):
            return "would power, fence, remediate or stop a server"
        if _in_domain(domain, _OWN_DOMAIN):
            return f"is metalmend's own ({_OWN_DOMAIN}: claims and bookkeeping)"
        if (
            label
            and any(_in_domain(domain, d) for d in _KUBERNETES_DOMAINS)
            and not key.startswith(self.label_prefixes)
        ):
            allowed = ", ".join(self.label_prefixes) or "none"
            return (
                "is in a Kubernetes domain (the kubelet's and the control plane's); an"
                f" operator allows prefixes in serve.site_label_prefixes (allowed: {allowed})"
            )
        return None


def _strings(raw: object) -> bool:
    return isinstance(raw, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    )


def _key_problems(where: str, kind: str, values: object, keys: _Keys, problems: list[str]) -> None:
    """The refused keys of ``metadata.<kind>s`` ("label" or "annotation")."""
    if values is None:
        return
    if not _strings(values):
        problems.append(f"{where}: {kind}s must map strings to strings")
        return
    assert isinstance(values, Mapping)
    for key in values:
        why = keys.refused(key, label=kind == "label")
        if why:
            problems.append(f"{where}: {kind} {_shown(key)} {why}; a design cannot carry it")


def _host_problems(where: str, spec: object, problems: list[str]) -> None:
    bmc = spec.get("bmc") if isinstance(spec, Mapping) else None
    if not isinstance(bmc, Mapping):
        problems.append(f"{where}: BareMetalHost has no spec.bmc")
        return
    if not isinstance(bmc.get("address"), str):
        problems.append(f"{where}: spec.bmc.address must be a string")
    credentials = bmc.get("credentialsName")
    if not isinstance(credentials, str) or not _DNS_SUBDOMAIN.fullmatch(credentials):
        problems.append(
            f"{where}: spec.bmc.credentialsName must name the Secret of the BMC's"
            " credentials (the design references it; it never carries it)"
        )


# The object references of each kind that a controller follows: a host's consumer (its
# Machine, whose nodeRef baremetal-operator's and CAPM3's controllers then keep), a
# Machine's infrastructure and bootstrap objects. Each only in the object's own namespace.
_REFERENCES: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "BareMetalHost": (("consumerRef",),),
    "Machine": (("infrastructureRef",), ("bootstrap", "configRef")),
}


def _reference_problems(
    where: str, kind: str, spec: object, namespace: str, problems: list[str]
) -> None:
    """A reference of ``spec`` into another namespace: a design would tie a server to
    another tenant's Machine (its nodeRef lost), or a Machine to another's objects."""
    for path in _REFERENCES.get(kind, ()):
        found: object = spec
        for step in path:
            found = found.get(step) if isinstance(found, Mapping) else None
        if found is None:
            continue
        key = "spec." + ".".join(path)
        if not isinstance(found, Mapping):
            problems.append(f"{where}: {key} must be an object reference")
            continue
        other = found.get("namespace")
        if other is not None and other != namespace:
            problems.append(
                f"{where}: {key}.namespace {_shown(other)} is not the {kind}'s namespace"
                f" {_shown(namespace)}: a design refers only to objects of the same namespace"
            )


def _shown(raw: object) -> str:
    text = raw if isinstance(raw, str) else repr(raw)
    return repr(text[:64] + ("..." if len(text) > 64 else ""))


# ---- waiting for the site -----------------------------------------------------------------

FAILED_STATES = policy_redeploy.FAILED_STATES


@dataclass(frozen=True)
class HostSeen:
    """A design host as the cluster shows it (None fields: not reported yet)."""

    key: str
    wants_on: bool
    wants_image: bool
    provisioning: str
    powered_on: bool | None
    error: str = ""
    problem: HostError | None = None  # policy.redeploy.host_error of its status

    @property
    def trouble(self) -> HostError | None:
        if self.problem is None and self.provisioning in FAILED_STATES:
            return HostError(self.provisioning, self.error)
        return self.problem


@dataclass(frozen=True)
class Progress:
    waiting: tuple[str, ...]  # one line per thing not there yet
    failed: tuple[str, ...]  # one line per host that cannot get there

    @property
    def done(self) -> bool:
        return not self.waiting and not self.failed

    def fails(self, continue_on_fail: bool = False) -> bool:
        """Whether the wait fails now: at the first failure; with ``continue_on_fail``,
        once nothing else is waited for."""
        return bool(self.failed) and (not continue_on_fail or not self.waiting)


def progress(
    hosts: Iterable[HostSeen],
    nodes: Mapping[str, bool | None],
    known: Mapping[str, str] | None = None,
    continue_on_fail: bool = False,
) -> Progress:
    """What the site still waits for: hosts on (and provisioned, when the design gives an
    image) and the design's Nodes registered and Ready (``nodes``: name -> Ready, None
    when the Node does not exist). A host in error fails the wait at once
    (``policy.redeploy.fails_wait``), except an error it already showed, unchanged, when the
    wait began (``known``: host key -> the error's mark), which it waits out.
    ``continue_on_fail`` (Shipyard's ``continue-on-fail=true``): a failed host's Node is no
    longer waited for, so the caller waits for the other hosts before failing (``fails``)."""
    waiting: list[str] = []
    failed: list[str] = []
    nodes = dict(nodes)
    for host in hosts:
        trouble = host.trouble
        if trouble is not None and fails_wait(trouble, (known or {}).get(host.key)):
            failed.append(f"{host.key}: {trouble.describe()}")
            if continue_on_fail:  # its Node, named as the host, will not come
                nodes.pop(host.key.rsplit("/", 1)[-1], None)
        elif trouble is not None:
            waiting.append(
                f"{host.key} in error since before this wait ({trouble.describe()}): waiting"
                " for its next attempt"
            )
        elif host.wants_image and host.provisioning != "provisioned":
            waiting.append(f"{host.key} {host.provisioning or 'not registered'}")
        elif host.wants_on and host.powered_on is not True:
            waiting.append(f"{host.key} not on yet")
    for name, ready in sorted(nodes.items()):
        if ready is None:
            waiting.append(f"Node {name} not registered")
        elif not ready:
            waiting.append(f"Node {name} not Ready")
    return Progress(tuple(waiting), tuple(failed))


def known_errors(hosts: Iterable[HostSeen]) -> dict[str, str]:
    """The errors the hosts show now, by host key: what a wait beginning now waits out."""
    return {h.key: t.mark for h in hosts if (t := h.trouble) is not None}


def still_known(known: Mapping[str, str], hosts: Iterable[HostSeen]) -> dict[str, str]:
    """``known`` without the hosts seen out of error since: an error they show later is
    new, even should it read the same."""
    troubled = {h.key for h in hosts if h.trouble is not None}
    return {k: v for k, v in known.items() if k in troubled}


# ---- redeploy_server: one server of the design ---------------------------------------------


def redeploy_problems(design: SiteDesign, nodes: Iterable[str]) -> list[str]:
    """What redeploy_server refuses in a design revision: everything deploy_site refuses
    (the whole revision is read by ``read_site``: what redeploy applies is the design's,
    and a revision deploy_site would refuse is not deployed server by server either),
    then, per target node, exactly one BareMetalHost of its name, with an image to
    deploy. Whether the Node in the cluster is that host's is the step's check."""
    problems = list(design.problems)
    for node in nodes:
        named = [h for h in design.hosts if h.name == node]
        if not named:
            problems.append(f"the design has no BareMetalHost {node!r}")
        elif len(named) > 1:
            where = ", ".join(h.namespace for h in named)
            problems.append(
                f"the design has {len(named)} BareMetalHosts named {node!r} (in {where}):"
                " which one is the Node's cannot be told"
            )
        elif not isinstance((named[0].body.get("spec") or {}).get("image"), Mapping):
            problems.append(f"{named[0].key} in the design has no spec.image to deploy")
    return problems


# ---- each action's hosts as the cluster would run them: their BMC address and Secret -------


@dataclass(frozen=True)
class HostBmcSeen:
    """What serve found of a design host's BMC before anything is written: why its
    ``spec.bmc.address`` is not one metalmend drives (``metalmend.bmc.address.parse``),
    and why host-power would not use its credentials Secret (missing, not readable by
    serve, not labelled, not bound to the host, without username or password: the checks
    and words of ``metalmend.bmc.credentials``); "" for each that holds."""

    host: SiteObject
    address: str = ""
    credentials: str = ""


def bmc_hosts(design: SiteDesign, targets: Iterable[str] | None = None) -> tuple[SiteObject, ...]:
    """The hosts whose BMC an action checks at validation: what it applies. deploy_site
    and update_site (``targets`` None): every host of the design; redeploy_server: the
    one host of each target node (``redeploy_problems`` found exactly one)."""
    if targets is None:
        return design.hosts
    wanted = list(targets)
    return tuple(h for h in design.hosts if h.name in wanted)


def bmc_problems(seen: Iterable[HostBmcSeen]) -> list[str]:
    """The one rule deploy_site, update_site and redeploy_server validate their hosts'
    BMCs with: a host whose address or Secret host-power would refuse is not applied
    (deploy_site would leave it in error; redeploy_server would first wipe the server it
    then could not power). One line per problem, naming the host."""
    problems = []
    for host in seen:
        if host.address:
            problems.append(f"{host.host.key}: spec.bmc.address: {host.address}")
        if host.credentials:
            problems.append(f"{host.host.key}: {host.credentials}")
    return problems


def host_named(design: SiteDesign, node: str) -> SiteObject | None:
    """The design's one BareMetalHost of ``node``'s name (None: none, or more than one)."""
    named = [h for h in design.hosts if h.name == node]
    return named[0] if len(named) == 1 else None
