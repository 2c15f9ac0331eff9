"""The truth table of metal3's annotation-based remediation design ("Annotation for Power
Cycling and Deleting Failed Nodes"), one test per row (and the row the design omits)."""

from __future__ import annotations

import itertools

import pytest

from metalmend.policy.machineremediation import TRUTH_TABLE, Action, Observed, decide

A = Action
DESIGN_ROWS = [  # node ref, needs remediation, powered on, reboot annotation -> action
    ((0, 1, 1, 0), A.ADD_REBOOT_ANNOTATION),
    ((1, 1, 1, 0), A.ADD_REBOOT_ANNOTATION),
    ((1, 1, 0, 1), A.DELETE_NODE),
    ((0, 0, 1, 0), A.NOTHING),
    ((0, 0, 1, 1), A.NOTHING),
    ((0, 1, 0, 0), A.NOTHING),
    ((0, 1, 1, 1), A.NOTHING),
    ((1, 0, 0, 0), A.NOTHING),
    ((1, 0, 1, 0), A.NOTHING),
    ((1, 0, 1, 1), A.NOTHING),
    ((1, 1, 0, 0), A.NOTHING),
    ((1, 1, 1, 1), A.NOTHING),
    ((0, 1, 0, 1), A.REMOVE_NEEDS_REMEDIATION),
    ((0, 0, 0, 1), A.REMOVE_REBOOT_ANNOTATION),
    ((1, 0, 0, 1), A.REMOVE_REBOOT_ANNOTATION),
]


@pytest.mark.parametrize(
    ("row", "action"), DESIGN_ROWS, ids=["".join(map(str, r)) for r, _ in DESIGN_ROWS]
)
def test_truth_table_row(row: tuple[int, int, int, int], action: Action) -> None:
    node_ref, needs, powered_on, reboot = row
    observed = Observed(bool(node_ref), bool(needs), bool(powered_on), bool(reboot))
    assert decide(observed) is action


def test_the_row_the_design_omits_does_nothing() -> None:
    assert decide(Observed(False, False, False, False)) is A.NOTHING


def test_table_covers_every_combination_once() -> None:
    assert sorted(TRUTH_TABLE) == sorted(itertools.product((0, 1), repeat=4))
    assert len(DESIGN_ROWS) == 15


def test_node_deleted_only_while_host_off_and_held() -> None:
    for row, action in TRUTH_TABLE.items():
        if action is A.DELETE_NODE:
            assert row[2] == 0
            assert row[3] == 1
