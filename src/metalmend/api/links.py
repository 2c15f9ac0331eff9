"""Which host a Machine may use, and which Node is that host's: the tenancy rules that every
controller following a Machine to a host or a Node applies (node-link, machine-remediation,
metal3-remediation). Pure functions over plain values; docs/security.md explains the model.

The rules, and where upstream Metal3 stands on each:

1. **A Machine reaches only hosts of its own namespace.** The annotation
   ``metal3.io/BareMetalHost`` is ``<namespace>/<host>``; a namespace other than the
   Machine's is refused. A bare ``<host>`` means the Machine's own namespace. (Cluster API
   Provider Metal3 writes the annotation itself, always as ``<namespace>/<host>`` of a host it
   chose among the hosts *of the Metal3Machine's namespace* (``chooseHost`` lists with
   ``InNamespace``), and its ``getBmhNameFromM3Machine`` refuses a value whose namespace is
   not the Metal3Machine's or that has no ``/``. We accept the bare name because it cannot
   leave the namespace; anything with more than one ``/`` or an empty part is refused, as
   Kubernetes' ``SplitMetaNamespaceKey`` refuses it.)
2. **A host confirms its Machine** through ``spec.consumerRef``: a Cluster API ``Machine``
   of that name in the host's namespace (with that uid, when the reference carries one), or
   the ``Metal3Machine`` the Machine's ``spec.infrastructureRef`` names (CAPM3 sets the
   consumerRef to the Metal3Machine). An OpenShift ``machine.openshift.io`` Machine is
   confirmed the same way by a consumerRef of its own group (OpenShift's metal3 provider
   sets it to the Machine); a reference to a Machine of the other group confirms nothing.
3. **The agreed providerIDs of a host** ``<namespace>/<host>`` with uid ``<uid>`` are exactly:

   - ``metal3://<namespace>/<host>`` (metalmend's form: the lab, the demo);
   - ``metal3://<namespace>/<host>/<name>`` (CAPM3's current form, ``SetDefaultProviderID``:
     the third part is the Metal3Machine's name, which the host's consumerRef vouches for);
   - ``metal3://<uid>`` (CAPM3's legacy form: the host's ``metadata.uid``);
   - ``baremetalhost:///<namespace>/<host>/<uid>`` (OpenShift's metal3 machine provider,
     on its Machines and Nodes: the third part is the host's ``metadata.uid`` and must be
     this host's, so a host deleted and re-made under the same name is not the same host);
   - ``baremetalhost:///<namespace>/<host>`` (the same provider's older form).

   A namespace is a DNS-1123 label, a host's (or Metal3Machine's) name a DNS-1123
   subdomain, a uid the API server's lowercase UUID: what the API server accepts. Any other
   value (another scheme, a part more or less, an empty or malformed part) names no host
   (``parse_provider_id``, the one parser of Machines' and Nodes' providerIDs).
4. **A Node is a Machine's only through its host**: a Node whose ``spec.providerID`` is set
   belongs to the host that providerID names, and only that host's (confirmed) Machine may
   link to it or fence it. A Node without providerID carries no proof of its server: it is
   linked by name and fenced as before (docs/security.md, "What is not covered").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metalmend.api import names

PROVIDER_PREFIX = "metal3://"
OPENSHIFT_PROVIDER_PREFIX = "baremetalhost:///"
MACHINE_GROUP = "cluster.x-k8s.io"
OPENSHIFT_MACHINE_GROUP = "machine.openshift.io"
MACHINE_GROUPS = (MACHINE_GROUP, OPENSHIFT_MACHINE_GROUP)
METAL3_MACHINE_GROUP = "infrastructure.cluster.x-k8s.io"

# Condition reasons on a Machine (condition names.CONDITION_HOST_LINK / CONDITION_NODE_LINK)
REASON_OTHER_NAMESPACE = "HostInOtherNamespace"
REASON_INVALID_REFERENCE = "InvalidHostReference"
REASON_NOT_CONFIRMED = "ProviderIDNotConfirmed"
REASON_NODE_OF_ANOTHER_HOST = "NodeOfAnotherHost"
REASON_VALID = "Valid"


# ---- rule 1: the host a Machine names ------------------------------------------------------


@dataclass(frozen=True)
class HostLink:
    """What a Machine's ``metal3.io/BareMetalHost`` annotation gives it."""

    key: str | None  # "namespace/name" the Machine may use; None: no host (absent or refused)
    refusal: str = ""  # why the annotation is refused: "" when accepted or absent
    reason: str = ""  # condition reason of the refusal

    @property
    def refused(self) -> bool:
        return bool(self.refusal)


