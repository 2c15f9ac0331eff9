"""A remediation, as a timeline: what happened when, and who spent the time.

``Recorder`` watches one lab host's objects (BareMetalHost, Node, Metal3Remediation, the
pods of a workload) and notes the first moment each milestone is seen. Power commands
carry their own send time (``status.lastPowerCommand.at``, microseconds), so BMC time is
measured from the command.

``breakdown`` splits the total into:
- configured: waits an operator chose (node-monitor grace period, the health check's
  timeout, the lab's boot delay);
- hardware: BMC power changes (command sent -> host controller reports the new state; this
  includes host-power's own re-read, at most 1 s) and kubelet registration after boot;
- Kubernetes: the StatefulSet controller, scheduler and kubelet starting the replacement
  pod (runs in parallel with power-on, so not on the critical path);
- metalmend: everything between those on the critical path: detection after the timeout
  expired, the remediation adding its key, the power command, fencing after the off
  report, releasing the key, power-on command, noticing the Node back, removing the object.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from metalmend.api import names
from metalmend.api.resources import BareMetalHost, Metal3Remediation
from metalmend.api.stamps import parse_stamp

# Milestones, in the order they happen, with the words the table uses.
MILESTONES = {
    "hang": "kernel hangs (lab fault)",
    "unknown": "Node Ready=Unknown (node-lifecycle controller)",
    "detected": "Metal3Remediation created (health check)",
    "key_added": "reboot key on the host (remediation)",
    "off_command": "hard power-off sent to the BMC (host-power)",
    "reported_off": "host reported off (host-power)",
    "fenced": "Node deleted: fenced (remediation)",
    "pod_moved": "workload pod Running on another node",
    "key_removed": "reboot key removed (remediation)",
    "on_command": "power-on sent to the BMC (host-power)",
    "reported_on": "host reported on (host-power)",
    "registered": "Node registered again (kubelet)",
    "ready": "Node Ready",
    "waiting": "remediation phase waiting (labels restored)",
    "removed": "Metal3Remediation removed (health check)",
}


@dataclass
class Timeline:
    host: str
    at: dict[str, float] = field(default_factory=dict)  # milestone -> unix time
    pod_node: str = ""  # where the workload pod ran after the move
    old_pod_node: str = ""

    def mark(self, milestone: str, when: float | None = None) -> None:
        self.at.setdefault(milestone, time.time() if when is None else when)

    def complete(self) -> bool:
        return "removed" in self.at

    def since_hang(self, milestone: str) -> float | None:
        if milestone not in self.at or "hang" not in self.at:
            return None
        return self.at[milestone] - self.at["hang"]


class Recorder:
    """Watches the lab's objects for one host and marks milestones as versions arrive.

    One watch per kind, each in its own thread with its own client: every version of the
    host is seen (a power command recorded and cleared 30 ms later included), at the moment
    the API server sends it."""

    def __init__(self, kubeconfig: Path, namespace: str, host: str, app: str = "") -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.timeline = Timeline(host)
        self.app = app  # label app=<app> of the workload pods to follow
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._node_uid: str | None = None
        self._remediation_seen = False
        self.on_mark: Callable[[str, float], None] | None = None

    def start(self) -> Recorder:
        client = self._client()
        node = client.get(Node, self.timeline.host)
        self._node_uid = node.metadata.uid if node.metadata else None
        by_name = {"metadata.name": self.timeline.host}
        watches: list[tuple[Any, dict[str, Any], dict[str, Any], Callable[[str, Any], None]]] = [
            (Node, {}, by_name, self._on_node),
            (BareMetalHost, {"namespace": self.namespace}, by_name, self._on_host),
            (Metal3Remediation, {"namespace": self.namespace}, by_name, self._on_remediation),
        ]
        if self.app:
            watches.append((Pod, {"namespace": self.namespace}, {}, self._on_pod))
        for resource, scope, fields, handle in watches:
            thread = threading.Thread(
                target=self._watch, args=(resource, scope, fields, handle), daemon=True
            )
            thread.start()
        return self

    def stop(self) -> Timeline:
        self._stop.set()
        return self.timeline

    def _client(self) -> Client:
        return Client(KubeConfig.from_file(self.kubeconfig))

    def _watch(
        self, resource: Any, scope: dict[str, Any], fields: dict[str, Any], handle: Any
    ) -> None:
        client = self._client()
        while not self._stop.is_set():
            try:
                labels: dict[str, Any] | None = {"app": self.app} if resource is Pod else None
                for kind, obj in client.watch(resource, fields=fields, labels=labels, **scope):
                    if self._stop.is_set():
                        return
                    with self._lock:
                        handle(kind, obj)
            except Exception:  # the watch is re-opened; the demo must not die of it
                time.sleep(0.2)

    def _mark(self, milestone: str, when: float | None = None) -> None:
        if milestone in self.timeline.at:
            return
        self.timeline.mark(milestone, when)
        if self.on_mark is not None:
            self.on_mark(milestone, self.timeline.at[milestone])

    def _on_remediation(self, kind: str, remediation: Any) -> None:
        if kind == "DELETED":
            if self._remediation_seen:
                self._mark("removed")
            return
        self._remediation_seen = True
        self._mark("detected")  # (creationTimestamp has whole seconds: too coarse)
        if (remediation.get("status") or {}).get("phase") == "waiting":
            self._mark("waiting")

    def _on_node(self, kind: str, node: Any) -> None:
        if kind == "DELETED":
            if node.metadata.uid == self._node_uid:
                self._mark("fenced")
            return
        conditions = (node.status.conditions if node.status else None) or []
        ready = next((c for c in conditions if c.type == "Ready"), None)
        if node.metadata.uid != self._node_uid:
            self._mark("registered")
            if ready is not None and ready.status == "True":
                self._mark("ready")
        elif ready is not None and ready.status == "Unknown":
            self._mark("unknown")

    def _on_host(self, kind: str, host: Any) -> None:
        annotations = host.metadata.annotations or {}
        ours = any(k.startswith(names.METAL3_REMEDIATION_REBOOT_PREFIX) for k in annotations)
        if ours:
            self._mark("key_added")
        elif "key_added" in self.timeline.at:
            self._mark("key_removed")
        status = host.get("status") or {}
        command = status.get("lastPowerCommand") or {}
        sent = parse_stamp(command.get("at"))
        if command.get("action") == "hard off" and sent and "key_added" in self.timeline.at:
            self._mark("off_command", sent.timestamp())
        if command.get("action") == "on" and sent and "key_removed" in self.timeline.at:
            self._mark("on_command", sent.timestamp())
        if status.get("poweredOn") is False and "key_added" in self.timeline.at:
            self._mark("reported_off")
        if status.get("poweredOn") is True and "reported_off" in self.timeline.at:
            self._mark("reported_on")

    def _on_pod(self, kind: str, pod: Any) -> None:
        if kind == "DELETED" or "fenced" not in self.timeline.at:
            return
        node = pod.spec.nodeName if pod.spec else None
        running = pod.status is not None and pod.status.phase == "Running"
        created = pod.metadata.creationTimestamp if pod.metadata else None
        fresh = created is not None and _unix(created) >= self.timeline.at["fenced"] - 1
        if running and fresh and node and node != self.timeline.host:
            self.timeline.pod_node = node
            self._mark("pod_moved")


def _unix(moment: dt.datetime | None) -> float:
    return moment.timestamp() if moment is not None else time.time()


# ---- where the time went -----------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The configured waits of the run (seconds)."""

    grace: float  # node-monitor grace period
    mhc_timeout: float  # the health check's unhealthy-condition timeout
    boot_delay: float  # lab: power-on -> kubelet registers


