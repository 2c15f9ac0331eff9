"""What a destroy_nodes request may say (metalmend.destroy.model; docs/destroy.md)."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.destroy.model import MAX_NODES, RequestProblem, node_names, read_request


def body(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "action": "destroy_nodes",
        "design_ref": "deckhand+https://d/revisions/1/rendered-documents",
        "node_filter": {"filter_set": [{"node_names": ["a"]}]},
    }
    return {**base, **changes}


def test_a_request_reads_its_nodes_and_preserve_defaults_to_false() -> None:
    wanted = read_request(body())
    assert (wanted.nodes, wanted.preserve_local_storage) == (("a",), False)
    assert read_request(body(**{"preserve-local-storage": True})).preserve_local_storage


@pytest.mark.parametrize(
    ("node_filter", "nodes"),
    [
        pytest.param({"filter_set": [{"node_names": ["a", "b", "a"]}]}, ("a", "b"), id="names-once-each"),
        pytest.param(
            {"filter_set_type": "union", "filter_set": [{"node_names": ["a"]}, {"node_names": ["b", "a"]}]},
            ("a", "b"), id="union-of-sets",
        ),
        pytest.param(
            {"filter_set_type": "intersection",
             "filter_set": [{"node_names": ["a", "b"]}, {"node_names": ["b", "c"]}]},
            ("b",), id="intersection-of-sets",
        ),
    ],
)  # fmt: skip
def test_node_filter_sets_combine_as_in_drydock(node_filter: Any, nodes: tuple[str, ...]) -> None:
    assert node_names(node_filter) == nodes


@pytest.mark.parametrize(
    ("node_filter", "says"),
    [
        pytest.param(None, "would select every node", id="null-selects-everything-refused"),
        pytest.param({"filter_set": []}, "non-empty list", id="empty-filter-set"),
        pytest.param({"filter_set": [{"rack_names": ["r1"]}]}, "rack_names not supported", id="racks"),
        pytest.param({"filter_set": [{"node_labels": {"a": "b"}}]}, "node_labels not supported", id="labels"),
        pytest.param({"filter_set": [{"node_names": ["a"], "x": 1}]}, "unknown field", id="unknown-key"),
        pytest.param({"filter_set_type": "both", "filter_set": [{"node_names": ["a"]}]},
                     "union or intersection", id="bad-set-type"),
        pytest.param({"filter_set_type": "intersection",
                      "filter_set": [{"node_names": ["a"]}, {"node_names": ["b"]}]},
                     "selects no node", id="empty-intersection"),
        pytest.param({"filter_set": [{"node_names": ["../etc"]}]}, "not a valid Node name", id="hostile-name"),
        pytest.param({"filter_set": [{"node_names": [f"n{i}" for i in range(MAX_NODES + 1)]}]},
                     f"at most {MAX_NODES}", id="too-many-nodes"),
    ],
)  # fmt: skip
def test_node_filters_metalmend_will_not_run_are_refused(node_filter: Any, says: str) -> None:
    with pytest.raises(RequestProblem, match=says):
        node_names(node_filter)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        pytest.param({"action": "prepare_nodes"}, "prepare_nodes is not served", id="other-action"),
        pytest.param({"action": 7}, "action must be destroy_nodes", id="not-an-action"),
        pytest.param({"design_ref": ""}, "design_ref must be a URL", id="no-design-ref"),
        pytest.param(
            {"design_ref": "https://admin:s3cret@d/revisions/1/rendered-documents"},
            "design_ref must not carry a user name or password",
            id="design-ref-with-password",
        ),
        pytest.param({"preserve-local-storage": "true"}, "true or false", id="preserve-not-bool"),
        pytest.param({"options": {}}, "unknown field", id="unknown-field"),
    ],
)
def test_requests_metalmend_will_not_run_are_refused(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(RequestProblem, match=says):
        read_request(body(**changes))
