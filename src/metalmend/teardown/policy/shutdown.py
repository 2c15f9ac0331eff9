"""Shutting a Node's kubelet down, decided purely (docs/teardown.md, docs/decide-act.md).

Airship's node teardown spec ("Promenade Shutdown Kubelet", airship-specs
``specs/approved/workflow_node-teardown.rst``): the service labels the Node
``promenade-decomission: enabled``, and a DaemonSet that selects that label runs
``systemctl disable kubelet && systemctl stop kubelet`` on it (ours:
deploy/teardown/shutdown-kubelet.yaml). The step succeeds once the kubelet is seen stopped.

How we know it stopped: the kubelet's own heartbeat, its Node's Lease
(``kube-node-lease/<node>``, renewed every 10 s by a kubelet), is no longer renewed. The
renewal's value is compared with what this request saw before, timed by our clock only
(a node whose clock is off cannot fool it, as it cannot fool the node lifecycle
controller, which judges the same way): unchanged for ``kubelet_stopped_after`` seconds
means stopped. Sooner when the node lifecycle controller already says so (the Node's
Ready condition Unknown: "Kubelet stopped posting node status") and the heartbeat has not
moved since this request first looked; and at once for a Node that has never had a
heartbeat (no kubelet ever ran there).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from metalmend.policy.decision import Decision, Event
from metalmend.teardown.policy.settings import (
    DECOMMISSION_LABEL,
    DECOMMISSION_VALUE,
    TeardownSettings,
)


@dataclass(frozen=True)
class ShutdownView:
    """What one shutdown-kubelet request has observed of the Node."""

    node: str
    labelled: bool  # carries promenade-decomission: enabled
    heartbeat: str | None  # the latest Lease renewTime (else Ready's lastHeartbeatTime)
    heartbeat_seen_since: dt.datetime | None  # our clock: since when that value is unchanged
    heartbeat_moved: bool  # the heartbeat changed while this request watched it
    ready_unknown: bool  # the node lifecycle controller says the kubelet stopped posting
    deadline: dt.datetime
    shutdown_pods: tuple[str, ...] = ()  # the DaemonSet's pods on the Node, one line each


@dataclass(frozen=True)
class LabelForShutdown:
    """Set ``promenade-decomission: enabled`` on the Node (only that label)."""

    node: str
    labels: tuple[tuple[str, str], ...] = ((DECOMMISSION_LABEL, DECOMMISSION_VALUE),)


@dataclass(frozen=True)
class KubeletStopped:
    node: str
    why: str


@dataclass(frozen=True)
class ShutdownFailed:
    node: str
    problems: tuple[str, ...]


Action = LabelForShutdown | KubeletStopped | ShutdownFailed | Event


def decide(view: ShutdownView, now: dt.datetime, settings: TeardownSettings) -> Decision[Action]:
    decision: Decision[Action] = Decision()
    if not view.labelled:
        # Label first: the DaemonSet's pod is what stops the kubelet, and a kubelet that
        # is down now would come back with the host; the label makes it stop for good.
        return decision.do(LabelForShutdown(view.node))
    if view.heartbeat is None:
        return decision.do(
            KubeletStopped(view.node, "the Node has no Lease and never reported status")
        )
    if view.ready_unknown and not view.heartbeat_moved:
        return decision.do(
            KubeletStopped(
                view.node,
                "the node lifecycle controller reports Ready Unknown (the kubelet stopped"
                " posting status) and its Lease is not renewed",
            )
        )
    assert view.heartbeat_seen_since is not None  # the executor times every heartbeat seen
    stopped_at = view.heartbeat_seen_since + dt.timedelta(seconds=settings.kubelet_stopped_after)
    if now >= stopped_at:
        quiet = (now - view.heartbeat_seen_since).total_seconds()
        return decision.do(
            KubeletStopped(
                view.node,
                f"its Lease has not been renewed for {quiet:.0f} s (last renewal {view.heartbeat})",
            )
        )
    if now >= view.deadline:
        return decision.do(ShutdownFailed(view.node, failure(view, now)))
    return decision.at(min(stopped_at, view.deadline))


def failure(view: ShutdownView, now: dt.datetime) -> tuple[str, ...]:
    """Why the kubelet is still running, as far as the cluster shows it."""
    quiet = (now - view.heartbeat_seen_since).total_seconds() if view.heartbeat_seen_since else 0
    problems = [
        f"the kubelet of Node {view.node} still renews its Lease (last renewal"
        f" {view.heartbeat}, {quiet:.0f} s ago)"
    ]
    if not view.shutdown_pods:
        problems.append(
            f"no pod of the shutdown-kubelet DaemonSet is on Node {view.node}: is"
            " deploy/teardown/shutdown-kubelet.yaml installed, and may it run there?"
        )
    problems.extend(view.shutdown_pods)
    return tuple(problems)
