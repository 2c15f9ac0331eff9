"""What a sleep costs the work after it: the CPU time of one fixed unit of work
(``benchmarks.sharding.canary_unit``: Python objects and calls, JSON, a hash in C, the
kinds a BMC read is made of) done back to back, and done after the thread slept 2, 8,
32, 128 and 500 ms, as a median over many units, side by side and as a ratio to back to
back.

Why: a replica of four at 5,000 hosts did the same BMC reads as a quarter of one replica
alone for 1.3x the CPU, and one replica alone at 1,250 hosts paid more CPU a read than at
5,000 (docs/sharding.md). The profiles had the same shape; what differed was the time a
process slept between two reads (4 ms at 250 reads a second, 16 ms at 62.5). A unit of
work started after a sleep finds the CPU's caches and predictors cold (other processes
ran, or the core idled): this measures how much that costs on the machine at hand, which
is what ``power.poll_batch`` (idle polls read in batches, ``policy.hostpower.poll_grid``)
saves. Run it on an idle machine: other work in the gaps makes the sleeps colder still.

Run: ``python -m benchmarks.wake_cost`` (about a minute and a half; ``--rounds``). Prints
numbers; asserts nothing. Not part of the test suite; ``make bench`` runs it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks.sharding import canary_ms, canary_unit

GAPS_MS = (0.0, 2.0, 8.0, 32.0, 128.0, 500.0)
UNITS = 200  # units per gap and round (fewer for long gaps: UNITS_LONG)
UNITS_LONG = 60  # from 128 ms on
ROUNDS = 2  # every gap once per round, in turn: a drift of the machine shows as a spread


def unit_cpu_ms(gap_ms: float, units: int, unit: Callable[[], None] = canary_unit) -> float:
    """The median CPU time (ms, this thread) of ``units`` runs of ``unit``, each after a
    sleep of ``gap_ms`` (none for 0: back to back)."""
    times = []
    for _ in range(units):
        if gap_ms:
            time.sleep(gap_ms / 1000)
        times.append(canary_ms(unit))
    return statistics.median(times)


def measure(rounds: int = ROUNDS) -> dict[float, list[float]]:
    """Each gap's medians, one per round (rounds interleaved)."""
    medians: dict[float, list[float]] = {gap: [] for gap in GAPS_MS}
    for _ in range(rounds):
        for gap in GAPS_MS:
            medians[gap].append(unit_cpu_ms(gap, UNITS_LONG if gap >= 128 else UNITS))
    return medians


def report(medians: dict[float, list[float]]) -> list[str]:
    """One line per gap: the medians of each round, and their mean over the back-to-back
    mean as a ratio."""
    base = statistics.fmean(medians[0.0])
    lines = ["a fixed unit of work, CPU per unit (median) after a sleep of:"]
    for gap, values in medians.items():
        label = "back to back" if gap == 0 else f"{gap:g} ms"
        rounds = ", ".join(f"{v:.3f}" for v in values)
        lines.append(
            f"  {label:>12}: {rounds} ms ({statistics.fmean(values) / base:.2f}x back to back)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds over every gap")
    args = parser.parse_args(argv)
    for line in report(measure(max(args.rounds, 1))):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
