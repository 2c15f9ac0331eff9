"""CPU of one routine power read, for the ways a client can reach a Redfish BMC.

At rest, metalmend's CPU is its routine power reads (docs/scale.md, fixes 9, 13 and 14):
each is a new TCP and TLS connection, because the pool hangs up after a routine poll and
real BMCs close idle connections long before the next one. This benchmark puts numbers on
the alternatives, side by side in one process and one run, against the scale lab's BMC
server (``metalmend_lab.scalebmc``: real Redfish over TLS, basic authentication, one port
per system):

- **pool**: ``BmcPool.power_state(background=True)``, what host-power does (the driver, its
  deadline, the pool's slots, and the hang-up after the read);
- **new connection**: a bare ``httpx.AsyncClient`` GET with ``Connection: close``, the same
  TCP and TLS connection per read without metalmend's code around it;
- **TLS resumed**: the same, with the TLS session of the last connection to that BMC handed
  to the next (a context whose ``wrap_bio`` sets it): no certificate check, a shorter
  handshake;
- **keep-alive**: one connection per BMC kept open across reads (what real BMCs do not
  allow for 20 s).

Printed: CPU (user + system, this process; the BMC server is another process) per read,
and each variant's ratio to **pool**. ``METALMEND_BENCH_POLL_SYSTEMS`` (default 200) and
``METALMEND_BENCH_POLL_ROUNDS`` (default 5) set the size.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.controlplane import LOOPBACK
from metalmend_lab.pki import CertificateAuthority

SYSTEMS = int(os.environ.get("METALMEND_BENCH_POLL_SYSTEMS", "200"))
ROUNDS = int(os.environ.get("METALMEND_BENCH_POLL_ROUNDS", "5"))
STARTUP = 120.0  # seconds for the BMC server to listen on every port

# The TLS session slot of the BMC a request is for (TLS resumed).
_SLOT: contextvars.ContextVar[Slot] = contextvars.ContextVar("tls_session_slot")


class Slot:
    session: ssl.SSLSession | None = None
    ssl_object: ssl.SSLObject | None = None
    resumed = 0


class ResumingContext(ssl.SSLContext):
    """Hands the TLS session of the BMC's last connection to its next one."""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        slot = _SLOT.get(None)
        if slot is not None:
            session = slot.session
        obj = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if slot is not None:
            slot.ssl_object = obj
        return obj


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any], Path]:
    ca = CertificateAuthority(workdir / "pki")
    serving = ca.issue("bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    config = {
        "cert": str(serving.cert), "key": str(serving.key),
        "ports_file": str(workdir / "ports.json"), "journal_dir": str(workdir), "journal": [],
        "systems": [{"id": f"sys-{i}", "host": f"host-{i}", "username": f"u{i}",
                     "password": f"p{i}"} for i in range(SYSTEMS)],
    }  # fmt: skip
    (workdir / "config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(workdir / "config.json")]
    process = subprocess.Popen(argv)
    deadline = time.monotonic() + STARTUP
    while not (workdir / "ports.json").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(
                f"the BMC server did not write {workdir / 'ports.json'} within {STARTUP:g}s"
                f" (exit code {process.poll()})"
            )
        time.sleep(0.1)
    return process, json.loads((workdir / "ports.json").read_text()), ca.pair.cert


async def per_read(read: Callable[[int], Awaitable[None]]) -> float:
    """CPU seconds per read: every system once to warm up, then ROUNDS rounds."""
    for i in range(SYSTEMS):
        await read(i)
    gc.collect()
    start = time.process_time()
    for _ in range(ROUNDS):
        for i in range(SYSTEMS):
            await read(i)
    return (time.process_time() - start) / (ROUNDS * SYSTEMS)


async def measure(ports: dict[str, Any], ca: Path) -> dict[str, float]:
    def url(i: int) -> str:
        return f"https://{LOOPBACK}:{ports['systems'][f'sys-{i}']}/redfish/v1/Systems/sys-{i}"

    results: dict[str, float] = {}

    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(ca)))
    targets = [
        BmcTarget(parse(url(i).replace("https://", "redfish://")), Credentials(f"u{i}", f"p{i}"))
        for i in range(SYSTEMS)
    ]

    async def pooled(i: int) -> None:
        await pool.power_state(targets[i], background=True)

    try:
        results["pool (what host-power does)"] = await per_read(pooled)
    finally:
        await pool.close()

    plain = ssl.create_default_context(cafile=str(ca))
    resuming = ResumingContext(ssl.PROTOCOL_TLS_CLIENT)
    resuming.load_verify_locations(str(ca))
    slots = [Slot() for _ in range(SYSTEMS)]

    def bare(context: ssl.SSLContext, *, close: bool, resume: bool) -> Callable[[int], Any]:
        clients: dict[int, httpx.AsyncClient] = {}

        async def read(i: int) -> None:
            client = clients.get(i)
            if client is None:
                client = clients[i] = httpx.AsyncClient(
                    verify=context, trust_env=False,
                    limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                )  # fmt: skip
            if resume:
                _SLOT.set(slots[i])
            headers = {"Connection": "close"} if close else {}
            answer = await client.get(url(i), auth=(f"u{i}", f"p{i}"), headers=headers)
            if answer.status_code != 200:
                raise SystemExit(f"{url(i)} answered {answer.status_code}")
            tls = slots[i].ssl_object
            if resume and tls is not None:
                slots[i].resumed += tls.session_reused
                slots[i].session = tls.session

        read.clients = clients  # type: ignore[attr-defined]
        return read

    variants = {
        "new connection (httpx alone)": bare(plain, close=True, resume=False),
        "new connection, TLS resumed": bare(resuming, close=True, resume=True),
        "keep-alive across reads": bare(plain, close=False, resume=False),
    }
    for name, read in variants.items():
        try:
            results[name] = await per_read(read)
        finally:
            for client in read.clients.values():  # type: ignore[attr-defined]
                await client.aclose()
    resumed = sum(s.resumed for s in slots)
    print(f"  TLS sessions resumed: {resumed} of {ROUNDS * SYSTEMS} possible")
    return results


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-poll-") as tmp:
        process, ports, ca = start_server(Path(tmp))
        try:
            print(f"CPU per routine power read: {SYSTEMS} Redfish BMCs, {ROUNDS} rounds each")
            results = asyncio.run(measure(ports, ca))
        finally:
            process.terminate()
            process.wait(30)
    base = results["pool (what host-power does)"]
    for name, seconds in results.items():
        print(f"  {name:34} {seconds * 1000:7.3f} ms   {seconds / base:5.2f}x of pool")
    print(f"  at 250 reads a second (5,000 hosts every 20 s), pool: {base * 250 * 100:.0f} %"
          f" of a core; at the default budget, 150 a second: {base * 150 * 100:.0f} %")  # fmt: skip


if __name__ == "__main__":
    main()
