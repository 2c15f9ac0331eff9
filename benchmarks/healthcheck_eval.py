"""One MachineHealthCheck evaluation over 5,000 machines and nodes (the pure function),
side by side with merely building the 5,000 targets it reads. Target: under 50 ms.
Prints numbers; asserts nothing."""

from __future__ import annotations

import datetime as dt
import statistics
import time

from metalmend.policy.healthcheck import Check, NodeCondition, Target, UnhealthyCondition, evaluate

NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
TARGETS = 5000


def build() -> list[Target]:
    states = ("True", "True", "True", "Unknown", "False")
    return [
        Target(
            machine=f"ns/m{i:05d}",
            created=NOW - dt.timedelta(hours=2),
            node_ref=f"m{i:05d}" if i % 50 else None,
            node_exists=i % 97 != 0,
            conditions={"Ready": NodeCondition(states[i % 5], NOW - dt.timedelta(seconds=i % 900))},
        )
        for i in range(TARGETS)
    ]


def main(runs: int = 20) -> None:
    check = Check(
        (UnhealthyCondition("Ready", "Unknown", 300), UnhealthyCondition("Ready", "False", 300)),
        max_unhealthy="40%",
    )
    build_times, eval_times = [], []
    for _ in range(runs):
        began = time.perf_counter()
        targets = build()
        build_times.append(time.perf_counter() - began)
        began = time.perf_counter()
        result = evaluate(check, targets, NOW)
        eval_times.append(time.perf_counter() - began)
    b, e = statistics.median(build_times) * 1000, statistics.median(eval_times) * 1000
    print(f"MachineHealthCheck evaluation over {TARGETS} targets, median of {runs} (ms)")
    print(f"  building the targets   {b:7.1f}")
    print(f"  evaluate()             {e:7.1f}   ({e / b:.2f}x building them)")
    verdict = "allowed" if result.allowed else "blocked"
    print(f"  ({result.unhealthy} unhealthy, remediation {verdict})")


if __name__ == "__main__":
    main()
