"""remove-etcd against the lab's real site etcd (three upstream etcd members on three lab
hosts): how long metalmend takes, from fetching the design to the member being out,

- to remove a follower (3 -> 2 members),
- to answer a retried removal (the member already gone),
- to remove the leader (2 -> 1: leadership handed over first, then the removal),
- and to answer the health of the cluster (the health endpoint's work).

Each removal is what ``POST /nodes/{node}/remove-etcd`` does after authorization: fetch
the design (http, from the lab's design server), observe (member list, every member's
/health, the leader), decide, act, observe again. The lab's design is rewritten with a
threshold of 1 so that two removals are allowed, and each removal starts 6 s after the
members last (re)connected: etcd itself refuses membership changes for 5 s after that
(``--strict-reconfig-check``), which would be etcd's wait, not metalmend's. Prints
numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import ssl
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from metalmend.teardown.etcd import design, members
from metalmend_lab import lab, siteetcd

RETRIES = 20
HEALTH = 20


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {ms(statistics.median(values))}  p99 {ms(q[98])}  max {ms(max(values))}"


async def timed_removal(
    url: str, node: str, http: httpx.AsyncClient
) -> tuple[float, list[members.Outcome]]:
    began = time.perf_counter()
    outcomes = await members.remove_member(await design.load(url, http=http), node, timeout=60)
    return time.perf_counter() - began, outcomes


def leader(site: siteetcd.SitePlan) -> str:
    for m in site.members:
        try:
            listed = httpx.post(f"{m.client_url}/v3/cluster/member/list", json={}, timeout=3)
            status = httpx.post(f"{m.client_url}/v3/maintenance/status", json={}, timeout=3)
        except httpx.HTTPError:
            continue
        names = {x["ID"]: x.get("name", "") for x in listed.json()["members"]}
        return str(names[status.json()["leader"]])
    raise RuntimeError("no leader")


async def run(running: lab.RunningLab, site: siteetcd.SitePlan) -> None:
    url = running.state.design_ref  # the lab's https design server (the lab's CA)
    http = httpx.AsyncClient(
        verify=ssl.create_default_context(cafile=str(running.plane.ca.pair.cert))
    )
    text = siteetcd.design_documents(site).replace("healthy_members: 2", "healthy_members: 1")
    siteetcd.design_path(running.plane.workdir.parent).write_text(text)
    health = []
    for _ in range(HEALTH):
        began = time.perf_counter()
        report = await members.cluster_health(await design.load(url, http=http))
        health.append(time.perf_counter() - began)
        assert report[0].state is members.State.HEALTHY, report
    await asyncio.sleep(6)  # etcd refuses reconfiguration for 5 s after a peer (re)connects
    first = leader(site)
    follower = next(m.host for m in site.members if m.host != first)
    took, outcomes = await timed_removal(url, follower, http)
    assert [o.result for o in outcomes] == [members.Result.REMOVED], outcomes
    waits = sum(1 for line in outcomes[0].lines if line.startswith("etcd asked to wait"))
    retried = []
    for _ in range(RETRIES):
        again, outcomes = await timed_removal(url, follower, http)
        assert [o.result for o in outcomes] == [members.Result.ALREADY_GONE], outcomes
        retried.append(again)
    await asyncio.sleep(6)
    node = leader(site)
    handed, outcomes = await timed_removal(url, node, http)
    assert [o.result for o in outcomes] == [members.Result.REMOVED], outcomes
    print("remove-etcd against the lab's 3-member etcd (design fetch included)")
    print(f"  remove a follower (3 -> 2)            {ms(took)}   (etcd asked to wait {waits}x)")
    print(f"  remove the leader (2 -> 1, hand-over) {ms(handed)}   ({outcomes[0].lines[0]})")
    print(f"  retried removal, already gone ({RETRIES:>2}x)   {spread(retried)}")
    print(f"  cluster health ({HEALTH}x)                 {spread(health)}")
    await http.aclose()


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-etcd-") as tmp:
        options = lab.LabOptions(
            lab_dir=Path(tmp), hosts=3, bmc="ipmi", boot_delay=0.5, controllers="", serve=False
        )
        with lab.started(options) as running:
            site = siteetcd.SitePlan.read(siteetcd.plan_path(Path(tmp)))
            assert site is not None
            asyncio.run(run(running, site))


if __name__ == "__main__":
    main()
