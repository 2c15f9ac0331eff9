"""redeploy_server in the lab (docs/site-actions.md): where a redeploy's time goes.

The lab of ``make demo-site`` (four Redfish servers, a 3-member site etcd on worker-0..2),
the lab's design deployed, then worker-1 and worker-2 (each an etcd member) redeployed one
after the other with ``preserve-local-storage=true`` through ``metalmend serve``. Per
run, each step's time from Shipyard's API, and the split (``lab.sitetimeline.split``):

- metalmend: the steps that are only metalmend's work and API round trips (preflight,
  design_lookup, validation, remove_from_cluster) and the gaps between steps (the worker
  taking the action, storing each step): our own overhead; target under 2 s;
- configured: the lab's configured waits inside the steps (the kubelet-stopped window,
  the BMCs' power changes, 3 s each: ``demo_site.REDFISH_POWER_DELAY``, the erase time,
  the provisioning and boot delays);
- hardware and Kubernetes: the rest of decommission, destroy and deploy_server (evictions,
  host-power's reads while a power change lands, the kubelet's registration, etcd).

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

from rich.console import Console

from metalmend_lab import demo_site, lab, sitetimeline

TARGETS = ("worker-1", "worker-2")


def main() -> None:
    print("redeploy_server in the lab (4 Redfish servers, 3-member site etcd)")
    quiet = Console(file=io.StringIO())
    with tempfile.TemporaryDirectory() as tmp:
        options = demo_site.lab_options(Path(tmp) / "lab")
        with lab.started(options) as running:
            site = demo_site.Site(running)
            site.wait(lambda: site.ready_nodes() == 4, 120)
            demo_site.deploy_design(site, quiet)
            runs = []
            for target in TARGETS:
                began = time.monotonic()
                runs.append(demo_site.redeploy(site, quiet, target))
                print(f"  {target}: redeployed in {time.monotonic() - began:.1f} s")
    configured = demo_site.configured_waits(options)
    names = [s.name for s in runs[0].steps]
    print(f"  {'step':22}" + "".join(f"{t:>14}" for t in TARGETS))
    for name in names:
        row = []
        for run in runs:
            span = next(s for s in run.steps if s.name == name)
            row.append(f"{span.end - span.start:12.2f} s")
        print(f"  {name:22}" + "".join(row))
    print(f"  {'total':22}" + "".join(f"{r.steps[-1].end:12.2f} s" for r in runs))
    for who in sitetimeline.COLOURS:
        parts = [sitetimeline.split(r.steps, configured)[who] for r in runs]
        print(f"  {who:22}" + "".join(f"{p:12.2f} s" for p in parts))


if __name__ == "__main__":
    main()
