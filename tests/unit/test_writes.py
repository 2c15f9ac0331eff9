"""The smallest merge patch between two documents: empty means "write nothing"."""

from __future__ import annotations

from metalmend.kube.writes import merge_patch


def test_no_change_no_patch() -> None:
    status = {"poweredOn": True, "provisioning": {"state": "provisioned"}}
    assert merge_patch(status, dict(status)) == {}


def test_changed_nested_value_only() -> None:
    current = {"poweredOn": True, "provisioning": {"state": "provisioned", "ID": "x"}}
    desired = {"poweredOn": True, "provisioning": {"state": "provisioned", "ID": "y"}}
    assert merge_patch(current, desired) == {"provisioning": {"ID": "y"}}


def test_removed_key_becomes_null() -> None:
    assert merge_patch({"errorMessage": "boom", "errorCount": 2}, {"errorCount": 2}) == {
        "errorMessage": None
    }


def test_lists_are_replaced_whole() -> None:
    assert merge_patch({"targets": ["a"]}, {"targets": ["a", "b"]}) == {"targets": ["a", "b"]}
