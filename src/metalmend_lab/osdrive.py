"""What a lab host's OS drive holds besides its seeded blocks: the installed OS, and the
host's state that lives in that OS (``lab.drives``: the drive is the directory
``.lab/drives/<host>/os/``).

- ``etc/os-release``: the OS, written by the provisioner (``lab.provisioner``) or seeded
  by ``lab up``; it names the image it came from. No marker, no OS: the host powers on
  to nothing and its kubelet stays silent.
- ``etc/systemd/kubelet.disabled``: ``systemctl disable --now kubelet`` ran (the
  shutdown-kubelet DaemonSet). A power cycle keeps it, as systemd's links would; a wipe
  of the drive clears it, so a redeployed server's kubelet runs again.
- ``etc/etcd/initial-cluster-state-new``: seeded by ``lab up`` on the site etcd's
  hosts: their members found the cluster (``--initial-cluster-state new``). Removed once
  the member has its data; a provisioned OS never carries it, so a wiped member never
  starts a cluster of its own (``lab.siteetcd``).

Every write is a whole file replaced at once: the hardware process, the provisioner and
an erase all touch the drive, and none may see half a file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from metalmend_lab import drives

OS_RELEASE = Path("etc") / "os-release"
KUBELET_DISABLED = Path("etc") / "systemd" / "kubelet.disabled"
ETCD_GENESIS = Path("etc") / "etcd" / "initial-cluster-state-new"
IMAGE_KEY = "METALMEND_LAB_IMAGE"  # the os-release line naming the image


class OsDrive:
    """One host's OS drive, as the lab's hardware and provisioner see it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def of(cls, lab_dir: Path, host: str) -> OsDrive:
        return cls(drives.os_drive_dir(lab_dir, host))

    # ---- the OS -------------------------------------------------------------------------

    def installed(self) -> str | None:
        """The image URL the OS on the drive was written from; None: no OS."""
        try:
            text = (self.root / OS_RELEASE).read_text()
        except (OSError, UnicodeDecodeError):
            return None
        return image_of(text)

    def install(self, image_url: str, host: str) -> None:
        """The OS written from ``image_url`` (the few files a lab OS is)."""
        files = {
            Path("etc") / "hostname": f"{host}\n",
            Path("boot") / "vmlinuz-6.1.0-metalmend-lab": f"kernel from {image_url}\n",
            OS_RELEASE: os_release(image_url),  # last: its presence means a whole OS
        }
        for relative, text in files.items():
            _write(self.root / relative, text)

    # ---- state the OS keeps ---------------------------------------------------------------

    @property
    def kubelet_disabled(self) -> bool:
        return (self.root / KUBELET_DISABLED).exists()

    def set_kubelet_disabled(self, disabled: bool) -> None:
        if disabled:
            _write(self.root / KUBELET_DISABLED, "disabled by shutdown-kubelet\n")
        else:
            with contextlib.suppress(FileNotFoundError):
                (self.root / KUBELET_DISABLED).unlink()

    @property
    def etcd_genesis(self) -> bool:
        return (self.root / ETCD_GENESIS).exists()

    def mark_etcd_genesis(self) -> None:
        _write(self.root / ETCD_GENESIS, "new\n")

    def clear_etcd_genesis(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / ETCD_GENESIS).unlink()


def os_release(image_url: str) -> str:
    return f'NAME="metalmend lab host"\nID=metalmend-lab\n{IMAGE_KEY}={image_url}\n'


def image_of(text: str) -> str | None:
    """The image URL an os-release names (None: not one the lab wrote)."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == IMAGE_KEY and value:
            return value
    return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
