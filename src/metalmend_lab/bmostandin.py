"""A stand-in for metal3's baremetal-operator (BMO) in the lab, on exactly the points that
fencing beside BMO relies on (``python -m metalmend_lab.bmostandin CONFIG KUBECONFIG``,
started by ``metalmend lab up --power-owner bmo-stand-in`` and restarted when it dies, as
``metalmend run`` is).

It is NOT baremetal-operator: BMO's Go module cannot be built here, so this process plays
BMO and the Ironic behind it for the lab's hosts, following upstream's code
(github.com/metal3-io/baremetal-operator, ``controllers/metal3.io/baremetalhost_controller.go``:
``manageHostPower``, ``hasRebootAnnotation``; ``pkg/provisioner/ironic/ironic.go``:
``PowerOn``, ``PowerOff``, ``changePower``):

- **It owns power.** It drives the lab's real BMCs (Redfish and IPMI) itself, through the
  fault lines, with an account of its own on each BMC (``bmo-<host>``), so the BMC's
  journal (``hardware/<host>.clients``) tells its commands from anyone else's. (Real BMO
  uses the account of the host's ``spec.bmc.credentialsName``; a separate account changes
  nothing that fencing looks at.)
- **status.poweredOn is a cached value.** Its "Ironic" reads each server's power from the
  BMC every ``--refresh`` seconds (Ironic's ``sync_power_state_interval``, 60 s by
  default) and after each power change it makes; each reconcile compares that cached
  reading with ``status.poweredOn`` and writes the status *only when it differs*
  (``hwState.PoweredOn != status.PoweredOn``), nothing else in that reconcile. A host is
  reconciled on every change of its BareMetalHost (the watch), every ``--refresh``
  seconds (BMO's steady-state requeue, 60 s), and every ``--power-requeue`` seconds while
  a power change it asked for is under way (the Ironic provisioner's
  ``powerRequeueDelay``, 10 s): so its own power-off shows in the status within about
  10 s of landing, while a change it did not make (a button, another tool) shows only at
  the next refresh. Upstream's two 60 s timers are independent, so there its status can
  lag such a change by up to about two minutes; here by about one period.
- **No timestamps.** It writes ``poweredOn``, ``operationalStatus``, ``errorType``,
  ``errorMessage`` and ``errorCount`` only: no time, no per-request acknowledgement.
- **Reboot annotations.** ``reboot.metal3.io`` and every ``reboot.metal3.io/<key>`` ask for
  the host off while any is present (value ``{"mode": "hard"}`` or ``"soft"``, soft when
  empty or unparsable; any hard wins); the host is powered back on, if ``spec.online``,
  once all are removed. The suffixless one is removed by the stand-in once the status says
  off. On a host that is not provisioned only annotations with ``"force": true`` count.
- **spec.online** is the power wanted when no reboot annotation is present.
- **Soft power-off** is a graceful shutdown with a deadline (``--soft-timeout``); when it
  runs out, the failure is recorded (``errorType: power management error``,
  ``errorCount`` + 1) and the next attempt is hard, as upstream does.
- **spec.disablePowerOff**: Ironic reboots such a host instead of powering it off; the
  stand-in does that (once per set of reboot annotations), and the host never reads off.

What it leaves out: registration, inspection, provisioning (the lab's provisioner does
that), firmware, RAID, servicing, data images, detached hosts, BMC event subscriptions,
finalizers and deletion. The rules are ``decide``'s (pure); the loop only observes and acts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig

from metalmend.api.power import PowerState
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import BmcError, BmcPool, BmcSettings, BmcTarget, Credentials, parse
from metalmend.kube import errors, writes
from metalmend_lab.inventory import HardwareConfig, HostSpec

log = logging.getLogger("metalmend_lab.bmostandin")

COMPONENT = "bmo-stand-in"
DEFAULT_REFRESH = 60.0  # seconds: Ironic's power sync and BMO's steady-state requeue
DEFAULT_POWER_REQUEUE = 10.0  # seconds between reconciles while a change is under way
DEFAULT_SOFT_TIMEOUT = 10.0  # seconds a graceful shutdown gets (lab-sized)
CHANGE_TIMEOUT = 30.0  # seconds a power change may take to show (Ironic: 60 by default)
CHANGE_POLL = 0.5  # seconds between the reads that wait for a change to show
REBOOT = "reboot.metal3.io"
REBOOT_PREFIX = "reboot.metal3.io/"
POWER_ERROR = "power management error"  # metal3's PowerManagementError
PROVISIONED_STATES = ("provisioned", "externally provisioned")


def account(host: str) -> str:
    """The stand-in's user name on ``host``'s BMC (an IPMI name fits in 16 bytes)."""
    return f"bmo-{host}"


# ---- the rules (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class IronicNode:
    """What the stand-in's "Ironic" knows of one server."""

    power_on: bool | None = None  # the last BMC reading (None: not read yet)
    target: str | None = None  # a change under way: "on", "soft off", "hard off", "reboot"
    last_error: str = ""  # the last change failed (a soft power-off that timed out)
    rebooted_for: tuple[str, ...] = ()  # disablePowerOff: the annotations rebooted for