def machine_host(machine_namespace: str, annotation: str | None) -> HostLink:
    """The host a Machine in ``machine_namespace`` may use, given its annotation value."""
    value = (annotation or "").strip()
    if not value:
        return HostLink(None)
    parts = value.split("/")
    if len(parts) == 1:
        return HostLink(f"{machine_namespace}/{value}")
    if len(parts) != 2 or not all(parts):
        return HostLink(
            None,
            f"{names.MACHINE_HOST} {value!r} is not <namespace>/<host> or <host>",
            REASON_INVALID_REFERENCE,
        )
    namespace, name = parts
    if namespace != machine_namespace:
        return HostLink(
            None,
            f"{names.MACHINE_HOST} names host {value} in another namespace: a Machine may"
            f" only use hosts of its own namespace ({machine_namespace})",
            REASON_OTHER_NAMESPACE,
        )
    return HostLink(f"{namespace}/{name}")


def key_in_namespace(key: str, namespace: str) -> bool:
    """Is ``key`` a "namespace/name" in ``namespace``? (For host keys read back from a
    status, which whoever may write the status subresource can forge.)"""
    parts = key.split("/")
    return len(parts) == 2 and all(parts) and parts[0] == namespace


def host_link_of(machine: Any) -> HostLink:
    annotations = machine.metadata.annotations or {}
    return machine_host(machine.metadata.namespace or "", annotations.get(names.MACHINE_HOST))


def host_of(machine: Any) -> list[str]:
    """Index function: the host key a Machine may use, or nothing (absent or refused)."""
    key = host_link_of(machine).key
    return [key] if key else []


def claimed_host_of(machine: Any) -> list[str]:
    """Index function: the host key a Machine *names*, even one it may not use (so that the
    controller keyed by that host can tell the Machine it was refused)."""
    value = ((machine.metadata.annotations or {}).get(names.MACHINE_HOST) or "").strip()
    parts = value.split("/")
    if len(parts) == 1 and value:
        return [f"{machine.metadata.namespace}/{value}"]
    return [value] if len(parts) == 2 and all(parts) else []


def node_of(machine: Any) -> list[str]:
    """Index function: the Node name of ``status.nodeRef`` (as written: not yet checked)."""
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    return [ref["name"]] if ref.get("name") else []


# ---- rule 2: the host confirms its consumer --------------------------------------------------

Consumer = Literal["confirmed", "unclaimed", "other"]


@dataclass(frozen=True)
class MachineIdentity:
    namespace: str
    name: str
    uid: str
    infrastructure_ref: Mapping[str, Any]  # spec.infrastructureRef ({} when none)
    group: str = MACHINE_GROUP  # the Machine's API group: Cluster API's or OpenShift's


def machine_group(machine: Any) -> str:
    """The API group of a Machine object (Cluster API's when it does not say)."""
    group = _group(str(getattr(machine, "apiVersion", None) or ""))
    return group if group in MACHINE_GROUPS else MACHINE_GROUP