@dataclass(frozen=True)
class Segment:
    start: str
    end: str
    who: str  # configured, hardware, kubernetes, metalmend
    what: str


# The critical path, hang to object removed. Each segment's time is measured; configured
# waits are subtracted from the segments they sit in (see breakdown()).
PATH = [
    Segment("hang", "unknown", "configured", "node-monitor grace period"),
    Segment("unknown", "detected", "configured", "health check timeout (+ detection)"),
    Segment("detected", "key_added", "metalmend", "remediation asks for power-off"),
    Segment("key_added", "off_command", "metalmend", "host-power sends the command"),
    Segment("off_command", "reported_off", "hardware", "BMC powers off (+ our re-read)"),
    Segment("reported_off", "fenced", "metalmend", "fence: Node and pods deleted"),
    Segment("fenced", "key_removed", "metalmend", "remediation releases the host"),
    Segment("key_removed", "on_command", "metalmend", "host-power sends power-on"),
    Segment("on_command", "reported_on", "hardware", "BMC powers on (+ our re-read)"),
    Segment("reported_on", "registered", "hardware", "host boots, kubelet registers"),
    Segment("registered", "ready", "hardware", "kubelet reports Ready"),
    Segment("ready", "removed", "metalmend", "Node back noticed, object removed"),
]
# Off the critical path: Kubernetes moves the workload while the host powers on.
POD_MOVE = Segment("fenced", "pod_moved", "kubernetes", "pod started elsewhere")


