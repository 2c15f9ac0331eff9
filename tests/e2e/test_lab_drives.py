"""The lab's hosts have drives, as metal3 would know them: each BareMetalHost lists its
host's drives in status.hardware.storage and names the OS drive in spec.rootDeviceHints;
the Redfish host's BMC serves the same drives (and the hints choose the OS drive among
them), the IPMI host's BMC cannot, and every drive holds files under the lab directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from metalmend.api.resources import BareMetalHost
from metalmend.api.storage import inventory_from_metal3, with_inventory
from metalmend.bmc import BmcPool, Unsupported
from metalmend.bmc.settings import BmcSettings
from metalmend.destroy.policy.rootdevice import RootDeviceHints, os_drive
from metalmend_lab import drives, lab
from metalmend_lab.hosts import NAMESPACE
from tests.e2e.conftest import host, target


async def test_lab_hosts_have_drives_in_inventory_bmc_and_lab_dir(
    hosts_lab: lab.RunningLab,
) -> None:
    assert hosts_lab.hardware is not None
    lab_dir = Path(hosts_lab.hardware.lab_dir)
    kube = AsyncClient(KubeConfig.from_file(hosts_lab.kubeconfig))
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    try:
        for spec in hosts_lab.hardware.hosts:
            bmh: Any = await kube.get(BareMetalHost, spec.name, namespace=NAMESPACE)
            inventory = inventory_from_metal3(bmh["status"]["hardware"]["storage"])
            assert [d.serial_number for d in inventory] == [d.serial_number for d in spec.drives]
            assert bmh["spec"]["rootDeviceHints"] == {"deviceName": "/dev/sda"}
            for drive in spec.drives:
                assert drives.content(lab_dir, spec.name, drive.id), f"{spec.name} {drive.id}"
            hints = RootDeviceHints.from_wire(bmh["spec"]["rootDeviceHints"])
            if spec.bmc == "redfish":
                listed = with_inventory(await pool.drives(target(spec)), inventory)
                chosen = os_drive(hints, listed)
                assert not isinstance(chosen, str), chosen
                assert chosen.serial_number == spec.drives[0].serial_number
                assert chosen.id.endswith(f"/Storage/1/Drives/{drives.OS_DRIVE}")
        ipmi = host(hosts_lab, "ipmi")
        with pytest.raises(Unsupported, match="IPMI cannot list or erase drives"):
            await pool.drives(target(ipmi))
    finally:
        await pool.close()
        await kube.close()
