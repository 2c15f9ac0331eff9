"""Run every benchmark in this directory, one after another."""

from benchmarks import controlplane_start, reboot_latency, runtime

controlplane_start.main()
runtime.main()
reboot_latency.main()
