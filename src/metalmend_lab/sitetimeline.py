"""A redeploy_server, as a timeline (the site demo and ``benchmarks/redeploy.py``): what
happened to the server when, which step of the action was running, and who spent the time.

The milestones are what an operator would check by hand, read from the lab every 0.25 s
(``Milestones``): the pod moved, the etcd member gone, the kubelet stopped, the power-off
command at the BMC (the emulator's journal), the host off (host-power's status, once the
BMC's power change has landed: ``demo_site.REDFISH_POWER_DELAY`` later, then host-power's
next read, within its ``transition_poll`` of 1 s),
the OS drive wiped with the data drive kept, the Node removed, the server provisioned and
on again, its Node Ready, its member back. The action's own steps (start, end) come from
Shipyard's API.

Who spent the time (``split``), per step of the action:
- ``metalmend``: the steps that are only metalmend's work and API round trips (preflight,
  design_lookup, validation, remove_from_cluster) and the gaps between steps (the worker
  taking the action, storing each step): metalmend's own overhead;
- ``configured``: waits an operator chose (the lab's kubelet-stopped window, the time its
  BMCs take to carry out a power change, its erase, boot and provisioning delays), counted
  inside the steps that wait for them;
- ``hardware and Kubernetes``: the rest of decommission (evictions, the kubelet's Lease,
  etcd's reconfiguration), destroy (BMC power-off, the secure erase) and deploy_server
  (BMC power-on, provisioning, the kubelet's registration, etcd's start).
Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

OWN_STEPS = frozenset({"preflight", "design_lookup", "validation", "remove_from_cluster"})
COLOURS = {
    "metalmend": "#3fa36b",
    "configured": "#9aa5b1",
    "hardware and Kubernetes": "#f0a35e",
}


@dataclass(frozen=True)
class Milestone:
    name: str
    label: str
    after: tuple[str, ...] = ()  # only counted once these were seen


MILESTONES = (
    Milestone("pod_moved", "db-0 Running on another server (drain, PDB respected)"),
    Milestone("member_left", "etcd member removed; the cluster keeps quorum"),
    Milestone("kubelet_stopped", "kubelet stopped (shutdown-kubelet)"),
    Milestone("power_off_sent", "power-off reached the BMC (host-power)", ("kubelet_stopped",)),
    Milestone("host_off", "host powered off through its BMC", ("kubelet_stopped",)),
    Milestone("os_wiped", "OS drive erased; data drive kept", ("host_off",)),
    Milestone("node_removed", "Node removed from the cluster", ("kubelet_stopped",)),
    Milestone("provisioned", "OS written again (provisioned)", ("os_wiped",)),
    Milestone("host_on", "host powered on", ("provisioned",)),
    Milestone("node_ready", "Node registered and Ready again", ("node_removed", "host_on")),
    Milestone("member_back", "etcd member added back and started", ("member_left", "node_ready")),
)


def due(seen: Mapping[str, float], facts: Mapping[str, bool], now: float) -> dict[str, float]:
    """The milestones newly reached: their fact is true and what must come first was seen."""
    found: dict[str, float] = {}
    for milestone in MILESTONES:
        if milestone.name in seen or not facts.get(milestone.name):
            continue
        if all(a in seen or a in found for a in milestone.after):
            found[milestone.name] = now
    return found


@dataclass(frozen=True)
class StepSpan:
    name: str
    start: float  # seconds since the action was created
    end: float


def spans(created: dt.datetime, steps: Sequence[Mapping[str, object]]) -> list[StepSpan]:
    """The steps that ran, from ``GET /actions/{id}/steps/{step}`` answers."""
    found = []
    for step in steps:
        start, end = step.get("start_date"), step.get("end_date")
        if isinstance(start, str) and isinstance(end, str):
            found.append(
                StepSpan(str(step.get("task_id")), _since(created, start), _since(created, end))
            )
    return sorted(found, key=lambda s: s.start)


def _since(created: dt.datetime, stamp: str) -> float:
    return (dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) - created).total_seconds()


def split(steps: Sequence[StepSpan], configured: Mapping[str, float]) -> dict[str, float]:
    """Seconds per owner (module docstring); ``configured``: step -> the configured waits
    inside it (bounded by the step's length)."""
    parts = dict.fromkeys(COLOURS, 0.0)
    previous = 0.0
    for step in steps:
        parts["metalmend"] += max(step.start - previous, 0.0)  # the worker between steps
        took = step.end - step.start
        if step.name in OWN_STEPS:
            parts["metalmend"] += took
        else:
            waited = min(configured.get(step.name, 0.0), took)
            parts["configured"] += waited
            parts["hardware and Kubernetes"] += took - waited
        previous = step.end
    return parts


def owner(step: str) -> str:
    return "metalmend" if step in OWN_STEPS else "hardware and Kubernetes"


CHAR_WIDTH = 7.0  # px: a generous average of a 12 px sans-serif character
RIGHT = 80  # px after the time axis: a duration or a time ("36.40s") drawn past a bar's end
PLOT = 640  # px of the time axis


def svg(
    steps: Sequence[StepSpan],
    marks: Mapping[str, float],
    title: str,
    configured: Mapping[str, float] | None = None,
) -> str:
    """The action's steps as a Gantt strip, the milestones as ticks under it. The left
    column is as wide as its longest label and the right margin holds the numbers drawn
    past a bar or a dot, so nothing runs into a dot or off the picture; ``configured``
    (step -> seconds of configured waits in it, as ``split`` counts them) is drawn as the
    grey end of the step's bar."""
    configured = configured or {}
    end = max([s.end for s in steps] + list(marks.values()) + [1.0])
    names = {m.name: m.label for m in MILESTONES}
    texts = [f"step {s.name}" for s in steps] + [names.get(n, n) for n in marks]
    left = 10 + int(CHAR_WIDTH * max((len(t) for t in texts), default=10)) + 20
    width, row = left + PLOT + RIGHT, 24
    scale = PLOT / end
    height = 80 + row * (len(steps) + len(marks)) + 50
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="16" font-weight="bold">{escape(title)}</text>',
    ]
    y = 50
    tick = max(1, int(end // 10) or 1)
    for second in range(0, int(end) + 1, tick):
        x = left + second * scale
        out.append(
            f'<line x1="{x:.1f}" y1="{y - 8}" x2="{x:.1f}" y2="{height - 50}" stroke="#eee"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{y - 12}" text-anchor="middle">{second}s</text>')
    for step in steps:
        x0, x1 = left + step.start * scale, left + step.end * scale
        out.append(f'<text x="10" y="{y + 15}">step {escape(step.name)}</text>')
        out.append(
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1.5):.1f}" height="{row - 8}"'
            f' fill="{COLOURS[owner(step.name)]}">'
            f"<title>{step.end - step.start:.3f}s</title></rect>"
        )
        waited = min(configured.get(step.name, 0.0), step.end - step.start)
        if waited > 0 and step.name not in OWN_STEPS:
            out.append(
                f'<rect x="{x1 - waited * scale:.1f}" y="{y + 3}" width="{waited * scale:.1f}"'
                f' height="{row - 8}" fill="{COLOURS["configured"]}">'
                f"<title>of which configured waits: {waited:.2f}s</title></rect>"
            )
        out.append(
            f'<text x="{x1 + 4:.1f}" y="{y + 15}" fill="#555">{step.end - step.start:.2f}s</text>'
        )
        y += row
    for name, at in sorted(marks.items(), key=lambda item: item[1]):
        x = left + at * scale
        out.append(f'<text x="10" y="{y + 15}" fill="#333">{escape(names.get(name, name))}</text>')
        out.append(
            f'<circle cx="{x:.1f}" cy="{y + 11}" r="5" fill="#3060c0">'
            f"<title>{at:.2f}s</title></circle>"
        )
        out.append(f'<text x="{x + 8:.1f}" y="{y + 15}" fill="#555">{at:.1f}s</text>')
        y += row
    x = 10
    y += 20
    for who, colour in COLOURS.items():
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="{y + 11}">{escape(who)}</text>')
        x += 16 + int(CHAR_WIDTH * len(who)) + 30
    out.append("</svg>")
    return "\n".join(out)
