"""Sharding the hosts between replicas of ``metalmend run`` (docs/sharding.md).

``--simulate`` (pure functions, no cluster; seconds): the assignment of 20,000 hosts
(``--hosts``) by the consistent-hash ring of ``metalmend.policy.sharding`` at 4, 8 and 16
replicas, named as the chart's StatefulSet names its Pods (``metalmend-0`` ...):

- **balance**: the busiest replica's hosts over the mean, as a ratio (``1.07x``); the
  target is at most 1.15x at 4 and 8 replicas;
- **one added**: the share of hosts that move when one replica joins (ideally 1/(N+1);
  every moved host goes to the newcomer);
- **one removed**: the share that moves when one replica leaves (exactly its own hosts);
- the time to build the ring and to assign every host (what a sharder pays at each
  membership change).

The measured part of issue 38 (real replicas, kwok hosts and lab BMCs as
``benchmarks.scale`` uses: CPU per replica, failover p99, hosts served twice) is not
written yet; docs/sharding.md says what stands in for it (the integration tests of
``tests/integration/test_sharding.py``).
"""

from __future__ import annotations

import argparse
import time

from metalmend.policy.sharding import Ring, balance, loads, moves

HOSTS = 20_000
REPLICAS = (4, 8, 16)


def host_keys(count: int) -> list[str]:
    """``namespace/name`` of ``count`` hosts, over 20 namespaces as a site of many
    workload clusters would have them."""
    return [f"cluster-{i % 20:02d}/server-{i:06d}" for i in range(count)]


def replica_names(count: int) -> list[str]:
    return [f"metalmend-{i}" for i in range(count)]


def simulate(hosts: int = HOSTS, replicas: tuple[int, ...] = REPLICAS) -> list[str]:
    keys = host_keys(hosts)
    lines = [f"sharding, simulated: {hosts:,} hosts (metalmend.policy.sharding, pure functions)"]
    header = (
        f"{'replicas':>8}  {'balance':>8}  {'min..max hosts':>15}  {'one added':>16}"
        f"  {'one removed':>16}  {'ring build':>10}  {'assign all':>10}"
    )
    lines.append(header)
    for count in replicas:
        names = replica_names(count)
        began = time.perf_counter()
        ring = Ring.of(names)
        built = time.perf_counter() - began
        began = time.perf_counter()
        counts = loads(ring, keys)
        assigned = time.perf_counter() - began
        grown = Ring.of([*names, f"metalmend-{count}"])
        added = moves(ring, grown, keys)
        assert {new for _, new in added.values()} <= {f"metalmend-{count}"}
        shrunk = Ring.of(names[:-1])
        removed = moves(ring, shrunk, keys)
        assert {old for old, _ in removed.values()} <= {names[-1]}
        lines.append(
            f"{count:>8}  {balance(counts):>7.2f}x  "
            f"{min(counts.values()):>6,}..{max(counts.values()):<6,}  "
            f"{len(added) / hosts:>6.1%} (ideal {1 / (count + 1):>5.1%})"
            f"  {len(removed) / hosts:>6.1%} (ideal {1 / count:>5.1%})"
            f"  {built * 1000:>8.1f}ms  {assigned * 1000:>8.1f}ms"
        )
    for count in replicas:
        ratio = balance(loads(Ring.of(replica_names(count)), keys))
        lines.append(
            f"balance at {count} replicas: the busiest holds {ratio:.2f}x the mean"
            f" of {hosts // count:,} hosts"
        )
    return lines


def main(hosts: int = HOSTS, *, simulate_only: bool = True) -> None:
    for line in simulate(hosts):
        print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=HOSTS, help="hosts to assign")
    parser.add_argument(
        "--simulate", action="store_true",
        help="the assignment by pure functions only (no cluster); the only mode so far",
    )  # fmt: skip
    args = parser.parse_args()
    main(args.hosts, simulate_only=True)
