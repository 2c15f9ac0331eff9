"""The remediation timeline of ``make demo`` (lab.timeline) and the demo's own words: the
picture keeps every label inside its edges and draws no negative duration, the split
counts none, and the hosts step counts the lab's hosts. No I/O but rsvg-convert."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from metalmend_lab.demo import HOSTS, counted, hosts_step
from metalmend_lab.timeline import PATH, POD_MOVE, Settings, Timeline, breakdown, svg, took
from tests.unit.pictures import drawn_outside

SETTINGS = Settings(grace=8.0, mhc_timeout=3.0, boot_delay=2.0)
SVG = "{http://www.w3.org/2000/svg}"

# A run as the demo records it: the power-on command carries host-power's own send time,
# 0.5 ms before the recorder saw the key's removal it follows (the "-0.00s" bar), and the
# last milestone ends the axis (its duration drawn past the last bar: the cut "2.4").
AT = {
    "hang": 0.0, "unknown": 8.41, "detected": 11.52, "key_added": 11.58, "off_command": 11.6,
    "reported_off": 12.71, "fenced": 12.76, "key_removed": 12.9, "on_command": 12.8995,
    "reported_on": 13.98, "pod_moved": 15.3, "registered": 16.12, "ready": 16.51,
    "removed": 18.95,
}  # fmt: skip


def timeline(at: dict[str, float] = AT, host: str = "worker-2") -> Timeline:
    return Timeline(host, dict(at))


def texts(picture: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(picture).iter(f"{SVG}text")]


@pytest.mark.parametrize(
    ("title", "at"),
    [
        ("metalmend: remediation of worker-2", AT),
        ("metalmend: remediation of a-host-with-a-very-long-name-in-the-lab-0123456789", AT),
        ("short run", {"hang": 0.0, "unknown": 0.4, "detected": 0.9}),  # under a second
        ("long run", {k: v * 40 for k, v in AT.items()}),  # 758 s: wide numbers
    ],
    ids=["demo", "long-title", "short", "long"],
)
def test_every_label_lies_inside_the_picture(title: str, at: dict[str, float]) -> None:
    """Rendered by rsvg-convert on a larger canvas: nothing is inked past the picture's
    edges (the last bars' durations, the axis' last tick, the legend, the title)."""
    outside = drawn_outside(svg(timeline(at), SETTINGS, title))
    assert not outside, f"drawn past the picture's edge, e.g. at {sorted(outside)[:3]}"


def test_no_negative_duration_is_drawn() -> None:
    picture = svg(timeline(), SETTINGS, "t")
    root = ET.fromstring(picture)
    durations = [t for t in texts(picture) if re.fullmatch(r"-?\d+\.\d+s", t)]
    assert len(durations) == len(PATH) + 1  # every segment of the path, and the pod's move
    assert not [d for d in durations if d.startswith("-")]
    assert "0.00s" in durations  # the command seen before its milestone: no time
    widths = [float(r.get("width", "0")) for r in root.iter(f"{SVG}rect")]
    assert min(widths) > 0
    tips = [t.text or "" for t in root.iter(f"{SVG}title")]
    assert not [t for t in tips if t.startswith("-")]
    legend = [t for t in texts(picture) if re.match(r"[a-z]+ -?\d", t)]
    assert len(legend) == 4
    assert not [t for t in legend if " -" in t]


def test_a_command_seen_before_its_milestone_took_no_time() -> None:
    run = timeline()
    on = next(s for s in PATH if s.end == "on_command")
    assert run.at[on.end] < run.at[on.start]
    assert took(run, on) == 0.0
    parts = breakdown(run, SETTINGS)
    assert min(parts.values()) >= 0.0
    early_pod = timeline(AT | {"pod_moved": AT["fenced"] - 0.001})
    assert took(early_pod, POD_MOVE) == 0.0
    assert breakdown(early_pod, SETTINGS)["kubernetes"] == 0.0


def test_the_hosts_step_counts_the_labs_hosts() -> None:
    assert hosts_step(HOSTS).startswith("2. Three bare-metal hosts: ")
    assert hosts_step(1).startswith("2. One bare-metal host: ")
    assert counted(12, "server") == "12 servers"
