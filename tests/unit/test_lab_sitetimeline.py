"""The redeploy timeline's rules (lab.sitetimeline): milestones counted only in order, and
who spent the time. No I/O."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

from metalmend_lab import demo_site, emulator
from metalmend_lab.hosts import emulator_config
from metalmend_lab.inventory import HardwareConfig
from metalmend_lab.sitetimeline import MILESTONES, StepSpan, due, spans, split, svg
from tests.unit.pictures import drawn_outside, inked, layer, render


def test_a_milestone_counts_only_after_what_must_come_first() -> None:
    # an old "poweredOn: true" before the host was ever off is not the host coming back
    facts = {"host_on": True, "provisioned": True, "kubelet_stopped": True}
    assert due({}, facts, 1.0) == {"kubelet_stopped": 1.0}
    seen = {"kubelet_stopped": 1.0, "host_off": 2.0, "os_wiped": 3.0}
    assert due(seen, facts, 4.0) == {"provisioned": 4.0, "host_on": 4.0}
    assert due(seen | {"provisioned": 4.0, "host_on": 4.0}, facts, 5.0) == {}


def test_the_split_counts_gaps_and_metalmend_only_steps_as_ours() -> None:
    steps = [
        StepSpan("preflight", 0.1, 0.2), StepSpan("decommission", 0.3, 10.3),
        StepSpan("destroy", 10.5, 20.5), StepSpan("remove_from_cluster", 20.5, 20.6),
        StepSpan("deploy_server", 21.0, 25.0),
    ]  # fmt: skip
    parts = split(steps, {"decommission": 5.0, "deploy_server": 9.0})
    assert round(parts["metalmend"], 6) == round(0.1 + 0.1 + 0.1 + 0.2 + 0.1 + 0.4, 6)
    assert parts["configured"] == 5.0 + 4.0  # bounded by the step's own length
    assert round(parts["hardware and Kubernetes"], 6) == 15.0
    assert round(sum(parts.values()), 6) == 25.0


def test_spans_from_the_api_and_a_picture() -> None:
    created = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    found = spans(created, [
        {"task_id": "destroy", "start_date": "2026-01-01T00:00:02Z", "end_date": "2026-01-01T00:00:05Z"},
        {"task_id": "preflight", "start_date": "2026-01-01T00:00:00.5Z", "end_date": "2026-01-01T00:00:01Z"},
        {"task_id": "deploy_server", "start_date": None, "end_date": None},
    ])  # fmt: skip
    assert found == [StepSpan("preflight", 0.5, 1.0), StepSpan("destroy", 2.0, 5.0)]
    picture = svg(found, {"host_off": 3.0}, "redeploy <worker-1>")
    assert picture.startswith("<svg")
    assert "&lt;worker-1&gt;" in picture


# ---- the picture, rendered (rsvg-convert: Debian's librsvg2-bin) ---------------------------

STEPS = [
    StepSpan("preflight", 0.05, 0.1), StepSpan("design_lookup", 0.1, 0.2),
    StepSpan("validation", 0.2, 0.3), StepSpan("decommission", 0.4, 8.82),
    StepSpan("destroy", 8.9, 27.6), StepSpan("remove_from_cluster", 27.6, 27.7),
    StepSpan("deploy_server", 27.8, 36.4),
]  # fmt: skip
# Every milestone, the first at once (its dot at the axis' start, beside the longest label)
# and the last at the very end (its time drawn past the axis).
MARKS = {m.name: 0.2 + i * 4.0 for i, m in enumerate(MILESTONES)} | {"member_back": 36.4}
CONFIGURED = {"decommission": 4.0, "destroy": 2.0, "deploy_server": 6.0}


def test_the_picture_fits_its_canvas() -> None:
    picture = svg(STEPS, MARKS, "metalmend: redeploy_server worker-2", CONFIGURED)
    outside = drawn_outside(picture)
    assert not outside, f"drawn past the picture's edge, e.g. at {sorted(outside)[:3]}"


def test_no_text_runs_into_a_bar_or_a_dot() -> None:
    picture = svg(STEPS, MARKS, "metalmend: redeploy_server worker-2", CONFIGURED)
    texts = inked(render(layer(picture, "<text"))[2])
    # the bars, without the legend's swatches (12 px squares beside their own words)
    bars = [line for line in layer(picture, "<rect").splitlines() if 'height="12"' not in line]
    shapes = inked(render(layer(picture, "<circle"))[2]) | inked(render("\n".join(bars))[2])
    assert not texts & shapes, f"text over a shape at {sorted(texts & shapes)[:3]}"


def test_the_configured_waits_are_drawn_in_their_steps() -> None:
    picture = svg(STEPS, MARKS, "t", CONFIGURED)
    assert picture.count("of which configured waits") == len(CONFIGURED)
    assert "of which configured waits: 6.00s" in picture
    assert "configured waits" not in svg(STEPS, MARKS, "t")


def test_the_milestones_are_drawn_in_the_order_of_their_times() -> None:
    picture = svg(STEPS, MARKS, "t")
    labels = {m.name: m.label for m in MILESTONES}
    drawn = [labels[n] for n, _ in sorted(MARKS.items(), key=lambda item: item[1])]
    positions = [picture.index(f">{label}<") for label in drawn]
    assert positions == sorted(positions)


# ---- the 3-11 s between destroy's start and the host off ------------------------------------
# sushy-tools' fake driver lands each power change 1-11 s after the command, at random: the
# demo's lab fixes it, and counts it among the configured waits.


def test_the_demo_counts_its_bmcs_power_changes_as_configured_waits(tmp_path: Path) -> None:
    options = demo_site.lab_options(tmp_path)
    assert options.redfish_power_delay == demo_site.REDFISH_POWER_DELAY
    power = demo_site.REDFISH_POWER_DELAY
    assert demo_site.configured_waits(options) == {
        "decommission": 5.0,
        "destroy": power + options.erase_seconds,  # the power-off, then the erase
        "deploy_server": max(options.provision_delay, power) + options.boot_delay,
    }
    random = replace(options, redfish_power_delay=None)  # not configured: not counted
    assert demo_site.configured_waits(random)["destroy"] == options.erase_seconds


def test_the_emulator_lands_power_changes_after_the_labs_delay(tmp_path: Path) -> None:
    conf = emulator_config(
        HardwareConfig(str(tmp_path), []), tmp_path, tmp_path / "c", tmp_path / "k", 1, 3.0
    )
    config: dict[str, object] = {}
    exec(conf.read_text(), {}, config)  # sushy-tools reads it so (Flask's from_pyfile)
    assert emulator.power_delay(config, {}) == 3.0
    assert emulator.power_delay(config, {emulator.POWER_DELAY_ENV: "0"}) == 3.0  # the lab's wins
    without = emulator_config(HardwareConfig(str(tmp_path), []), tmp_path, tmp_path, tmp_path, 1)
    config = {}
    exec(without.read_text(), {}, config)
    assert emulator.power_delay(config, {}) is None  # sushy-tools' own random delay
    assert emulator.power_delay(config, {emulator.POWER_DELAY_ENV: "0"}) == 0.0


def test_the_power_off_at_the_bmc_is_a_milestone_from_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "hardware" / "worker-1.commands"
    journal.parent.mkdir()
    journal.write_text("100.5 on\n200.25 soft off\nnot a line\n")
    assert demo_site.power_commands(tmp_path, "worker-1") == [(100.5, "on"), (200.25, "soft off")]
    assert demo_site.power_commands(tmp_path, "worker-0") == []
    assert demo_site.power_off_at(tmp_path, "worker-1", 100.0) == 200.25
    assert demo_site.power_off_at(tmp_path, "worker-1", 300.0) is None  # an older one only
    facts = {"kubelet_stopped": False, "power_off_sent": True, "host_off": True}
    assert due({}, facts, 1.0) == {}  # not before the kubelet stopped
    seen = due({}, facts | {"kubelet_stopped": True}, 2.0)
    assert seen == {"kubelet_stopped": 2.0, "power_off_sent": 2.0, "host_off": 2.0}
    names = [m.name for m in MILESTONES]
    assert names.index("kubelet_stopped") < names.index("power_off_sent") < names.index("host_off")
