"""Which drive is the OS drive, by metal3's rootDeviceHints with upstream's meaning of each
hint (baremetal-operator's devicehints, Ironic's find_devices_by_hints), refusing to guess
where a wrong guess would erase a data drive; and the drive vocabulary's joins."""

from __future__ import annotations

import pytest

from metalmend.api.storage import GIB, Drive, MediaType, inventory_from_metal3, with_inventory
from metalmend.destroy.policy.rootdevice import RootDeviceHints, ironic_default, os_drive

SDA = Drive(
    id="/redfish/v1/Systems/s/Storage/1/Drives/os",
    name="/dev/sda",
    capacity_bytes=240 * GIB,
    rotational=False,
    model="Micron 5300 PRO",
    vendor="ATA",
    serial_number="OS-0001",
    wwn="0x500a07512345678a",
    wwn_with_extension="0x500a07512345678a0001",
    wwn_vendor_extension="0x0001",
    hctl="0:0:0:0",
    media_type=MediaType.SSD,
    alternate_names=("/dev/disk/by-path/pci-0000:00:17.0-ata-1",),
)
SDB = Drive(
    id="/redfish/v1/Systems/s/Storage/1/Drives/data1",
    name="/dev/sdb",
    capacity_bytes=4000 * GIB,
    rotational=True,
    model="Seagate Exos X16",
    vendor="SEAGATE",
    serial_number="DATA-0001",
    wwn="0x5000c500aaaaaaa1",
    hctl="1:0:0:0",
    media_type=MediaType.HDD,
)
SDC = Drive(
    id="/redfish/v1/Systems/s/Storage/1/Drives/data2",
    name="/dev/sdc",
    capacity_bytes=4000 * GIB,
    rotational=True,
    model="Seagate Exos X16",
    vendor="SEAGATE",
    serial_number="DATA-0002",
    wwn="0x5000c500aaaaaaa2",
    hctl="2:0:0:0",
)
DRIVES = [SDA, SDB, SDC]


@pytest.mark.parametrize(
    ("wire", "chosen"),
    [
        pytest.param({"deviceName": "/dev/sda"}, SDA, id="deviceName exactly"),
        pytest.param(
            {"deviceName": "/dev/disk/by-path/pci-0000:00:17.0-ata-1"},
            SDA,
            id="deviceName by-path matches the alternate name",
        ),
        pytest.param({"hctl": "1:0:0:0"}, SDB, id="hctl exactly"),
        pytest.param({"serialNumber": "DATA-0002"}, SDC, id="serialNumber exactly"),
        pytest.param({"wwn": "0x500a07512345678a"}, SDA, id="wwn exactly"),
        pytest.param(
            {"wwnWithExtension": "0x500a07512345678a0001"}, SDA, id="wwnWithExtension exactly"
        ),
        pytest.param({"wwnVendorExtension": "0x0001"}, SDA, id="wwnVendorExtension exactly"),
        pytest.param({"model": "5300"}, SDA, id="model is a substring"),
        pytest.param({"vendor": "ATA"}, SDA, id="vendor ATA: only the OS drive"),
        pytest.param(
            {"vendor": "AT"}, None, id="vendor is a substring: AT is in ATA and in SEAGATE"
        ),
        pytest.param({"rotational": False}, SDA, id="rotational false: the one SSD"),
        pytest.param(
            {"minSizeGigabytes": 200, "rotational": False},
            SDA,
            id="size in GiB and rotational together",
        ),
        pytest.param(
            {"minSizeGigabytes": 240},
            None,
            id="240 GiB is at least 240 but so are both data drives",
        ),
        pytest.param({"model": "Seagate", "hctl": "2:0:0:0"}, SDC, id="all hints must match"),
        pytest.param(
            {"deviceName": "", "serialNumber": "OS-0001", "minSizeGigabytes": 0},
            SDA,
            id="empty string and zero are not hints (omitempty)",
        ),
        pytest.param(
            {"deviceName": "/dev/sda", "rotational": None}, SDA, id="null rotational is no hint"
        ),
    ],
)
def test_hints_choose_the_drive_upstream_would(
    wire: dict[str, object], chosen: Drive | None
) -> None:
    result = os_drive(RootDeviceHints.from_wire(wire), DRIVES)
    if chosen is None:
        assert isinstance(result, str)
        assert "3 drives match" in result or "2 drives match" in result
    else:
        assert result == chosen


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        pytest.param(
            {"deviceName": "/dev/sdz"},
            "no drive matches spec.rootDeviceHints (deviceName='/dev/sdz')",
            id="nothing matches",
        ),
        pytest.param(
            {"model": "micron"}, "no drive matches", id="model matching is case-sensitive"
        ),
        pytest.param(
            {"serialNumber": "OS-000"},
            "no drive matches",
            id="serialNumber is not a substring match",
        ),
        pytest.param(
            {"model": "Seagate"},
            "2 drives match spec.rootDeviceHints (model='Seagate'): /dev/sdb serial DATA-0001 (4000 GiB), /dev/sdc serial DATA-0002 (4000 GiB)",
            id="several match: refused, not the first",
        ),
        pytest.param({"minSizeGigabytes": 5000}, "no drive matches", id="size above every drive"),
        pytest.param({}, "no spec.rootDeviceHints", id="an empty object is no hints"),
        pytest.param(
            None,
            "Ironic would have installed on the smallest drive of at least 4 GiB, /dev/sda serial OS-0001",
            id="no hints: refused, naming Ironic's guess",
        ),
    ],
)
def test_no_single_drive_is_a_reason(wire: object, reason: str) -> None:
    result = os_drive(RootDeviceHints.from_wire(wire), DRIVES)
    assert isinstance(result, str)
    assert reason in result


