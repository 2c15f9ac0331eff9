"""node-link's rule: which Node is a Machine's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from metalmend.policy.nodelink import desired_node_ref


def node(name: str, uid: str = "u1") -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name=name, uid=uid))


@pytest.mark.parametrize(
    ("provider_id", "by_provider", "by_name", "expected"),
    [
        pytest.param("metal3://ns/h1", {"metal3://ns/h1": node("n1")}, {}, "n1", id="providerID match"),
        pytest.param(None, {}, {"m": node("m")}, "m", id="no providerID: same name"),
        pytest.param("metal3://ns/h1", {}, {"m": node("m")}, None, id="providerID without match does not fall back to the name"),
        pytest.param(None, {}, {}, None, id="no Node: no nodeRef"),
    ],
)  # fmt: skip
def test_node_ref(
    provider_id: str | None,
    by_provider: dict[str, Any],
    by_name: dict[str, Any],
    expected: str | None,
) -> None:
    ref = desired_node_ref(provider_id, "m", by_provider, by_name)
    assert (ref or {}).get("name") == expected
    if ref:
        assert ref["kind"] == "Node"
        assert ref["uid"] == "u1"
