"""Remediation overhead: 20 fence-first remediations in the lab, end to end, with the
controllers running as `metalmend run` and real BMCs (sushy-tools Redfish and pyghmi
IPMI). For each: total time from the hang to the remediation object's removal, and
metalmend's own share of it (total minus configured waits — node-monitor grace, health
check timeout, boot delay — minus BMC power changes and kubelet registration; see
metalmend_lab.timeline). p50/p99; target: under 2 s per remediation in total.

Beside it, the same critical path with upstream's polling (from its code: CAPM3's
Metal3Remediation re-checks every 5 s and does not watch hosts; BMO re-reads host power
every 60 s): the expected wait those intervals add, half an interval per poll on the path.
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.shared import wait
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE, fence_health_check
from metalmend_lab.timeline import Recorder, Settings, breakdown, total

REMEDIATIONS = 20
HOSTS = 3
GRACE = 6.0
MHC_TIMEOUT = 2.0
BOOT_DELAY = 1.0
# Upstream polls on the critical path: BMO notices the host off (60 s), CAPM3 notices it
# (5 s), CAPM3 notices the Node back (5 s); BMO notices power on after the key is removed
# at once (it watches its hosts). Expected added wait: half of each interval.
UPSTREAM_EXPECTED = 60 / 2 + 5 / 2 + 5 / 2
UPSTREAM_WORST = 60 + 5 + 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as tmp:
        options = lab.LabOptions(
            lab_dir=Path(tmp) / "lab", node_monitor_grace_period=GRACE, hosts=HOSTS,
            bmc="mixed", boot_delay=BOOT_DELAY,
        )  # fmt: skip
        settings = Settings(GRACE, MHC_TIMEOUT, BOOT_DELAY)
        overheads: list[float] = []
        totals: list[float] = []
        hardware: list[float] = []
        with lab.started(options) as running:
            client = running.client()
            fence_health_check(client, MHC_TIMEOUT, power_off=60, power_on=120)
            assert running.hardware is not None
            hosts = running.hardware.hosts
            for i in range(REMEDIATIONS):
                host = hosts[i % len(hosts)]
                wait(lambda: all(h.ready == "True" for h in lab.status(options.lab_dir).hosts), 120)
                recorder = Recorder(running.kubeconfig, NAMESPACE, host.name).start()
                time.sleep(0.5)  # the watches have listed
                lab.inject_fault(options.lab_dir, host.name, "hang")
                recorder.timeline.mark("hang")
                wait(recorder.timeline.complete, 180)
                timeline = recorder.stop()
                parts = breakdown(timeline, settings)
                overheads.append(parts["metalmend"])
                totals.append(total(timeline))
                hardware.append(parts["hardware"])
                print(
                    f"  {i + 1:2d} {host.name} ({host.bmc:7}) total {totals[-1]:6.2f}s"
                    f"  hardware {parts['hardware']:5.2f}s  metalmend {parts['metalmend']:.3f}s",
                    flush=True,
                )
    print(f"remediation overhead over {REMEDIATIONS} remediations ({HOSTS} hosts, Redfish+IPMI):")
    print(
        f"  metalmend's own share: p50 {statistics.median(overheads):.3f}s"
        f"  p99 {percentile(overheads, 0.99):.3f}s  max {max(overheads):.3f}s  (target < 2 s)"
    )
    print(
        f"  total hang -> object removed: p50 {statistics.median(totals):.2f}s"
        f"  (configured waits ~{GRACE + MHC_TIMEOUT + BOOT_DELAY:g}s + node-monitor period;"
        f" hardware p50 {statistics.median(hardware):.2f}s)"
    )
    print(
        f"  upstream polling on the same path (CAPM3 re-check 5 s, BMO power sync 60 s):"
        f" expected +{UPSTREAM_EXPECTED:.1f}s, worst +{UPSTREAM_WORST:.0f}s per remediation"
        f" -> ratio to ours (p50): {UPSTREAM_EXPECTED / max(statistics.median(overheads), 1e-3):.0f}x"
    )


if __name__ == "__main__":
    main()
