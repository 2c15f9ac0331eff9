"""One lab with hosts for the e2e tests: a Redfish host (sushy-tools) and an IPMI host
(pyghmi BMC), kubelet simulators, node-link running as ``metalmend run``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from metalmend.bmc import BmcTarget, Credentials, parse
from metalmend.lab import lab
from metalmend.lab.hardware import HostSpec

LAB_GRACE = 6.0  # node-monitor grace period of the e2e lab


@pytest.fixture(scope="session")
def hosts_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=LAB_GRACE,
        hosts=2,
        bmc="mixed",
        boot_delay=1.0,
        controllers="node-link",
    )
    with lab.started(options) as running:
        yield running


def host(running: lab.RunningLab, kind: str) -> HostSpec:
    assert running.hardware is not None
    return next(h for h in running.hardware.hosts if h.bmc == kind)


def target(spec: HostSpec, password: str | None = None) -> BmcTarget:
    return BmcTarget(parse(spec.address), Credentials(spec.username, password or spec.password))