def machine_identity(machine: Any) -> MachineIdentity:
    spec = machine.get("spec") or {}
    return MachineIdentity(
        namespace=machine.metadata.namespace or "",
        name=machine.metadata.name,
        uid=machine.metadata.uid or "",
        infrastructure_ref=dict(spec.get("infrastructureRef") or {}),
        group=machine_group(machine),
    )


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def consumer_of(
    consumer_ref: Mapping[str, Any] | None, host_namespace: str, machine: MachineIdentity
) -> Consumer:
    """Does the host's ``spec.consumerRef`` name this Machine (rule 2)?"""
    if not consumer_ref or not consumer_ref.get("name"):
        return "unclaimed"
    ref_namespace = consumer_ref.get("namespace") or host_namespace
    if ref_namespace != machine.namespace or host_namespace != machine.namespace:
        return "other"
    kind = consumer_ref.get("kind")
    group = _group(str(consumer_ref.get("apiVersion") or ""))
    if kind == "Machine" and group in MACHINE_GROUPS:
        if group != machine.group:
            return "other"
        uid = consumer_ref.get("uid")
        same = consumer_ref["name"] == machine.name and (not uid or uid == machine.uid)
        return "confirmed" if same else "other"
    infra = machine.infrastructure_ref
    if (
        kind == "Metal3Machine"
        and group == METAL3_MACHINE_GROUP
        and infra.get("kind") == "Metal3Machine"
        and _group(str(infra.get("apiVersion") or "")) == METAL3_MACHINE_GROUP
        and infra.get("name") == consumer_ref["name"]
        and (infra.get("namespace") or machine.namespace) == machine.namespace
    ):
        return "confirmed"
    return "other"


def metal3machine_key(machine: MachineIdentity) -> str | None:
    """The "<namespace>/<name>" of the Metal3Machine a Cluster API Machine's
    ``spec.infrastructureRef`` names (in the Machine's namespace only), else None."""
    infra = machine.infrastructure_ref
    if (
        machine.group != MACHINE_GROUP
        or infra.get("kind") != "Metal3Machine"
        or _group(str(infra.get("apiVersion") or "")) != METAL3_MACHINE_GROUP
        or not infra.get("name")
        or (infra.get("namespace") or machine.namespace) != machine.namespace
    ):
        return None
    return f"{machine.namespace}/{infra['name']}"


def capm3_host(
    machine: MachineIdentity,
    metal3machine_annotation: str | None,
    provider_id: str | None,
    host: Callable[[str], HostFacts | None],
) -> str | None:
    """The host of a Cluster API Machine that carries no ``metal3.io/BareMetalHost`` itself,
    as Cluster API Provider Metal3 links them (``baremetal/metal3machine_manager.go``): the
    annotation on the Metal3Machine its ``spec.infrastructureRef`` names (``HostAnnotation``),
    else the Machine's providerID ``metal3://<namespace>/<host>/<metal3machine>``
    (``SetDefaultProviderID``; its third part must be that Metal3Machine). Either way rule 1
    (the Machine's namespace) applies, and the host must confirm the Metal3Machine by its
    ``spec.consumerRef`` (rule 2), as CAPM3 sets it: None otherwise. ``host``: the host
    known by that "namespace/name", None if none."""
    m3m = metal3machine_key(machine)
    if m3m is None:
        return None
    key = machine_host(machine.namespace, metal3machine_annotation).key
    if key is None and metal3machine_annotation is None and provider_id:
        parts = provider_id.removeprefix(PROVIDER_PREFIX).split("/")
        if (
            provider_id.startswith(PROVIDER_PREFIX)
            and len(parts) == 3
            and all(parts)
            and f"{parts[0]}/{parts[2]}" == m3m
        ):
            key = machine_host(machine.namespace, f"{parts[0]}/{parts[1]}").key
    found = host(key) if key else None
    if found is None or consumer_of(found.consumer_ref, found.namespace, machine) != "confirmed":
        return None
    return key


# ---- rule 3: agreed providerIDs --------------------------------------------------------------


@dataclass(frozen=True)
class ProviderRef:
    """The host an agreed providerID names: by namespace and name, by uid (CAPM3's legacy
    form), or by all three (OpenShift's form: the name and the uid must both be the
    host's)."""

    namespace: str = ""
    host: str = ""
    uid: str = ""  # the host's metadata.uid the providerID carries ("" if none)


# What the API server accepts, and so all a providerID part naming an object may be: a
# namespace is a DNS-1123 label, a BareMetalHost or Metal3Machine name a DNS-1123 subdomain;
# a uid is the lowercase hyphenated UUID the API server gives every object.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_UID = re.compile(r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}")
MAX_SUBDOMAIN = 253


def is_namespace(value: str) -> bool:
    return _DNS_LABEL.fullmatch(value) is not None


def is_object_name(value: str) -> bool:
    return len(value) <= MAX_SUBDOMAIN and _DNS_SUBDOMAIN.fullmatch(value) is not None


