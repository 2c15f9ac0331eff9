"""What the node-teardown steps of ``metalmend serve`` share (docs/teardown.md): their
settings and the Node label that Airship's node teardown spec names."""

from __future__ import annotations

from dataclasses import dataclass

DECOMMISSION_LABEL = "promenade-decomission"
"""Set (to ``enabled``) by shutdown-kubelet; spelt as Airship's node teardown spec spells
it, so that DaemonSets written for Promenade select the same Nodes."""

DECOMMISSION_VALUE = "enabled"

SHUTDOWN_KUBELET_APP = "metalmend-shutdown-kubelet"
"""``app.kubernetes.io/name`` of the pods of the shutdown-kubelet DaemonSet
(deploy/teardown/shutdown-kubelet.yaml): how its pods on a Node are found."""


@dataclass(frozen=True)
class TeardownSettings:
    """How ``metalmend serve`` carries out the node-teardown steps (section ``teardown``)."""

    eviction_retry: float = 2.0
    """Seconds before asking again for an eviction a disruption budget refused (429).
    kubectl waits 5 s; a budget usually has room again a moment after a replacement pod
    turns Ready elsewhere, and one eviction request costs the API server little."""

    kubelet_stopped_after: float = 40.0
    """Seconds the kubelet's Lease must stay unrenewed, as metalmend observes it, before
    shutdown-kubelet calls the kubelet stopped. A kubelet renews every 10 s (a quarter of
    its 40 s lease); four missed renewals are not a slow API server."""

    shutdown_kubelet_timeout: float = 300.0
    """Seconds shutdown-kubelet waits for the kubelet to stop once the Node is labelled:
    the DaemonSet pod is created, its image pulled, then ``kubelet_stopped_after``."""

    etcd_poll_interval: float = 30.0
    """Seconds between looks at etcd health while decommission waits for the clusters to be
    stable (Airship's node teardown spec: "polls for status every 30 seconds"), up to the
    request's ``etcd-ready-timeout``."""