@dataclass(frozen=True)
class Facts:
    """One BareMetalHost as observed, and its server as "Ironic" knows it."""

    status_on: bool  # status.poweredOn
    online: bool  # spec.online
    state: str  # status.provisioning.state
    annotations: Mapping[str, str]
    disable_power_off: bool
    error_type: str
    error_count: int
    node: IronicNode


@dataclass(frozen=True)
class SetPoweredOn:
    """``status.poweredOn`` from the cached reading (the only thing written then)."""

    on: bool
    clear_error: bool  # a power management error is cleared with it (upstream)


@dataclass(frozen=True)
class RemoveSuffixless:
    """The suffixless ``reboot.metal3.io`` is done once the host is reported off."""


@dataclass(frozen=True)
class ChangePower:
    target: str  # "on", "soft off", "hard off", "reboot"


@dataclass(frozen=True)
class RecordFailure:
    message: str


@dataclass(frozen=True)
class Wait:
    """Nothing to do now: look again at the next change, or after ``changing`` (a power
    change under way: soon) or the steady-state period."""

    changing: bool = False


Action = SetPoweredOn | RemoveSuffixless | ChangePower | RecordFailure | Wait


def reboot_mode(value: str) -> tuple[str, bool]:
    """An annotation's (mode, force): soft unless it says hard; unparsable is soft."""
    try:
        args = json.loads(value) if value else {}
    except ValueError:
        return "soft", False
    if not isinstance(args, dict):
        return "soft", False
    return ("hard" if args.get("mode") == "hard" else "soft"), args.get("force") is True


def is_reboot_annotation(key: str) -> bool:
    return key == REBOOT or key.startswith(REBOOT_PREFIX)


def reboot_requested(annotations: Mapping[str, str], expect_force: bool) -> tuple[bool, str]:
    """Upstream's ``hasRebootAnnotation``: whether any reboot annotation asks for the host
    off, and the mode (hard if any asks hard)."""
    requested, mode = False, "soft"
    for key, value in annotations.items():
        if not is_reboot_annotation(key):
            continue
        asked, force = reboot_mode(value)
        if expect_force and not force:
            continue
        requested = True
        if asked == "hard":
            mode = "hard"
    return requested, mode