def took(timeline: Timeline, segment: Segment) -> float:
    """A segment's seconds as drawn and counted (``breakdown``): never below 0. The power
    commands carry metalmend's own send time while the other milestones are when the
    recorder saw them, so a command can predate, by the watch's lag, the milestone it
    follows (power-on sent as the key's removal is still on its way to the recorder): it
    took no time on the critical path."""
    return max(0.0, timeline.at[segment.end] - timeline.at[segment.start])


def breakdown(timeline: Timeline, settings: Settings) -> dict[str, float]:
    """Seconds per party on the critical path; "metalmend" is our own overhead."""
    at = timeline.at
    totals = {"configured": 0.0, "hardware": 0.0, "kubernetes": 0.0, "metalmend": 0.0}
    for segment in PATH:
        if segment.start not in at or segment.end not in at:
            continue
        seconds = took(timeline, segment)
        if segment.start == "unknown":  # the timeout is configured; the rest is detection
            configured = min(seconds, settings.mhc_timeout)
            totals["configured"] += configured
            totals["metalmend"] += seconds - configured
        elif segment.end == "registered":  # the lab's boot delay is configured
            configured = min(seconds, settings.boot_delay)
            totals["configured"] += configured
            totals["hardware"] += seconds - configured
        else:
            totals[segment.who] += seconds
    if "pod_moved" in at and "fenced" in at:  # off the critical path
        totals["kubernetes"] = took(timeline, POD_MOVE)
    return totals


def total(timeline: Timeline) -> float:
    at = timeline.at
    return at["removed"] - at["hang"] if "removed" in at and "hang" in at else float("nan")


# ---- pictures ------------------------------------------------------------------------------------

COLOURS = {
    "configured": "#9aa5b1",
    "hardware": "#f0a35e",
    "kubernetes": "#7fb8e6",
    "metalmend": "#3fa36b",
}


CHAR_WIDTH = 7.0  # px: a generous average of a 12 px sans-serif character
TITLE_CHAR_WIDTH = 10.0  # px: the same for the 16 px bold title
PLOT = 660  # px of the time axis
RIGHT = 80  # px after the time axis: the duration drawn past the last bar ("123.45s")


def svg(timeline: Timeline, settings: Settings, title: str) -> str:
    """The critical path as a Gantt strip, the pod move below it, and a legend. The left
    column is as wide as its longest label, the right margin holds the duration drawn past
    the last bar, and the picture is as wide as its title and legend, so no text is cut at
    an edge; no segment is drawn shorter than 0 (``took``)."""
    at = timeline.at
    start = at.get("hang", min(at.values(), default=0.0))
    end = max(at.values(), default=start + 1.0)
    span = max(end - start, 1.0)
    rows = [s for s in PATH if s.start in at and s.end in at]
    segments = [*rows, *([POD_MOVE] if "pod_moved" in at and "fenced" in at else [])]
    parts = breakdown(timeline, settings)
    legend = [
        (colour, f"{who} {parts[who]:.2f}s" + (" (parallel)" if who == "kubernetes" else ""))
        for who, colour in COLOURS.items()
    ]
    left = 10 + int(CHAR_WIDTH * max((len(s.what) for s in segments), default=10)) + 20
    legend_end = 10 + sum(16 + int(CHAR_WIDTH * len(label)) + 30 for _, label in legend)
    width = max(left + PLOT + RIGHT, legend_end, 10 + int(TITLE_CHAR_WIDTH * len(title)) + 10)
    scale = PLOT / span
    row = 26
    height = 90 + row * (len(rows) + 2) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="16" font-weight="bold">{escape(title)}</text>',
    ]
    y = 50
    for tick in range(0, int(span) + 1, max(1, int(span // 10) or 1)):
        x = left + tick * scale
        out.append(
            f'<line x1="{x:.1f}" y1="{y - 8}" x2="{x:.1f}" y2="{height - 50}" stroke="#eee"/>'
        )
        out.append(f'<text x="{x:.1f}" y="{y - 12}" text-anchor="middle">{tick}s</text>')
    for segment in segments:
        seconds = took(timeline, segment)
        x0 = left + (at[segment.start] - start) * scale
        x1 = x0 + seconds * scale
        colour = COLOURS[segment.who]
        out.append(f'<text x="10" y="{y + 15}">{escape(segment.what)}</text>')
        out.append(
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1.5):.1f}" height="{row - 8}"'
            f' fill="{colour}"><title>{seconds:.3f}s</title></rect>'
        )
        out.append(f'<text x="{x1 + 4:.1f}" y="{y + 15}" fill="#555">{seconds:.2f}s</text>')
        y += row
    x = 10
    y += 20
    for colour, label in legend:
        out.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 16}" y="{y + 11}">{escape(label)}</text>')
        x += 16 + int(CHAR_WIDTH * len(label)) + 30
    out.append("</svg>")
    return "\n".join(out)
