"""Every annotation, label, condition and reason metalmend reads or writes, in one place, so
that a grep finds every user of a name."""

from __future__ import annotations

# Reboot API (metal3's reboot interface design, and the reboot annotation page of its user guide)
REBOOT = "reboot.metal3.io"  # the suffixless form
REBOOT_PREFIX = "reboot.metal3.io/"  # the keyed form: reboot.metal3.io/{key}

# Linking Machines and hosts (docs/design.md, interfaces)
MACHINE_HOST = "metal3.io/BareMetalHost"  # on a Machine: "<namespace>/<host>"
# Tenancy (api/links.py, docs/security.md): conditions on a Machine whose link is refused
CONDITION_HOST_LINK = "HostLinkValid"  # metal3.io/BareMetalHost: own namespace only
CONDITION_NODE_LINK = "NodeLinkValid"  # node-link: a Node only through a confirmed host
CONDITION_NODE_FENCING = "NodeFencingAllowed"  # machine-remediation: the Node is its host's

# BareMetalHost provisioning states that honour reboot annotations, and those that mean the
# host was (or is being) deprovisioned, which clears them (metal3's reboot interface design).
PROVISIONED = "provisioned"
EXTERNALLY_PROVISIONED = "externally provisioned"
DEPROVISIONED_STATES = frozenset({"deprovisioning", "available", "ready"})

# Event reasons of the host power controller
REASON_POWER_ON = "PowerOn"
REASON_POWER_OFF = "PowerOff"
REASON_POWERED_ON = "PoweredOn"
REASON_POWERED_OFF = "PoweredOff"
REASON_REBOOT_REQUESTED = "RebootRequested"
REASON_REBOOT_COMPLETED = "RebootCompleted"
REASON_REBOOT_IGNORED = "RebootIgnored"
REASON_REBOOT_CLEARED = "RebootAnnotationsRemoved"
REASON_INVALID_REBOOT = "InvalidRebootAnnotation"
REASON_SOFT_TIMEOUT = "SoftPowerOffTimedOut"
REASON_BMC_ERROR = "BMCError"
REASON_BMC_RECOVERED = "BMCRecovered"
REASON_BMC_WAITING = "WaitingForBMC"  # the host's BMC endpoint serves other namespaces' calls
REASON_WRITE_REFUSED = "WriteRefused"  # the API server refused one of our writes

# MachineHealthCheck (Cluster API v1beta1, its machine health checking proposal)
SKIP_REMEDIATION = "cluster.x-k8s.io/skip-remediation"
PAUSED = "cluster.x-k8s.io/paused"
REMEDIATE_MACHINE = "cluster.x-k8s.io/remediate-machine"  # a manual remediation request
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"  # a Machine's cluster
CONDITION_HEALTH_CHECK_SUCCEEDED = "HealthCheckSucceeded"
CONDITION_OWNER_REMEDIATED = "OwnerRemediated"
CONDITION_REMEDIATION_ALLOWED = "RemediationAllowed"
REASON_TOO_MANY_UNHEALTHY = "TooManyUnhealthy"
REASON_REMEDIATION_REQUESTED = "RemediationRequested"
REASON_REMEDIATION_WITHDRAWN = "RemediationWithdrawn"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_OVERLAPPING = "OverlappingHealthChecks"
REASON_TEMPLATE_NOT_FOUND = "RemediationTemplateNotFound"

