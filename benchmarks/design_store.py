"""The design store (docs/design-store.md) with a 2,000-document site design, SQLite and
PostgreSQL side by side: the first put, an unchanged put, a put changing 1% of the
documents, the diff of two revisions, reading a revision's documents back, and the
database's size after ten revisions. Both databases durable (SQLite: WAL, synchronous
FULL; PostgreSQL: fsync on), on this machine's disk. Prints numbers; asserts nothing."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from metalmend.db import Database
from metalmend.designs import documents
from metalmend.designs.store import DesignStore

DOCUMENTS = 2000
CHANGED = 20  # 1%
REVISIONS = 10
RUNS = 5


def site(version: int = 0) -> str:
    """2,000 documents of ~1 KB, as a site design has them: hosts, their networks, racks."""
    parts = []
    for i in range(DOCUMENTS):
        changed = version if i < CHANGED else 0
        parts.append(
            f"""---
schema: drydock/BaremetalNode/v1
metadata:
  schema: metadata/Document/v1
  name: node-{i:04d}
  layeringDefinition: {{abstract: false, layer: site}}
  storagePolicy: cleartext
  labels: {{rack: rack-{i // 40:02d}, role: {"control" if i % 50 == 0 else "worker"}}}
data:
  host_profile: worker-{changed}
  addressing:
    - {{network: oob, address: 10.{i // 250}.{i % 250}.10}}
    - {{network: pxe, address: 10.{100 + i // 250}.{i % 250}.10}}
    - {{network: storage, address: 10.{200 + i // 250}.{i % 250}.10}}
  interfaces:
    bond0: {{device_link: data, slaves: [enp94s0f0, enp94s0f1], networks: [calico, storage]}}
  oob: {{type: redfish, network: oob, account: admin, credential: node-{i:04d}-bmc}}
  metadata: {{tags: [workers, rack-{i // 40:02d}], rack: rack-{i // 40:02d}, boot_mac: "52:54:00:{i // 65536:02x}:{i // 256 % 256:02x}:{i % 256:02x}"}}
"""
        )
    return "".join(parts)


def timed(action: Callable[[], object], runs: int = RUNS) -> float:
    """Median wall time of ``action`` in milliseconds."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


Fresh = Callable[[str], tuple[str, Callable[[], int]]]  # name -> (URL, its size in bytes)


def measure(fresh: Fresh) -> dict[str, float]:
    url, _ = fresh("timings")
    db = Database.open(url)
    db.upgrade()
    store = DesignStore(db)
    base = documents.parse(site(0))
    results: dict[str, float] = {}
    firsts = []
    for _ in range(3):
        store.delete_all()  # not timed: the put below meets an empty store
        firsts.append(timed(lambda: store.put("site", base), runs=1))
    results["first put, empty store (ms)"] = statistics.median(firsts)
    results["unchanged put (ms)"] = timed(lambda: store.put("site", base))
    versions = iter(range(1, 1000))
    changed = [documents.parse(site(v)) for v in range(1, RUNS + 1)]
    results["put, 1% changed (ms)"] = timed(lambda: store.put("site", changed[next(versions) - 1]))
    newest = store.newest() or 0
    results["diff (ms)"] = timed(lambda: store.diff(newest - 1, newest))
    results["read revision (ms)"] = timed(lambda: store.entries(newest))
    db.dispose()
    results["size, 10 revisions (MB)"] = ten_revisions(*fresh("size")) / 1e6
    return results


def ten_revisions(url: str, size: Callable[[], int]) -> int:
    """Bytes that the first revision and nine 1% changes add to a new database."""
    db = Database.open(url)
    db.upgrade()
    empty = size()
    store = DesignStore(db)
    for v in range(REVISIONS):
        store.put("site", documents.parse(site(v)))
    db.dispose()
    return size() - empty


def sqlite_size(path: Path) -> Callable[[], int]:
    def size() -> int:
        # The WAL counts: it holds committed pages until a checkpoint copies them back.
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))

    return size


def main() -> None:
    from tests.postgres import PostgresUnavailable, running

    text = site(0)
    began = time.perf_counter()
    parsed = documents.parse(text)
    parse_ms = (time.perf_counter() - began) * 1000
    print(
        f"Design store: {DOCUMENTS} documents ({len(text) / 1e6:.1f} MB of YAML), median of {RUNS} (3 for the first put)"
    )
    print(
        f"  parsing and checking the YAML (no database, part of every put request): {parse_ms:.0f} ms"
    )
    columns: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:

        def sqlite_file(name: str) -> tuple[str, Callable[[], int]]:
            path = Path(scratch) / f"{name}.sqlite"
            return f"sqlite:///{path}", sqlite_size(path)

        columns["SQLite"] = measure(sqlite_file)
    try:
        with running(durable=True) as server:

            def database(name: str) -> tuple[str, Callable[[], int]]:
                return server.create_database(name), lambda: server.database_size(name)

            columns["PostgreSQL"] = measure(database)
    except PostgresUnavailable as error:
        print(f"  PostgreSQL skipped: {error}")
    names = list(columns)
    print(f"  {'':28}" + "".join(f"{n:>12}" for n in names))
    for row in next(iter(columns.values())):
        print(f"  {row:28}" + "".join(f"{columns[n][row]:12.1f}" for n in names))
    print(
        f"  (YAML of one revision: {len(text) / 1e6:.1f} MB; documents kept once per content; {len(parsed)} parsed; {os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
