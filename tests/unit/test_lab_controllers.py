"""What `metalmend lab up` runs unless told (lab.default_controllers): every controller of
`metalmend run`, less what another component of that lab does itself (issue 37: 5 of them
ran, and a NodeHealthCheck or FenceRemediation made in the lab was silently ignored)."""

from __future__ import annotations

import pytest

from metalmend.settings import CONTROLLER_NAMES
from metalmend_lab import lab


def every_but(*left_out: str) -> str:
    return ",".join(c for c in CONTROLLER_NAMES if c not in left_out)


@pytest.mark.parametrize(
    ("machine_api", "power_owner", "nodelink", "expected"),
    [
        pytest.param("none", "metalmend", True, every_but(), id="the lab's own Machines: all"),
        pytest.param("none", "bmo-stand-in", True, every_but("host-power", "machine-remediation"),
                     id="beside BMO: nothing that sends power commands"),
        pytest.param("capi", "metalmend", True, every_but("machine-health-check", "node-link"),
                     id="Cluster API: its own check and nodeRef"),
        pytest.param("capi-metal3", "metalmend", True,
                     every_but("machine-health-check", "node-link"), id="Cluster API + CAPM3"),
        pytest.param("openshift", "metalmend", True, every_but("node-link"),
                     id="OpenShift: its nodelink-controller sets nodeRef"),
        pytest.param("openshift", "metalmend", False, every_but(),
                     id="OpenShift without its nodelink-controller: metalmend's node-link"),
        pytest.param("capi", "bmo-stand-in", True,
                     every_but("machine-health-check", "node-link", "host-power",
                               "machine-remediation"), id="Cluster API beside BMO"),
    ],
)  # fmt: skip
def test_default_controllers(
    machine_api: str, power_owner: str, nodelink: bool, expected: str
) -> None:
    assert lab.default_controllers(machine_api, power_owner, nodelink) == expected


def test_the_default_is_every_controller() -> None:
    assert lab.DEFAULT_CONTROLLERS.split(",") == list(CONTROLLER_NAMES)
    assert lab.default_controllers("none", "metalmend") == lab.DEFAULT_CONTROLLERS
    assert lab.default_controllers("none", "bmo-stand-in") == lab.BMO_CONTROLLERS