@pytest.mark.parametrize(
    ("wire", "problem"),
    [
        pytest.param(["/dev/sda"], "rootDeviceHints is a list, not an object", id="a list"),
        pytest.param("/dev/sda", "rootDeviceHints is a string, not an object", id="a string"),
        pytest.param(
            {"deviceName": 7}, "deviceName is a number, not a string", id="number for a name"
        ),
        pytest.param(
            {"serialNumber": ["a"]}, "serialNumber is a list, not a string", id="list for a serial"
        ),
        pytest.param(
            {"minSizeGigabytes": "10"},
            "minSizeGigabytes is a string, not a whole number",
            id="size as text",
        ),
        pytest.param(
            {"minSizeGigabytes": True},
            "minSizeGigabytes is a boolean, not a whole number",
            id="size as boolean",
        ),
        pytest.param(
            {"minSizeGigabytes": 1.5},
            "minSizeGigabytes is a number, not a whole number",
            id="size as fraction",
        ),
        pytest.param(
            {"minSizeGigabytes": -1}, "minSizeGigabytes is -1, below 0", id="negative size"
        ),
        pytest.param(
            {"rotational": "false"},
            "rotational is a string, not true or false",
            id="rotational as text",
        ),
        pytest.param(
            {"serial": "OS-0001"},
            "'serial' is not a root device hint",
            id="a typo is not dropped silently",
        ),
        pytest.param({"wwn": "x" * 300}, "wwn is longer than 256 characters", id="a huge hint"),
        pytest.param(
            {"deviceName": "/dev/sda\n"},
            "deviceName contains control characters",
            id="control characters",
        ),
    ],
)
def test_hostile_hints_choose_nothing_and_say_why(wire: object, problem: str) -> None:
    hints = RootDeviceHints.from_wire(wire)
    result = os_drive(hints, DRIVES)
    assert isinstance(result, str)
    assert result.startswith("spec.rootDeviceHints cannot be used: ")
    assert problem in result
    assert not any(hints.matches(d) for d in DRIVES)


def test_a_drive_that_does_not_report_a_hinted_field_never_matches_it() -> None:
    unnamed = [Drive(id="a", capacity_bytes=GIB * 100, serial_number="A")]
    result = os_drive(RootDeviceHints.from_wire({"deviceName": "/dev/sda"}), unnamed)
    assert isinstance(result, str)
    assert "known only from the host's inspection inventory" in result
    unknown_spin = RootDeviceHints.from_wire({"rotational": False})
    assert not unknown_spin.matches(Drive(id="a", rotational=None))


def test_no_drives_is_a_reason() -> None:
    assert os_drive(RootDeviceHints.from_wire({"deviceName": "/dev/sda"}), []) == (
        "the host reports no drives"
    )


@pytest.mark.parametrize(
    ("drives", "expected"),
    [
        pytest.param([SDB, SDA, SDC], SDA, id="smallest of at least 4 GiB"),
        pytest.param(
            [Drive(id="tiny", capacity_bytes=GIB), SDB], SDB, id="smaller than 4 GiB is skipped"
        ),
        pytest.param(
            [
                Drive(id="b", name="/dev/sdb", capacity_bytes=8 * GIB),
                Drive(id="a", name="/dev/sda", capacity_bytes=8 * GIB),
            ],
            "a",
            id="ties broken by name",
        ),
        pytest.param([Drive(id="tiny", capacity_bytes=GIB)], None, id="none large enough"),
    ],
)
def test_ironic_default_is_guess_root_disk(
    drives: list[Drive], expected: Drive | str | None
) -> None:
    guess = ironic_default(drives)
    if isinstance(expected, str):
        assert guess is not None
        assert guess.id == expected
    else:
        assert guess == expected


def test_bmc_drives_learn_device_names_from_the_inspection_inventory() -> None:
    bmc = [
        Drive(id="/r/os", capacity_bytes=240 * GIB, serial_number="OS-0001"),
        Drive(id="/r/d1", capacity_bytes=4000 * GIB, wwn="0x5000c500aaaaaaa1"),
        Drive(id="/r/x", serial_number="NOT-INSPECTED"),
    ]
    inventory = inventory_from_metal3([SDA.to_metal3(), SDB.to_metal3(), "junk", {"name": 5}])
    joined = with_inventory(bmc, inventory)
    assert (joined[0].name, joined[0].hctl, joined[0].id) == ("/dev/sda", "0:0:0:0", "/r/os")
    assert (joined[1].name, joined[1].rotational) == ("/dev/sdb", True)
    assert joined[2].name == ""
    assert os_drive(RootDeviceHints.from_wire({"deviceName": "/dev/sda"}), joined) == joined[0]


def test_a_serial_shared_by_two_inventory_entries_identifies_nothing() -> None:
    twins = [
        Drive(id="", name="/dev/sda", serial_number="S"),
        Drive(id="", name="/dev/sdb", serial_number="S"),
    ]
    assert with_inventory([Drive(id="/r/1", serial_number="S")], twins)[0].name == ""


def test_metal3_inventory_round_trips_and_tolerates_wrong_types() -> None:
    assert Drive.from_metal3(SDA.to_metal3()) == SDA.__class__(**{**SDA.__dict__, "id": ""})
    odd = Drive.from_metal3({"sizeBytes": True, "rotational": "yes", "type": "TAPE", "name": 3})
    assert (odd.capacity_bytes, odd.rotational, odd.media_type, odd.name) == (
        0,
        None,
        MediaType.UNKNOWN,
        "",
    )
    assert Drive.from_metal3({}).rotational is False  # metal3 omits rotational: false