def is_uid(value: str) -> bool:
    return _UID.fullmatch(value) is not None


def parse_provider_id(provider_id: str | None) -> ProviderRef | None:
    """The host an agreed providerID names (rule 3), or None for any other value: another
    scheme, a part more or less, an empty part, a namespace that is not a DNS-1123 label, a
    name that is not a DNS-1123 subdomain, a uid that is not a UUID. The one parser of
    Machines' and Nodes' providerIDs (what each may prove is the caller's rule)."""
    if not provider_id:
        return None
    if provider_id.startswith(OPENSHIFT_PROVIDER_PREFIX):
        # baremetalhost:///<namespace>/<host>[/<host uid>]
        parts = provider_id[len(OPENSHIFT_PROVIDER_PREFIX) :].split("/")
        if len(parts) not in (2, 3) or not _names(parts[0], parts[1]):
            return None
        if len(parts) == 2:
            return ProviderRef(namespace=parts[0], host=parts[1])
        return ProviderRef(parts[0], parts[1], parts[2]) if is_uid(parts[2]) else None
    if provider_id.startswith(PROVIDER_PREFIX):
        # metal3://<uid>, metal3://<namespace>/<host>[/<metal3machine>]
        parts = provider_id[len(PROVIDER_PREFIX) :].split("/")
        if len(parts) == 1:
            return ProviderRef(uid=parts[0]) if is_uid(parts[0]) else None
        if len(parts) not in (2, 3) or not _names(parts[0], *parts[1:]):
            return None
        return ProviderRef(namespace=parts[0], host=parts[1])
    return None


def _names(namespace: str, *names_: str) -> bool:
    return is_namespace(namespace) and all(is_object_name(n) for n in names_)


def provider_id_names_host(provider_id: str | None, host_key: str, host_uid: str) -> bool:
    ref = parse_provider_id(provider_id)
    if ref is None:
        return False
    if ref.uid and ref.uid != host_uid:
        return False  # a host made again under the same name is not the same host
    return not ref.host or f"{ref.namespace}/{ref.host}" == host_key


def provider_host_key(provider_id: str | None) -> str | None:
    """The "namespace/name" a namespaced providerID names (None for legacy or other)."""
    ref = parse_provider_id(provider_id)
    return f"{ref.namespace}/{ref.host}" if ref is not None and ref.host else None


# ---- rule 4: a Node through its host ---------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """What the rules need of a BareMetalHost."""

    key: str  # "namespace/name"
    uid: str
    consumer_ref: Mapping[str, Any] | None

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]


def host_facts(host: Any) -> HostFacts:
    spec = host.get("spec") or {}
    return HostFacts(
        key=f"{host.metadata.namespace}/{host.metadata.name}",
        uid=host.metadata.uid or "",
        consumer_ref=spec.get("consumerRef") or None,
    )


def confirm_provider_id(
    provider_id: str, machine: MachineIdentity, host: HostFacts | None, host_key: str | None
) -> str:
    """Empty if ``provider_id`` is one the Machine's host confirms (rules 2, 3), else why not.

    ``host_key``: the host the Machine may use (``HostLink.key``, or the host the providerID
    names when the Machine has no annotation); ``host``: that host, None if not found."""
    if host_key is None:
        return f"providerID {provider_id} names no host of namespace {machine.namespace}"
    if host is None:
        return f"providerID {provider_id}: host {host_key} not found"
    if not provider_id_names_host(provider_id, host.key, host.uid):
        return f"providerID {provider_id} is not an agreed providerID of host {host.key}"
    if consumer_of(host.consumer_ref, host.namespace, machine) != "confirmed":
        return (
            f"providerID {provider_id}: host {host.key} does not confirm this Machine"
            " (its spec.consumerRef names another consumer, or none)"
        )
    return ""


def host_key_for_link(machine: MachineIdentity, link: HostLink, provider_id: str | None) -> str:
    """The host to confirm a providerID with: the annotated one; without annotation, the
    host a namespaced providerID names, if it is in the Machine's namespace ("" if none)."""
    if link.key:
        return link.key
    if link.refused:
        return ""
    named = provider_host_key(provider_id)
    if named and named.partition("/")[0] == machine.namespace:
        return named
    return ""


