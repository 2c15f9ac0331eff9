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

   Every part is non-empty and contains no ``/``. Any other value (another scheme, more
   parts) names no host.
4. **A Node is a Machine's only through its host**: a Node whose ``spec.providerID`` is set
   belongs to the host that providerID names, and only that host's (confirmed) Machine may
   link to it or fence it. A Node without providerID carries no proof of its server: it is
   linked by name and fenced as before (docs/security.md, "What is not covered").
"""

from __future__ import annotations

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
    """The host a metal3 providerID names: by namespace and name, or by uid (legacy)."""

    namespace: str = ""
    host: str = ""
    uid: str = ""
    host_uid: str = ""  # with namespace and host: the uid the host must also have (OpenShift)


def parse_openshift_provider_id(provider_id: str | None) -> ProviderRef | None:
    """The host an OpenShift providerID names (``baremetalhost:///<ns>/<host>[/<uid>]``),
    or None for any other value."""
    if not provider_id or not provider_id.startswith(OPENSHIFT_PROVIDER_PREFIX):
        return None
    parts = provider_id[len(OPENSHIFT_PROVIDER_PREFIX) :].split("/")
    if not all(parts) or len(parts) not in (2, 3):
        return None
    return ProviderRef(
        namespace=parts[0], host=parts[1], host_uid=parts[2] if len(parts) == 3 else ""
    )


def parse_provider_id(provider_id: str | None) -> ProviderRef | None:
    """The host an agreed providerID names (rule 3), or None for any other value."""
    if provider_id and provider_id.startswith(OPENSHIFT_PROVIDER_PREFIX):
        return parse_openshift_provider_id(provider_id)
    if not provider_id or not provider_id.startswith(PROVIDER_PREFIX):
        return None
    parts = provider_id[len(PROVIDER_PREFIX) :].split("/")
    if not all(parts):
        return None
    if len(parts) == 1:
        return ProviderRef(uid=parts[0])
    if len(parts) in (2, 3):
        return ProviderRef(namespace=parts[0], host=parts[1])
    return None


def provider_id_names_host(provider_id: str | None, host_key: str, host_uid: str) -> bool:
    ref = parse_provider_id(provider_id)
    if ref is None:
        return False
    if ref.uid:
        return bool(host_uid) and ref.uid == host_uid
    if ref.host_uid and ref.host_uid != host_uid:
        return False
    return f"{ref.namespace}/{ref.host}" == host_key


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

BAREMETALHOST_PREFIX = "baremetalhost:///"


def parse_baremetalhost_provider_id(provider_id: str | None) -> ProviderRef | None:
    """``baremetalhost:///<namespace>/<host>/<host uid>`` (OpenShift's Node providerID), or
    None: every part non-empty, no other part."""
    if not provider_id or not provider_id.startswith(BAREMETALHOST_PREFIX):
        return None
    parts = provider_id[len(BAREMETALHOST_PREFIX) :].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return ProviderRef(namespace=parts[0], host=parts[1], uid=parts[2])


def node_provider_ref(provider_id: str | None) -> ProviderRef | None:
    """The host a Node's providerID names: OpenShift's ``baremetalhost:///`` form (with the
    host's uid), or an agreed metal3 form (rule 3: by name, or by uid alone); None for any
    other value (``k3s://<node>``, a malformed one)."""
    return parse_baremetalhost_provider_id(provider_id) or parse_provider_id(provider_id)


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
    ref = node_provider_ref(provider_id)
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
            f" {BAREMETALHOST_PREFIX}{namespace}/{name}/<the host's uid>",
        )
    return NodeHost(host.key)


def host_named_node(host: Any) -> list[str]:
    """Index function: the Node a BareMetalHost names (names.HOST_NODE), if any."""
    value = ((host.metadata.annotations or {}).get(names.HOST_NODE) or "").strip()
    return [value] if value else []


def node_uid_ref(provider_id: str | None) -> str:
    """The host uid a Node's providerID carries ("" if none): to look the host up by."""
    ref = node_provider_ref(provider_id)
    return ref.uid if ref is not None else ""


# ---- OpenShift: a Node names its Machine ------------------------------------------------------


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
    ``status.nodeRef`` names it, or its ``spec.providerID`` is the Node's (both set). The
    annotation alone is the kubelet's word (a kubelet may write its Node's annotations);
    the Machine's spec and status are not."""
    if machine_node_ref and machine_node_ref == node_name:
        return True
    return bool(node_provider_id) and node_provider_id == machine_provider_id
