"""Every annotation, label, condition and reason metalmend reads or writes, in one place, so
that a grep finds every user of a name."""

from __future__ import annotations

# Reboot API (seeds 000, 004)
REBOOT = "reboot.metal3.io"  # the suffixless form
REBOOT_PREFIX = "reboot.metal3.io/"  # the keyed form: reboot.metal3.io/{key}

# Linking Machines and hosts (DESIGN.md)
MACHINE_HOST = "metal3.io/BareMetalHost"  # on a Machine: "<namespace>/<host>"

# BareMetalHost provisioning states that honour reboot annotations, and those that mean the
# host was (or is being) deprovisioned, which clears them (seed 000).
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

# MachineHealthCheck (Cluster API v1beta1, seed 002)
SKIP_REMEDIATION = "cluster.x-k8s.io/skip-remediation"
PAUSED = "cluster.x-k8s.io/paused"
NODE_REF_LOST_AT = "metalmend.dev/node-ref-lost-at"  # set by node-link when it clears nodeRef
CONDITION_HEALTH_CHECK_SUCCEEDED = "HealthCheckSucceeded"
CONDITION_OWNER_REMEDIATED = "OwnerRemediated"
CONDITION_REMEDIATION_ALLOWED = "RemediationAllowed"
REASON_TOO_MANY_UNHEALTHY = "TooManyUnhealthy"
REASON_REMEDIATION_REQUESTED = "RemediationRequested"
REASON_REMEDIATION_WITHDRAWN = "RemediationWithdrawn"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_OVERLAPPING = "OverlappingHealthChecks"
REASON_TEMPLATE_NOT_FOUND = "RemediationTemplateNotFound"

# Remediation (seeds 001 and 002)
EXTERNAL_REMEDIATION = "host.metal3.io/external-remediation"  # on a Machine (seed 001)
MACHINE_REMEDIATION_REBOOT = "reboot.metal3.io/machine-remediation"  # seed 001's reboot key
METAL3_REMEDIATION_REBOOT_PREFIX = "reboot.metal3.io/metal3-remediation-"  # + object uid
REMEDIATION_FINALIZER = "remediation.metal3.io"
NODE_LABELS_BACKUP = "remediation.metal3.io/node-labels-backup"  # as CAPM3 names them
NODE_ANNOTATIONS_BACKUP = "remediation.metal3.io/node-annotations-backup"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
# On a MachineHealthCheck: "annotation" requests remediation the seed-001 way.
REQUEST_REMEDIATION_BY = "metalmend.dev/request-remediation-by"
REASON_POWER_OFF_REQUESTED = "PowerOffRequested"
REASON_HOST_POWERED_OFF = "HostPoweredOff"
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