def node_provider_id(node: Any) -> str | None:
    """A Node's ``spec.providerID`` (None when unset)."""
    return getattr(getattr(node, "spec", None), "providerID", None) or None


def node_fence_refusal(node_name: str, node_provider_id: str | None, host: HostFacts) -> str:
    """Empty if a remediation acting on ``host`` may fence (delete, taint, evict) the Node,
    else why not: a Node with a providerID belongs to the host that providerID names."""
    if not node_provider_id:
        return ""  # no proof either way: the Machine's own nodeRef decides (docs/security.md)
    if provider_id_names_host(node_provider_id, host.key, host.uid):
        return ""
    return (
        f"Node {node_name} (providerID {node_provider_id}) is not a Node of host {host.key}:"
        " refusing to fence it"
    )


# ---- a Node without a Machine: its host (the NodeHealthCheck, docs/healthcheck.md) -----------
#
# A kubelet writes its own Node: NodeRestriction lets it create the Node of its name with any
# annotation and any providerID (``--provider-id``), and annotate it later. So nothing on the
# Node alone may say which server it runs on. A Node's host is the one that confirms it:
#
# - the host whose ``metadata.uid`` its providerID carries: ``baremetalhost:///<namespace>/
#   <host>/<uid>`` (OpenShift's form; the namespace and name must be that host's) or CAPM3's
#   legacy ``metal3://<uid>``. A kubelet cannot read BareMetalHosts, so it cannot learn a
#   host's uid; whoever registers the Node with it was told by someone who could;
# - else the host that names the Node: annotation names.HOST_NODE (``metalmend.dev/node-name:
#   <node>``) on the BareMetalHost, which only those who may edit hosts of its namespace write.
#   One host only (two naming one Node: none), and the Node's providerID, if it names a host
#   (``metal3://<namespace>/<host>[/<machine>]``), must name that one (a providerID is set
#   once, at registration: a later rewrite cannot opt a Node out).
#
#   The host's word is trusted only while who may write it is guarded: the admission policy
#   names.NODE_NAME_POLICY (deploy/policies/node-name-writers.yaml) and its Deny binding in
#   force (kube/admission.PolicyInForce, read at every decision). Without it, anyone who may
#   edit hosts in a namespace could make their own host name another server's Node, which
#   a check would then fence while that server still runs (split brain); a providerID that
#   carries the host's uid needs no such guard.
#
# The Node's annotation names.NODE_HOST and a providerID without a uid are never proof: read
# only to say what is missing.


@dataclass(frozen=True)
class NodeHost:
    """The host a Node without a Machine runs on, as its hosts confirm it."""

    key: str | None  # "namespace/name"; None: no host confirms the Node
    problem: str = ""  # why none (a sentence for the check's status and Events)


