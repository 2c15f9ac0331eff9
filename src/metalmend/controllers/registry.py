"""Every controller ``metalmend run`` can start, by the name ``--controllers`` takes.

One explicit table, so that what runs is read here rather than inferred from which
modules happen to have been imported. The settings name the same controllers, in the same
order (``metalmend.settings.CONTROLLER_NAMES``, without importing this module; a test holds
the two equal). The order is the order ``--controllers all`` starts
them in, following a host through its life: link Nodes to hosts, power hosts, check
health, remediate.
"""

from __future__ import annotations

from metalmend.controllers import (
    Setup,
    fenceremediation,
    healthcheck,
    hostpower,
    machineremediation,
    nodehealthcheck,
    nodelink,
)
from metalmend.controllers import remediation as metal3_remediation

CONTROLLERS: dict[str, Setup] = {
    "node-link": nodelink.setup,
    "host-power": hostpower.setup,
    "machine-health-check": healthcheck.setup,
    "node-health-check": nodehealthcheck.setup,
    "metal3-remediation": metal3_remediation.setup,
    "machine-remediation": machineremediation.setup,
    "fence-remediation": fenceremediation.setup,
}


def unknown(names: list[str]) -> list[str]:
    """The names in ``names`` that are not controllers."""
    return [name for name in names if name not in CONTROLLERS]