def reboot_keys(annotations: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(sorted(k for k in annotations if is_reboot_annotation(k)))


def decide(facts: Facts) -> Action:
    """One reconcile of one host, in the order of upstream's ``manageHostPower``."""
    node = facts.node
    if node.power_on is None:
        return Wait(changing=True)  # "Ironic" has not read the server yet
    # 1. the cached reading differs from the status: write it, and nothing else
    if node.power_on != facts.status_on:
        return SetPoweredOn(node.power_on, clear_error=facts.error_type == POWER_ERROR)
    # 2. the suffixless annotation is done once the host is reported off
    if not facts.status_on and REBOOT in facts.annotations:
        return RemoveSuffixless()
    provisioned = facts.state in PROVISIONED_STATES
    reboot, mode = reboot_requested(facts.annotations, expect_force=not provisioned)
    desired = facts.online and not reboot
    if facts.status_on == desired:
        return Wait(changing=node.target is not None)
    force = facts.error_type == POWER_ERROR
    if desired:
        if node.target == "on":
            return Wait(changing=True)
        return ChangePower("on")
    if facts.disable_power_off:
        # Ironic reboots instead of powering off; the host stays on.
        if node.target is not None or node.rebooted_for == reboot_keys(facts.annotations):
            return Wait(changing=node.target is not None)
        return ChangePower("reboot")
    if node.target in ("soft off", "hard off"):
        return Wait(changing=True)
    if node.last_error and not force:
        return RecordFailure(node.last_error)
    if facts.error_count > 0:
        mode = "hard"
    return ChangePower("soft off" if mode == "soft" and not force else "hard off")


# ---- the loop (I/O) ---------------------------------------------------------------------------


def facts_of(host: Any, node: IronicNode) -> Facts:
    spec: Mapping[str, Any] = host.spec or {}
    status: Mapping[str, Any] = host.status or {}
    provisioning = status.get("provisioning")
    state = provisioning.get("state") if isinstance(provisioning, Mapping) else None
    return Facts(
        status_on=status.get("poweredOn") is True,
        online=spec.get("online") is True,
        state=state if isinstance(state, str) else "",
        annotations=dict(host.metadata.annotations or {}),
        disable_power_off=spec.get("disablePowerOff") is True,
        error_type=str(status.get("errorType") or ""),
        error_count=int(status.get("errorCount") or 0),
        node=node,
    )


class StandIn:
    def __init__(
        self,
        config: HardwareConfig,
        client: AsyncClient,
        *,
        refresh: float = DEFAULT_REFRESH,
        power_requeue: float = DEFAULT_POWER_REQUEUE,
        soft_timeout: float = DEFAULT_SOFT_TIMEOUT,
    ) -> None:
        self.specs = {h.name: h for h in config.hosts}
        self.client = client
        self.refresh = refresh
        self.power_requeue = power_requeue
        self.soft_timeout = soft_timeout
        self.pool = BmcPool(BmcSettings(timeout=5.0, ca_bundle=config.ca_file or None))
        self.nodes = {name: IronicNode() for name in self.specs}
        self.wake = {name: asyncio.Event() for name in self.specs}
        self.changes: dict[str, asyncio.Task[None]] = {}

    def target(self, spec: HostSpec) -> BmcTarget:
        creds = Credentials(account(spec.name), spec.standin_password)
        return BmcTarget(parse(spec.address), creds, namespace=spec.namespace)

    async def read(self, name: str) -> None:
        """Ironic's power sync: the server's power from its BMC."""
        try:
            state = await self.pool.power_state(self.target(self.specs[name]))
        except BmcError as error:
            log.warning("%s: cannot read power: %s", name, error)
            return
        self.nodes[name] = replace(self.nodes[name], power_on=state == PowerState.ON)

    async def change(self, name: str, target: str, keys: tuple[str, ...]) -> None:
        """Ironic's conductor: send the command, then read until it shows (or fails)."""
        bmc = self.target(self.specs[name])
        want_on = target in ("on", "reboot")
        timeout = self.soft_timeout if target == "soft off" else CHANGE_TIMEOUT
        error = ""
        try:
            log.info("%s: power %s", name, target)
            if target == "on":
                await self.pool.power_on(bmc)
            elif target == "reboot":
                await self.pool.power_off(bmc, hard=True)
                await self._until(bmc, on=False, within=CHANGE_TIMEOUT)
                await self.pool.power_on(bmc)
            else:
                await self.pool.power_off(bmc, hard=target == "hard off")
            if not await self._until(bmc, on=want_on, within=timeout):
                error = f"timed out after {timeout:g}s waiting for power {target}"
        except BmcError as failure:
            error = f"power {target} failed: {failure}"
        node = self.nodes[name]
        rebooted = keys if target == "reboot" and not error else node.rebooted_for
        self.nodes[name] = replace(node, target=None, last_error=error, rebooted_for=rebooted)
        if error:
            log.warning("%s: %s", name, error)
        # Ironic records the power it reached; BMO sees it at its next reconcile (a
        # change of the host, or power_requeue later): nothing wakes it from here.
        await self.read(name)

    async def _until(self, bmc: BmcTarget, *, on: bool, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with contextlib.suppress(BmcError):
                if (await self.pool.power_state(bmc) == PowerState.ON) == on:
                    return True
            await asyncio.sleep(CHANGE_POLL)
        return False

    async def reconcile(self, name: str) -> bool:
        """One reconcile; True when a change is under way (look again soon)."""
        spec = self.specs[name]
        host: Any = await self.client.get(BareMetalHost, name, namespace=spec.namespace)
        facts = facts_of(host, self.nodes[name])
        action = decide(facts)
        match action:
            case SetPoweredOn(on=on, clear_error=clear):
                status = dict(host.status or {})
                status["poweredOn"] = on
                if clear:
                    status.update(operationalStatus="OK", errorType=None, errorMessage="")
                await writes.patch_status(self.client, BareMetalHost, host, status)
                log.info("%s: status.poweredOn %s", name, on)
                return False
            case RemoveSuffixless():
                await writes.patch_annotations(
                    self.client, BareMetalHost, host, {REBOOT: None}, require_version=True
                )
                return False
            case RecordFailure(message=message):
                status = dict(host.status or {})
                status.update(
                    operationalStatus="error", errorType=POWER_ERROR, errorMessage=message,
                    errorCount=facts.error_count + 1,
                )  # fmt: skip
                await writes.patch_status(self.client, BareMetalHost, host, status)
                self.nodes[name] = replace(self.nodes[name], last_error="")
                return True
            case ChangePower(target=target):
                if name not in self.changes or self.changes[name].done():
                    keys = reboot_keys(facts.annotations)
                    self.nodes[name] = replace(self.nodes[name], target=target, last_error="")
                    self.changes[name] = asyncio.create_task(self.change(name, target, keys))
                return True
            case Wait(changing=changing):
                return changing
        return False

    async def run_host(self, name: str) -> None:
        next_read = 0.0
        while True:
            if time.monotonic() >= next_read:
                await self.read(name)
                next_read = time.monotonic() + self.refresh
            changing = True
            try:
                changing = await self.reconcile(name)
            except ApiError as error:
                if not (errors.is_conflict(error) or errors.is_not_found(error)):
                    log.warning("%s: %s", name, error)
            except (httpx.HTTPError, httpx2.HTTPError, OSError) as error:
                log.warning("%s: %s", name, error)
            wait = self.power_requeue if changing else max(next_read - time.monotonic(), 0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake[name].wait(), timeout=wait)
            self.wake[name].clear()

    async def watch(self, namespace: str) -> None:
        """Every change of a lab host wakes its reconcile (as BMO's watch does)."""
        while True:
            try:
                found: Any
                async for _, found in self.client.watch(BareMetalHost, namespace=namespace):
                    name = str(found.metadata.name)
                    if name in self.wake:
                        self.wake[name].set()
            except (ApiError, httpx.HTTPError, httpx2.HTTPError, OSError) as error:
                log.warning("watch: %s", error)
            await asyncio.sleep(1.0)

    async def run(self, status_file: Path) -> None:
        namespaces = sorted({s.namespace for s in self.specs.values()})
        tasks = [asyncio.create_task(self.watch(ns)) for ns in namespaces]
        tasks += [asyncio.create_task(self.run_host(name)) for name in self.specs]
        ready = json.dumps({"refresh": self.refresh, "hosts": list(self.specs)})
        await asyncio.to_thread(status_file.write_text, ready)
        await asyncio.gather(*tasks)


# ---- the process ------------------------------------------------------------------------------


def status_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "bmo-stand-in.json"


def argv(
    config_file: Path,
    kubeconfig: Path,
    refresh: float,
    power_requeue: float = DEFAULT_POWER_REQUEUE,
    soft_timeout: float = DEFAULT_SOFT_TIMEOUT,
) -> list[str]:
    return [
        sys.executable, "-m", "metalmend_lab.bmostandin", str(config_file), str(kubeconfig),
        "--refresh", f"{refresh:g}", "--power-requeue", f"{power_requeue:g}",
        "--soft-timeout", f"{soft_timeout:g}",
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="metalmend_lab.bmostandin")
    parser.add_argument("config", type=Path, help="the lab's hardware config.json")
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("--refresh", type=float, default=DEFAULT_REFRESH)
    parser.add_argument("--power-requeue", type=float, default=DEFAULT_POWER_REQUEUE)
    parser.add_argument("--soft-timeout", type=float, default=DEFAULT_SOFT_TIMEOUT)
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = HardwareConfig.read(args.config)
    client = AsyncClient(KubeConfig.from_file(args.kubeconfig), field_manager=COMPONENT)
    stand_in = StandIn(
        config, client, refresh=args.refresh, power_requeue=args.power_requeue,
        soft_timeout=args.soft_timeout,
    )  # fmt: skip
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(stand_in.run(status_path(Path(config.lab_dir))))


if __name__ == "__main__":
    main()
