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