def node_host(
    node: str,
    provider_id: str | None,
    naming: Sequence[HostFacts],
    by_uid: HostFacts | None,
    annotation: str | None = None,
    unguarded: str = "",
) -> NodeHost:
    """The host of Node ``node`` (the rules above). ``naming``: the hosts whose
    names.HOST_NODE annotation names it; ``by_uid``: the host whose uid its providerID
    carries (None if none has it, or it carries none); ``annotation``: the Node's own
    names.NODE_HOST, for the message only; ``unguarded``: why who may write names.HOST_NODE
    is not guarded ("" when names.NODE_NAME_POLICY is in force)."""
    ref = parse_provider_id(provider_id)
    if ref is not None and ref.uid:
        if by_uid is None:
            return NodeHost(None, f"providerID {provider_id} carries uid {ref.uid}, which no"
                                  " BareMetalHost has")  # fmt: skip
        named = f"{ref.namespace}/{ref.host}"
        if ref.host and named != by_uid.key:
            return NodeHost(None, f"providerID {provider_id} names host {named}, but the uid"
                                  f" it carries is host {by_uid.key}'s")  # fmt: skip
        others = sorted(h.key for h in naming if h.key != by_uid.key)
        if others:
            return NodeHost(None, f"providerID {provider_id} is host {by_uid.key}'s, but host"
                                  f" {', '.join(others)} names Node {node} too")  # fmt: skip
        return NodeHost(by_uid.key)
    if len(naming) > 1:
        keys = ", ".join(sorted(h.key for h in naming))
        return NodeHost(None, f"hosts {keys} all name Node {node} ({names.HOST_NODE}):"
                              " none is trusted")  # fmt: skip
    if not naming:
        said = f"; its own {names.NODE_HOST}: {annotation} proves nothing" if annotation else ""
        return NodeHost(
            None,
            f"no BareMetalHost names Node {node} ({names.HOST_NODE}: {node} on the host), and"
            f" its providerID ({provider_id or 'none'}) carries no host's uid{said}",
        )
    host = naming[0]
    if ref is not None and f"{ref.namespace}/{ref.host}" != host.key:
        return NodeHost(None, f"host {host.key} names Node {node}, but the Node's providerID"
                              f" {provider_id} names another host")  # fmt: skip
    if unguarded:
        namespace, _, name = host.key.partition("/")
        return NodeHost(
            None,
            f"host {host.key} names Node {node} ({names.HOST_NODE}), but {unguarded}, so"
            " anyone who may edit hosts of its namespace could have written it: it does not"
            f" choose a Node to fence. Install deploy/policies/node-name-writers.yaml (the"
            " chart does: policies.nodeNameWriters), or register the Node with providerID"
            f" baremetalhost:///{namespace}/{name}/<the host's uid>",
        )
    return NodeHost(host.key)


def host_named_node(host: Any) -> list[str]:
    """Index function: the Node a BareMetalHost names (names.HOST_NODE), if any."""
    value = ((host.metadata.annotations or {}).get(names.HOST_NODE) or "").strip()
    return [value] if value else []


def node_uid_ref(provider_id: str | None) -> str:
    """The host uid a Node's providerID carries ("" if none): to look the host up by."""
    ref = parse_provider_id(provider_id)
    return ref.uid if ref is not None else ""


# ---- OpenShift: a Node names its Machine ------------------------------------------------------
#
# OpenShift's nodelink-controller annotates each Node with its Machine,
# ``machine.openshift.io/machine: <namespace>/<machine>``; a NodeHealthCheck on OpenShift
# finds the Node's host through it (no hand-made annotation). The annotation is the
# kubelet's word (it may annotate its own Node), so it is followed only as far as others
# confirm it: the Machine claims the Node back (``node_machine_confirmed``), the Machine's
# host is of its own namespace and confirms the Machine (rules 1 to 3, ``confirm_provider_id``
# when the Machine has a providerID), the Node's own providerID, if any, names that host
# (rule 4), and no other host confirms the Node (``node_host_through_machine``).


def node_machine_key(annotations: Mapping[str, str] | None) -> str | None:
    """The "<namespace>/<machine>" of a Node's ``machine.openshift.io/machine`` annotation
    (OpenShift's nodelink-controller writes it), or None when absent or malformed."""
    value = ((annotations or {}).get(names.OPENSHIFT_NODE_MACHINE) or "").strip()
    parts = value.split("/")
    return value if len(parts) == 2 and all(parts) else None


def node_machine_confirmed(
    node_name: str,
    node_provider_id: str | None,
    machine_node_ref: str | None,
    machine_provider_id: str | None,
) -> bool:
    """Whether the Machine a Node's annotation names claims that Node back: its
    ``status.nodeRef`` names it, or (no nodeRef yet) its ``spec.providerID`` is the Node's
    and carries a host's uid. A nodeRef naming another Node is that Node's claim. The
    annotation alone is the kubelet's word (a kubelet may write its Node's
    annotations); the Machine's spec and status are not. A providerID without a uid
    (``baremetalhost:///<ns>/<host>``, ``metal3://<ns>/<host>``) is no claim: a kubelet
    can guess it and register a second Node with it (``--provider-id``); it cannot learn a
    host's uid."""
    if machine_node_ref:
        return machine_node_ref == node_name
    ref = parse_provider_id(node_provider_id)
    return ref is not None and bool(ref.uid) and node_provider_id == machine_provider_id


