"""Run every benchmark in this directory, one after another."""

from benchmarks import (
    at_rest,
    bmc_poll_cpu,
    body_memory,
    controlplane_start,
    design_store,
    detection_latency,
    drain,
    error_loops,
    etcd_removal,
    fencing_modes,
    healthcheck_eval,
    hostile_bmcs,
    reboot_latency,
    redeploy,
    remediation_overhead,
    runtime,
    scale,
    wake_cost,
)

controlplane_start.main()
healthcheck_eval.main()
runtime.main()
reboot_latency.main()
hostile_bmcs.main()
bmc_poll_cpu.main()
wake_cost.main()
detection_latency.main()
remediation_overhead.main()
fencing_modes.main()
error_loops.main()
at_rest.main()
etcd_removal.main()
drain.main()
design_store.main()
body_memory.main()
scale.main()  # METALMEND_BENCH_SCALE_HOSTS hosts (default 1,000); --hosts 5000 alone
redeploy.main()
