"""Reading the Promenade node-teardown requests (Airship's node teardown spec): query
parameters, defaults, whole numbers, grace period below timeout, the design reference."""

from __future__ import annotations

import pytest

from metalmend.teardown import params
from metalmend.teardown.params import (
    ClearLabelsRequest,
    DecommissionRequest,
    DesignRef,
    DrainRequest,
    RemoveEtcdRequest,
    RequestRejected,
)

REF = {
    "rel": "design",
    "href": "deckhand+https://deckhand:9000/api/v1.0/revisions/3/rendered-documents",
    "type": "application/x-yaml",
}
REF_URL = DesignRef("design revision 3", revision=3)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        pytest.param([], DrainRequest(3600, 1800), id="defaults: timeout 3600, grace period 1800"),
        pytest.param(
            [("timeout", "60"), ("grace-period", "0")],
            DrainRequest(60, 0),
            id="both given; a zero grace period",
        ),
        pytest.param(
            [("grace-period", "3599")],
            DrainRequest(3600, 3599),
            id="grace period just below the default timeout",
        ),
        pytest.param(
            [("timeout", "1801")],
            DrainRequest(1801, 1800),
            id="timeout just above the default grace period",
        ),
    ],
)
def test_drain_requests(query: params.Query, expected: DrainRequest) -> None:
    assert params.drain(query) == expected


@pytest.mark.parametrize(
    ("query", "message"),
    [
        pytest.param(
            [("timeout", "60"), ("grace-period", "60")],
            "grace-period (60 s) must be less than timeout (60 s)",
            id="grace period equal to timeout",
        ),
        pytest.param(
            [("timeout", "1800")],
            "grace-period (1800 s) must be less than timeout (1800 s)",
            id="timeout not above the default grace period",
        ),
        pytest.param(
            [("grace-period", "4000")],
            "grace-period (4000 s) must be less than timeout (3600 s)",
            id="grace period above the default timeout",
        ),
        pytest.param(
            [("timeout", "1.5")],
            "timeout must be a whole number of seconds, not '1.5'",
            id="a fraction",
        ),
        pytest.param(
            [("timeout", "-1")],
            "timeout must be a whole number of seconds, not '-1'",
            id="negative",
        ),
        pytest.param(
            [("timeout", "+5")], "timeout must be a whole number of seconds, not '+5'", id="a sign"
        ),
        pytest.param(
            [("timeout", "")], "timeout must be a whole number of seconds, not ''", id="empty"
        ),
        pytest.param(
            [("timeout", "1e3")],
            "timeout must be a whole number of seconds, not '1e3'",
            id="exponent",
        ),
        pytest.param(
            [("timeout", "٣")],
            "timeout must be a whole number of seconds, not '٣'",
            id="a non-ASCII digit",
        ),
        pytest.param(
            [("timeout", "9" * 40)], "timeout must be at most 604800 seconds", id="absurdly large"
        ),
        pytest.param(
            [("grace_period", "10")],
            "unknown query parameter 'grace_period' (known: timeout, grace-period)",
            id="a typo is not silently the default",
        ),
        pytest.param(
            [("timeout", "60"), ("timeout", "70")],
            "query parameter 'timeout' is given more than once",
            id="given twice",
        ),
    ],
)
def test_drain_requests_that_cannot_work(query: params.Query, message: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        params.drain(query)
    assert message in refused.value.message
    assert refused.value.reason == "BadRequest"


def test_clear_labels_default_and_value() -> None:
    assert params.clear_labels([]) == ClearLabelsRequest(1800)
    assert params.clear_labels([("timeout", "0")]) == ClearLabelsRequest(0)


def test_steps_without_parameters_refuse_any() -> None:
    params.no_parameters([])
    with pytest.raises(RequestRejected, match="unknown query parameter 'force' \\(known: none\\)"):
        params.no_parameters([("force", "true")])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("n1", "n1", id="short name"),
        pytest.param("worker-0.rack1.example.com", "worker-0.rack1.example.com", id="dotted name"),
    ],
)
def test_node_names(raw: str, expected: str) -> None:
    assert params.node_name(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["N1", "-n1", "n1-", "a..b", "a_b", "a" * 254, ".."],
    ids=[
        "upper case",
        "leading dash",
        "trailing dash",
        "empty label",
        "underscore",
        "too long",
        "dots",
    ],
)
def test_names_that_no_node_can_have(raw: str) -> None:
    with pytest.raises(RequestRejected, match="is not a Node name"):
        params.node_name(raw)


def test_remove_etcd_reads_the_design_reference() -> None:
    assert params.remove_etcd([], REF) == RemoveEtcdRequest(REF_URL, 1800)
    assert params.remove_etcd([("timeout", "30")], {"href": "https://d/x"}) == RemoveEtcdRequest(
        DesignRef("https://d/x", url="https://d/x"), 30
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(None, "the body must be a design reference", id="no body"),
        pytest.param(["x"], "the body must be a design reference", id="a list"),
        pytest.param({"rel": "design"}, "the design reference has no href", id="no href"),
        pytest.param(
            {**REF, "rel": "self"}, "rel must be \"design\", not 'self'", id="another rel"
        ),
        pytest.param(
            {**REF, "type": "application/json"},
            'type must be "application/x-yaml"',
            id="another type",
        ),
        pytest.param(
            {**REF, "href": "ftp://d/x"},
            "design reference ftp://d/x: only deckhand+https://",
            id="another scheme",
        ),
        pytest.param({**REF, "href": "deckhand+https:///x"}, "is not a URL", id="no host"),
    ],
)
def test_design_references_that_cannot_work(document: object, message: str) -> None:
    with pytest.raises(RequestRejected) as refused:
        params.remove_etcd([], document)
    assert message in refused.value.message


def test_decommission_defaults_are_each_steps_own() -> None:
    assert params.decommission([], REF) == DecommissionRequest(
        REF_URL, DrainRequest(3600, 1800), ClearLabelsRequest(1800), 1800, 600
    )


def test_decommission_passes_each_parameter_to_its_step() -> None:
    query = [("drain-node-timeout", "100"), ("drain-node-grace-period", "10"), ("clear-labels-timeout", "20"),
             ("remove-etcd-timeout", "30"), ("etcd-ready-timeout", "40")]  # fmt: skip
    assert params.decommission(query, REF) == DecommissionRequest(
        REF_URL, DrainRequest(100, 10), ClearLabelsRequest(20), 30, 40
    )


def test_decommission_checks_the_drain_grace_period_against_its_timeout() -> None:
    with pytest.raises(
        RequestRejected,
        match="drain-node-grace-period \\(1800 s\\) must be less than drain-node-timeout \\(100 s\\)",
    ):
        params.decommission([("drain-node-timeout", "100")], REF)


def test_etcd_health_needs_a_design_ref() -> None:
    assert params.etcd_health([("design_ref", REF["href"])]) == REF_URL
    for query in ([], [("design_ref", " ")]):
        with pytest.raises(RequestRejected) as refused:
            params.etcd_health(query)
        assert refused.value.reason == "MissingDesignRef"
