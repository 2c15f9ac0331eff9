"""Run every benchmark in this directory, one after another."""

from benchmarks import (
    controlplane_start,
    detection_latency,
    healthcheck_eval,
    reboot_latency,
    remediation_overhead,
    runtime,
)

controlplane_start.main()
healthcheck_eval.main()
runtime.main()
reboot_latency.main()
detection_latency.main()
remediation_overhead.main()
