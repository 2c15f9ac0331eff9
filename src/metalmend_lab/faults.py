"""The faults a lab host can be given (``metalmend lab fault``): a hung kernel (hang,
cleared by ``recover`` or by any reboot), a BMC that does not answer (bmc-down/bmc-up), a
slow BMC (bmc-slow), and a BMC that accepts a soft power-off and does nothing
(ignore-soft/honour-soft).

The CLI writes them as files (``faults/<host>.json``); the hardware process reads them
every 0.2 s and applies them (``FaultInjector``) to the host's kubelet, its BMC line and
its IPMI power.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads and writes faults without loading the hardware
    from metalmend_lab.bmcs import HostPower
    from metalmend_lab.kubeletsim import KubeletSim
    from metalmend_lab.proxies import FaultLine

SLOW_DELAY = 3.0  # seconds a bmc-slow line adds each way


@dataclass
class Faults:
    hang: bool = False
    bmc: str = "up"  # up, down, slow
    ignore_soft: bool = False  # the BMC accepts soft power-off and does nothing

    @classmethod
    def read(cls, path: Path) -> Faults:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return cls()


def write_faults(lab_dir: Path, host: str, faults: Faults) -> None:
    path = faults_path(lab_dir, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(faults)))
    tmp.replace(path)


def faults_path(lab_dir: Path, host: str) -> Path:
    return lab_dir / "hardware" / "faults" / f"{host}.json"


class FaultInjector:
    """Applies one host's faults file to its hardware: the kubelet (hung or not), the BMC
    line (down, slow) and, for IPMI hosts, the power (whether a soft off is ignored).

    A hung kernel ends with the boot it hung in, as on a real machine: once the host has
    booted again the hang is cleared from the file too, so that ``lab status`` and the
    next ``lab fault`` see the host as it is."""

    def __init__(
        self,
        lab_dir: Path,
        host: str,
        kubelet: KubeletSim,
        line: FaultLine,
        power: HostPower | None,
    ) -> None:
        self.lab_dir = lab_dir
        self.host = host
        self.kubelet = kubelet
        self.line = line
        self.power = power
        self._hanging = False
        self._hung_in: int | None = None  # the boot the hang began in (None: while off)

    def apply(self) -> Faults:
        """Read the faults file, apply it, and return the faults as applied."""
        faults = Faults.read(faults_path(self.lab_dir, self.host))
        boot = self.kubelet.boot
        if faults.hang and self._hanging and boot != self._hung_in:
            faults.hang = False  # the host rebooted since it hung: the hang is gone
            write_faults(self.lab_dir, self.host, faults)
        if not faults.hang:
            self._hanging = False
        elif not self._hanging:
            self._hanging, self._hung_in = True, boot
        self.kubelet.hung = faults.hang
        self.line.apply(
            down=faults.bmc == "down", delay=SLOW_DELAY if faults.bmc == "slow" else 0.0
        )
        if self.power is not None:
            self.power.ignore_soft = faults.ignore_soft
        return faults
