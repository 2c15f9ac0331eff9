"""The annotation-driven machine remediation of metal3's "Annotation for Power Cycling and
Deleting Failed Nodes" design, as one pure function.

A Machine asks for remediation with the annotation ``host.metal3.io/external-remediation``;
its host (found through ``metal3.io/BareMetalHost``) is power-cycled with the reboot key
``reboot.metal3.io/machine-remediation``. No other state exists: after a crash, the
annotations alone say where the remediation is, so the table below resumes it.

The design's truth table, row for row ("powered on" is the host as the host controller
reports it; see ``Observed.powered_on`` for what "off" has to mean before a Node is
deleted):

| node ref | needs remediation | powered on | reboot key | action                     |
|:-:|:-:|:-:|:-:|---|
| 0 | 1 | 1 | 0 | add reboot annotation                                       |
| 1 | 1 | 1 | 0 | add reboot annotation                                       |
| 1 | 1 | 0 | 1 | delete node                                                 |
| 0 | 0 | 1 | 0 | nothing                                                     |
| 0 | 0 | 1 | 1 | nothing                                                     |
| 0 | 1 | 0 | 0 | nothing                                                     |
| 0 | 1 | 1 | 1 | nothing                                                     |
| 1 | 0 | 0 | 0 | nothing                                                     |
| 1 | 0 | 1 | 0 | nothing                                                     |
| 1 | 0 | 1 | 1 | nothing                                                     |
| 1 | 1 | 0 | 0 | nothing                                                     |
| 1 | 1 | 1 | 1 | nothing                                                     |
| 0 | 1 | 0 | 1 | remove needs-remediation annotation                         |
| 0 | 0 | 0 | 1 | remove reboot annotation                                    |
| 1 | 0 | 0 | 1 | remove reboot annotation                                    |
| 0 | 0 | 0 | 0 | nothing (the row the design omits)                          |
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.Enum):
    NOTHING = "nothing"
    ADD_REBOOT_ANNOTATION = "add reboot annotation"
    DELETE_NODE = "delete node"
    REMOVE_NEEDS_REMEDIATION = "remove needs-remediation annotation"
    REMOVE_REBOOT_ANNOTATION = "remove reboot annotation"


@dataclass(frozen=True)
class Observed:
    node_ref: bool  # Machine.status.nodeRef is set
    needs_remediation: bool  # the Machine carries host.metal3.io/external-remediation
    # The host is on, as far as remediation may rely on it. While the reboot key is set,
    # "off" means the host controller reported it off *for a pending reboot* (not merely an
    # old poweredOn=false that predates the request; see policy.fencing.reported_off).
    powered_on: bool
    reboot_annotation: bool  # the host carries reboot.metal3.io/machine-remediation


_A = Action
TRUTH_TABLE: dict[tuple[int, int, int, int], Action] = {
    (0, 1, 1, 0): _A.ADD_REBOOT_ANNOTATION,
    (1, 1, 1, 0): _A.ADD_REBOOT_ANNOTATION,
    (1, 1, 0, 1): _A.DELETE_NODE,
    (0, 0, 1, 0): _A.NOTHING,
    (0, 0, 1, 1): _A.NOTHING,
    (0, 1, 0, 0): _A.NOTHING,
    (0, 1, 1, 1): _A.NOTHING,
    (1, 0, 0, 0): _A.NOTHING,
    (1, 0, 1, 0): _A.NOTHING,
    (1, 0, 1, 1): _A.NOTHING,
    (1, 1, 0, 0): _A.NOTHING,
    (1, 1, 1, 1): _A.NOTHING,
    (0, 1, 0, 1): _A.REMOVE_NEEDS_REMEDIATION,
    (0, 0, 0, 1): _A.REMOVE_REBOOT_ANNOTATION,
    (1, 0, 0, 1): _A.REMOVE_REBOOT_ANNOTATION,
    (0, 0, 0, 0): _A.NOTHING,  # omitted by the design: nothing asked, nothing held
}


def decide(observed: Observed) -> Action:
    row = (
        int(observed.node_ref),
        int(observed.needs_remediation),
        int(observed.powered_on),
        int(observed.reboot_annotation),
    )
    return TRUTH_TABLE[row]