# Remediation (metal3's annotation-based remediation and remediation controller designs)
# On a Machine: the request of the annotation-based flow
EXTERNAL_REMEDIATION = "host.metal3.io/external-remediation"
MACHINE_REMEDIATION_REBOOT = "reboot.metal3.io/machine-remediation"  # and its reboot key
# On a Machine: when machine-remediation ended its last remediation (removed the request),
# an api/stamps.py stamp; the health check gives the server nodeStartupTimeout from then to
# register its Node again (docs/healthcheck.md). Tenant-writable: read as absent if bad.
REMEDIATION_ENDED_AT = "metalmend.dev/remediation-ended-at"
# Set on a BareMetalHost (value: the escalating Metal3Remediation's reboot key) before an
# escalation deletes the host's Machine, conditionally on the host's version; a teardown
# will not claim the host while it is there (docs/design.md, invariant 7).
ESCALATING = "metalmend.dev/escalating"
METAL3_REMEDIATION_REBOOT_PREFIX = "reboot.metal3.io/metal3-remediation-"  # + object uid
REMEDIATION_FINALIZER = "remediation.metal3.io"
# The external remediation contract of medik8s NodeHealthCheck (FenceRemediation objects)
NHC_NODE_NAME = "remediation.medik8s.io/node-name"
NHC_TIMED_OUT = "remediation.medik8s.io/nhc-timed-out"
NHC_TEMPLATE_NAME = "remediation.medik8s.io/template-name"
# NodeHealthCheck's healthyDelay: on a remediation object, when its Node was first seen
# healthy again (RFC 3339); on a Node, set by an operator: healthy now, skip the delay.
NHC_HEALTHY_DELAY = "remediation.medik8s.io/healthy-delay"
NHC_CONFIRMED_HEALTHY = "remediation.medik8s.io/manually-confirmed-healthy"
NODE_LABELS_BACKUP = "remediation.metal3.io/node-labels-backup"  # as CAPM3 names them
NODE_ANNOTATIONS_BACKUP = "remediation.metal3.io/node-annotations-backup"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# On a MachineHealthCheck: "annotation" requests remediation the annotation-based way.
REQUEST_REMEDIATION_BY = "metalmend.dev/request-remediation-by"
REASON_POWER_OFF_REQUESTED = "PowerOffRequested"
REASON_HOST_POWERED_OFF = "HostPoweredOff"
REASON_HOST_CONFIRMED_OFF = "HostConfirmedOff"  # our own BMC reads agreed (taint strategy)
REASON_NODE_FENCED = "NodeFenced"
REASON_POWER_ON_REQUESTED = "PowerOnRequested"
REASON_NODE_BACK = "NodeReady"
REASON_NODE_RESTORED = "NodeLabelsRestored"
REASON_ATTEMPT_FAILED = "RemediationAttemptFailed"
REASON_DELETING_MACHINE = "DeletingMachine"
REASON_HOST_HELD_OFF = "HostHeldOff"
REASON_WAITING_FOR_HOST = "HostBusy"
REASON_CANNOT_REMEDIATE = "CannotRemediate"
REASON_RELEASED = "RemediationReleased"
REASON_BACKUP_LOST = "NodeLabelsNotRestored"
REASON_MACHINE_REMEDIATION = "MachineRemediation"

# NodeHealthCheck (healthcheck.metalmend.dev; docs/healthcheck.md, "NodeHealthCheck")
# On a Node: "<namespace>/<host>", the Node's own word on its BareMetalHost. Its kubelet
# may write it (NodeRestriction lets a kubelet annotate its own Node), so it proves nothing:
# read only to say what is missing (api/links.py, "a Node without a Machine").
NODE_HOST = "metalmend.dev/baremetalhost"
# On a BareMetalHost: the name of the Node that runs on it. The host's confirmation of its
# Node (a kubelet cannot write hosts): what a NodeHealthCheck needs to fence a Node whose
# providerID does not carry the host's uid.
HOST_NODE = "metalmend.dev/node-name"
# The admission policy (and its binding) that names who may write HOST_NODE
# (deploy/policies/node-name-writers.yaml): the host's word is trusted only while it is in
# force (api/links.node_host).
NODE_NAME_POLICY = "metalmend-node-name-writers"
# On a Node, by OpenShift's nodelink-controller: "<namespace>/<machine>", its
# machine.openshift.io Machine (kubelet-writable: trusted only when the Machine names the Node
# back, api/links.py node_machine_confirmed).
OPENSHIFT_NODE_MACHINE = "machine.openshift.io/machine"
# On a Metal3Remediation the NodeHealthCheck made: the Node it remediates (no Machine).
REMEDIATED_NODE = "metalmend.dev/node"
# On the same: the NodeHealthCheck that made it (a label, to list them).
NODE_HEALTH_CHECK_LABEL = "metalmend.dev/node-health-check"

# Sharding (docs/sharding.md). On a BareMetalHost: the replica of `metalmend run` that owns
# it (written by the leader, removed by that replica when it lets the host go), and the
# leader's request that the owner let it go (removed with the owner label). On each
# replica's Lease: the ring it belongs to (the leader Lease's name) and the replica's name.
SHARD_REPLICA_LABEL = "shard.metalmend.dev/replica"
SHARD_DRAIN_LABEL = "shard.metalmend.dev/drain"
SHARD_RING_LABEL = "shard.metalmend.dev/ring"