@dataclass(frozen=True)
class NodeMachine:
    """What the rules need of the OpenShift Machine a Node's annotation names."""

    identity: MachineIdentity
    host_annotation: str | None  # its metal3.io/BareMetalHost
    provider_id: str | None  # its spec.providerID
    node_ref: str | None  # the name its status.nodeRef gives


def node_machine_facts(machine: Any) -> NodeMachine:
    spec = machine.get("spec") or {}
    return NodeMachine(
        identity=machine_identity(machine),
        host_annotation=(machine.metadata.annotations or {}).get(names.MACHINE_HOST),
        provider_id=spec.get("providerID") or None,
        node_ref=next(iter(node_of(machine)), None),
    )


def node_host_through_machine(
    node: str,
    node_provider_id: str | None,
    machine_key: str,
    machine: NodeMachine | None,
    host: Callable[[str], HostFacts | None],
) -> NodeHost:
    """The host of Node ``node`` through the OpenShift Machine ``machine_key`` its
    annotation names (``machine``: that Machine, None if there is none), as that Machine
    and its host confirm it; ``host``: the host known by that "namespace/name"."""
    said = f"Node {node} names Machine {machine_key} ({names.OPENSHIFT_NODE_MACHINE})"
    if machine is None or machine.identity.group != OPENSHIFT_MACHINE_GROUP:
        return NodeHost(None, f"{said}, which does not exist")
    if not node_machine_confirmed(node, node_provider_id, machine.node_ref, machine.provider_id):
        return NodeHost(None, f"{said}, but that Machine does not name the Node back (its"
                              f" status.nodeRef: {machine.node_ref or 'none'}; its providerID"
                              f" {machine.provider_id or 'none'} is not the Node's"
                              f" {node_provider_id or 'none'} carrying a host's uid): the"
                              " Node's annotation alone proves nothing")  # fmt: skip
    identity = machine.identity
    link = machine_host(identity.namespace, machine.host_annotation)
    if link.refused:
        return NodeHost(None, f"{said}: {link.refusal}")
    key = host_key_for_link(identity, link, machine.provider_id)
    if not key:
        return NodeHost(None, f"{said}, which names no host of its namespace"
                              f" ({names.MACHINE_HOST}, or its providerID)")  # fmt: skip
    found = host(key)
    if found is None:
        return NodeHost(None, f"{said}: its host {key} not found")
    if machine.provider_id:
        why = confirm_provider_id(machine.provider_id, identity, found, key)
        if why:
            return NodeHost(None, f"{said}: {why}")
    elif consumer_of(found.consumer_ref, found.namespace, identity) != "confirmed":
        return NodeHost(None, f"{said}: host {key} does not confirm that Machine (its"
                              " spec.consumerRef names another consumer, or none)")  # fmt: skip
    refusal = node_fence_refusal(node, node_provider_id, found)
    if refusal:
        return NodeHost(None, f"{said}: {refusal}")
    return NodeHost(found.key)


def node_host_confirmed(
    node: str,
    direct: NodeHost,
    machine_key: str | None,
    through_machine: NodeHost | None,
    naming: Sequence[HostFacts],
) -> NodeHost:
    """The host of Node ``node``: ``direct`` (``node_host``: its hosts' word) and, where
    the Node names an OpenShift Machine, ``through_machine`` (``node_host_through_machine``).
    Either may find it; where both find one, it must be the same host; a host found through
    the Machine must be the only one that names the Node. A Machine that does not confirm
    the Node never hides a host that does (the annotation is the kubelet's to write: it
    cannot opt its Node out)."""
    if through_machine is None or machine_key is None:
        return direct
    via = through_machine.key
    if direct.key is not None:
        if via is None or via == direct.key:
            return direct
        return NodeHost(None, f"host {direct.key} confirms Node {node}, but the Machine it"
                              f" names, {machine_key}, is host {via}'s: neither is"
                              " trusted")  # fmt: skip
    if via is None:
        return through_machine
    others = sorted(h.key for h in naming if h.key != via)
    if others:
        return NodeHost(None, f"Node {node}'s Machine {machine_key} is host {via}'s, but host"
                              f" {', '.join(others)} names the Node ({names.HOST_NODE}):"
                              " neither is trusted")  # fmt: skip
    return through_machine
