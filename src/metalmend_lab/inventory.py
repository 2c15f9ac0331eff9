"""What the lab's hardware is: its hosts (BMC kind and ports, credentials, the Node each
becomes, its drives), as ``metalmend lab up`` writes it for the hardware process, and where
that process reports what the hardware looks like (``status.json``, read by ``metalmend
lab status``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from metalmend_lab.drives import DEFAULT_ERASE_SECONDS, DriveSpec


@dataclass
class HostSpec:
    name: str
    namespace: str
    bmc: str  # "redfish" or "ipmi"
    bmc_port: int  # what the BareMetalHost's address names (the fault line)
    internal_port: int  # the BMC itself (IPMI) or the emulator (Redfish)
    username: str
    password: str
    provider_id: str
    kubeconfig: str  # the node's own identity (system:node:<name>)
    system_id: str = ""  # Redfish system id
    boot_delay: float = 3.0
    power_delay: float = 0.0  # IPMI: seconds before a power change lands
    labels: dict[str, str] = field(default_factory=dict)
    drives: list[DriveSpec] = field(default_factory=list)  # lab.drives: OS drive first
    standin_password: str = ""  # the BMO stand-in's own BMC account (lab.bmostandin)

    @property
    def address(self) -> str:
        if self.bmc == "ipmi":
            return f"ipmi://127.0.0.1:{self.bmc_port}"
        return f"redfish+https://127.0.0.1:{self.bmc_port}/redfish/v1/Systems/{self.system_id}"


@dataclass
class HardwareConfig:
    lab_dir: str
    hosts: list[HostSpec]
    ca_file: str = ""  # trusts the emulator's certificate
    erase_seconds: float = DEFAULT_ERASE_SECONDS  # how long a drive's secure erase takes

    @classmethod
    def read(cls, path: Path) -> HardwareConfig:
        data = json.loads(path.read_text())
        hosts = []
        for host in data["hosts"]:
            drives = [DriveSpec(**d) for d in host.pop("drives", [])]
            hosts.append(HostSpec(**host, drives=drives))
        erase = data.get("erase_seconds", DEFAULT_ERASE_SECONDS)
        return cls(data["lab_dir"], hosts, data["ca_file"], erase)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))
        path.chmod(0o600)


def status_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "status.json"
