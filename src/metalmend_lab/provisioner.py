"""The lab's provisioner: what baremetal-operator and Ironic do to a lab host given an image
(``python -m metalmend_lab.provisioner CONFIG KUBECONFIG``, started by ``metalmend lab up``
and restarted when it dies, as ``metalmend run`` is).

It looks at the lab's BareMetalHosts every ``--poll`` seconds. A host that is available
(``available``, or its deprecated name ``ready``: what Drydock's destroy leaves) with
``spec.image`` and ``spec.online: true`` is provisioned, as metal3 does it:

1. ``status.provisioning.state: provisioning`` (its last image cleared), written before
   the drive is touched, so that a restart finds the host mid-provisioning and finishes;
2. the image written onto the host's OS drive (``lab.osdrive``): the drive emptied, then
   the lab's few OS files, ``etc/os-release`` naming the image URL last;
3. ``--delay`` seconds later (an image written, lab-sized), ``provisioned`` with
   ``status.provisioning.image`` the image as given.

Every status write goes to the status subresource, conditional on the resourceVersion it
was decided from (host-power writes the same status): a conflict is decided again at the
next look. A restarted provisioner writes the OS of a host found in ``provisioning`` again
(writing an image twice gives the same disk) and waits the delay from then.

Power is not its business: host-power (``metalmend run``) powers the host as
``spec.online`` says; a host on without an OS sits at its firmware, its kubelet silent,
until the OS is written (``kubeletsim``).

The rules are ``decide``'s (pure); the loop only observes and acts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig

from metalmend.api.resources import BareMetalHost
from metalmend.kube import errors, writes
from metalmend_lab.inventory import HardwareConfig
from metalmend_lab.osdrive import OsDrive

log = logging.getLogger("metalmend_lab.provisioner")

AVAILABLE_STATES = ("available", "ready")  # metal3: "ready" is available's deprecated name
PROVISIONING = "provisioning"
PROVISIONED = "provisioned"
DEFAULT_DELAY = 2.0  # seconds an image takes to write, at lab scale
DEFAULT_POLL = 0.5
COMPONENT = "lab-provisioner"


# ---- the rules (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """A BareMetalHost and its OS drive, as seen in one look."""

    name: str
    state: str  # status.provisioning.state ("" not reported)
    online: bool  # spec.online
    image: Mapping[str, Any] | None  # spec.image (None: none, or without a url)
    installed: str | None  # the image URL the OS drive's OS came from (None: no OS)
    written_for: str | None  # the image this provisioner wrote in this provisioning, if it did
    elapsed: float  # seconds since it wrote it (0 before)

    @property
    def url(self) -> str | None:
        url = self.image.get("url") if self.image else None
        return url if isinstance(url, str) and url else None


@dataclass(frozen=True)
class MarkProvisioning:
    """``status.provisioning.state: provisioning``, the last image cleared."""


@dataclass(frozen=True)
class WriteOs:
    url: str


@dataclass(frozen=True)
class MarkProvisioned:
    image: Mapping[str, Any]


Action = MarkProvisioning | WriteOs | MarkProvisioned


def decide(facts: HostFacts, delay: float) -> Action | None:
    """What to do to one host now (None: nothing, or wait)."""
    url = facts.url
    if facts.state in AVAILABLE_STATES:
        return MarkProvisioning() if facts.online and url else None
    if facts.state != PROVISIONING or url is None or facts.image is None:
        # Not ours to touch; or provisioning with its image taken away: nothing to write
        # until it is given one (baremetal-operator would wait for the spec as well).
        return None
    if facts.written_for != url or facts.installed != url:
        # Not written by this provisioner in this provisioning (a restart, a new image),
        # or the drive lost it since (wiped meanwhile): written (again).
        return WriteOs(url)
    if facts.elapsed >= delay:
        return MarkProvisioned(dict(facts.image))
    return None


# ---- the loop (I/O) ---------------------------------------------------------------------------


@dataclass
class Written:
    url: str
    at: float  # monotonic


class Provisioner:
    def __init__(
        self, config: HardwareConfig, client: AsyncClient, delay: float, status_file: Path
    ) -> None:
        self.lab_dir = Path(config.lab_dir)
        self.hosts = {(h.namespace, h.name) for h in config.hosts}
        self.client = client
        self.delay = delay
        self.status_file = status_file
        self.written: dict[str, Written] = {}  # by host name, for the provisioning under way

    async def round(self) -> None:
        """One look at every lab host, and what ``decide`` says done."""
        report: dict[str, str] = {}
        for namespace in sorted({ns for ns, _ in self.hosts}):
            listed: Any
            async for listed in self.client.list(BareMetalHost, namespace=namespace):
                host, name = listed, str(listed.metadata.name)
                if (namespace, name) not in self.hosts:
                    continue  # not a lab server: it has no drive to write
                facts = self.facts(host)
                report[name] = facts.state
                if facts.state != PROVISIONING:
                    self.written.pop(name, None)  # a later provisioning writes again
                action = decide(facts, self.delay)
                if action is not None:
                    await self.act(host, action)
        self.write_status(report)

    def facts(self, host: Any) -> HostFacts:
        name = str(host.metadata.name)
        spec: Mapping[str, Any] = host.spec or {}
        status: Mapping[str, Any] = host.status or {}
        provisioning = status.get("provisioning")
        state = provisioning.get("state") if isinstance(provisioning, Mapping) else None
        image = spec.get("image")
        written = self.written.get(name)
        return HostFacts(
            name=name,
            state=state if isinstance(state, str) else "",
            online=spec.get("online") is True,
            image=image if isinstance(image, Mapping) else None,
            installed=OsDrive.of(self.lab_dir, name).installed(),
            written_for=written.url if written else None,
            elapsed=time.monotonic() - written.at if written else 0.0,
        )

    async def act(self, host: Any, action: Action) -> None:
        name = str(host.metadata.name)
        match action:
            case MarkProvisioning():
                if await self.set_provisioning(host, {"state": PROVISIONING, "image": None}):
                    log.info("%s: provisioning", name)
            case WriteOs(url=url):
                await asyncio.to_thread(write_os, self.lab_dir, name, url)
                self.written[name] = Written(url, time.monotonic())
                log.info("%s: image %s written on its OS drive", name, url)
            case MarkProvisioned(image=image):
                if await self.set_provisioning(host, {"state": PROVISIONED, "image": image}):
                    self.written.pop(name, None)
                    log.info("%s: provisioned with %s", name, image.get("url"))

    async def set_provisioning(self, host: Any, changes: Mapping[str, Any]) -> bool:
        """``status.provisioning``'s named keys (None removes one), conditional on the
        host's resourceVersion; False when the host changed since (decided again next)."""
        status = dict(host.status or {})
        provisioning = dict(status.get("provisioning") or {})
        for key, value in changes.items():
            if value is None:
                provisioning.pop(key, None)
            else:
                provisioning[key] = value
        status["provisioning"] = provisioning
        try:
            await writes.patch_status(self.client, BareMetalHost, host, status)
        except ApiError as error:
            if errors.is_conflict(error) or errors.is_not_found(error):
                return False
            raise
        return True

    def write_status(self, report: Mapping[str, str]) -> None:
        """What it sees, for tests and people: each host's provisioning state."""
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "hosts": dict(report)}, indent=2))
        tmp.replace(self.status_file)

    async def run(self, poll: float) -> None:
        while True:
            try:
                await self.round()
            except (ApiError, httpx.HTTPError, httpx2.HTTPError, OSError) as error:
                log.warning("provisioner: %s", error)
            await asyncio.sleep(poll)


def write_os(lab_dir: Path, host: str, url: str) -> None:
    """An image written to the OS drive replaces everything on it (the old OS, its
    kubelet's disabled unit, an etcd member's data): emptied first, then the OS."""
    drive = OsDrive.of(lab_dir, host)
    drive.root.mkdir(parents=True, exist_ok=True)
    for child in drive.root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                child.unlink()
    drive.install(url, host)


# ---- the process ------------------------------------------------------------------------------


def status_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "provisioner.json"


def argv(
    config_file: Path, kubeconfig: Path, delay: float, poll: float = DEFAULT_POLL
) -> list[str]:
    return [
        sys.executable, "-m", "metalmend_lab.provisioner", str(config_file), str(kubeconfig),
        "--delay", f"{delay:g}", "--poll", f"{poll:g}",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="metalmend_lab.provisioner")
    parser.add_argument("config", type=Path, help="the lab's hardware config.json")
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("--delay", type=float, default=DEFAULT_DELAY)
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = HardwareConfig.read(args.config)
    client = AsyncClient(KubeConfig.from_file(args.kubeconfig))
    provisioner = Provisioner(config, client, args.delay, status_path(Path(config.lab_dir)))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(provisioner.run(args.poll))


if __name__ == "__main__":
    main()
