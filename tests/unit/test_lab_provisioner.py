"""The lab's provisioner decided without a cluster (lab.provisioner.decide), the OS it
writes (lab.osdrive), and the kubelet simulator bound to that OS: silent without one,
its disabled unit kept on the OS drive across power cycles and gone with a wipe."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from metalmend_lab import drives, provisioner
from metalmend_lab.inventory import HostSpec
from metalmend_lab.kubeletsim import KubeletSim
from metalmend_lab.osdrive import OsDrive, image_of, os_release
from metalmend_lab.provisioner import HostFacts, MarkProvisioned, MarkProvisioning, WriteOs, decide

URL = "http://127.0.0.1/images/os.qcow2"
OLD = "http://127.0.0.1/images/old.qcow2"
IMAGE = {"url": URL, "checksum": "abc"}
DELAY = 2.0
AVAILABLE = HostFacts("h", "available", True, IMAGE, None, None, 0.0)
WRITTEN = replace(AVAILABLE, state="provisioning", installed=URL, written_for=URL)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        pytest.param(AVAILABLE, MarkProvisioning(), id="available, image, online: provisioning"),
        pytest.param(replace(AVAILABLE, state="ready"), MarkProvisioning(), id="ready (old name)"),
        pytest.param(replace(AVAILABLE, online=False), None, id="offline: left alone"),
        pytest.param(replace(AVAILABLE, image=None), None, id="no image: left alone"),
        pytest.param(replace(AVAILABLE, image={"checksum": "x"}), None, id="image without url"),
        pytest.param(replace(AVAILABLE, state="deprovisioning"), None, id="deprovisioning"),
        pytest.param(
            replace(AVAILABLE, state="provisioned", installed=URL), None, id="provisioned"
        ),
        pytest.param(replace(AVAILABLE, state=""), None, id="no state reported"),
        pytest.param(
            replace(AVAILABLE, state="provisioning"), WriteOs(URL), id="provisioning: OS written"
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", installed=URL),
            WriteOs(URL),
            id="restarted: an OS already there is written again (never trusted)",
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", written_for=URL, elapsed=0.5),
            WriteOs(URL),
            id="written, then wiped meanwhile: written again",
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", installed=OLD, written_for=OLD),
            WriteOs(URL),
            id="the image changed while provisioning",
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", installed=URL, written_for=URL, elapsed=1.0),
            None,
            id="written: waits the delay",
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", installed=URL, written_for=URL, elapsed=DELAY),
            MarkProvisioned(IMAGE),
            id="delay passed: provisioned with the image as given",
        ),
        pytest.param(
            replace(WRITTEN, online=False, elapsed=DELAY),
            MarkProvisioned(IMAGE),
            id="turned off meanwhile: still finishes (power is host-power's)",
        ),
        pytest.param(
            replace(AVAILABLE, state="provisioning", image=None), None, id="image taken away"
        ),
    ],
)
def test_the_provisioners_rule(facts: HostFacts, expected: object) -> None:
    assert decide(facts, DELAY) == expected


def test_writing_the_os_replaces_everything_on_the_os_drive_only(tmp_path: Path) -> None:
    drives.seed(tmp_path, "h", drives.plan("h", 0))
    drive = OsDrive.of(tmp_path, "h")
    drive.set_kubelet_disabled(True)
    (drive.root / "etcd" / "member").mkdir(parents=True)
    (drive.root / "etcd" / "member" / "stale").write_text("old data")
    data = drives.content(tmp_path, "h", "data1")
    provisioner.write_os(tmp_path, "h", URL)
    assert drive.installed() == URL
    assert not drive.kubelet_disabled
    assert not (drive.root / "etcd").exists()
    assert sorted(drives.content(tmp_path, "h", drives.OS_DRIVE)) == [
        "boot/vmlinuz-6.1.0-metalmend-lab", "etc/hostname", "etc/os-release"
    ]  # fmt: skip
    assert drives.content(tmp_path, "h", "data1") == data
    provisioner.write_os(tmp_path, "h", URL)  # again (a restart): the same disk
    assert drive.installed() == URL


def test_os_release_names_the_image_and_nothing_else_reads_as_an_os() -> None:
    assert image_of(os_release(URL)) == URL
    assert image_of('NAME="Debian"\nID=debian\n') is None
    assert image_of("METALMEND_LAB_IMAGE=\n") is None


def test_a_wiped_os_drive_holds_no_os(tmp_path: Path) -> None:
    drive = OsDrive.of(tmp_path, "h")
    assert drive.installed() is None
    drive.install(URL, "h")
    assert drive.installed() == URL
    drives._empty(drive.root)  # what an erase ends with
    assert drive.installed() is None


# ---- the kubelet simulator and the OS drive ------------------------------------------------


def kubelet(tmp_path: Path, power: list[int | None]) -> KubeletSim:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    spec = HostSpec("h", "ns", "ipmi", 0, 0, "", "", "", str(config), boot_delay=0.0)

    async def powered() -> int | None:
        return power[0]

    return KubeletSim(spec, powered, OsDrive.of(tmp_path, "h"))


async def test_a_host_without_an_os_boots_to_nothing(tmp_path: Path) -> None:
    sim = kubelet(tmp_path, [1])
    await sim.beat()
    assert sim.state == "no-os"
    assert sim.pods == 0


async def test_the_disabled_kubelet_lives_on_the_os_drive(tmp_path: Path) -> None:
    power: list[int | None] = [1]
    sim = kubelet(tmp_path, power)
    OsDrive.of(tmp_path, "h").install(URL, "h")
    sim.disabled = True  # what the shutdown-kubelet DaemonSet's pod does
    await sim.beat()
    assert sim.state == "disabled"
    power[0] = None
    await sim.beat()
    power[0] = 2  # a power cycle: still disabled
    await sim.beat()
    assert sim.state == "disabled"
    again = kubelet(tmp_path, power)  # the hardware process restarted: still disabled
    assert again.disabled
    provisioner.write_os(tmp_path, "h", URL)  # redeployed: a new OS, the kubelet enabled
    assert not sim.disabled
