"""Fuzzing the policies with every value the CRD schemas admit.

Strategies are built from the schema files themselves (``deploy/crds/*.yaml``): types,
enums, lengths, item counts, ``pattern``, int-or-string, date-time, and the format regex of
a ``self.matches('...')`` CEL rule. CEL rules that narrow further (ranges, maxima) are not
interpreted, so the values generated are a superset of what the API server admits: a
value it would refuse may be generated too, which only makes the property stronger.

The property: reading a spec and evaluating it raises nothing but the policy's own
``InvalidSpec``. Why not hypothesis-jsonschema: it knows neither int-or-string nor CEL, and
a page of code here does what these schemas need without a new dependency.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightkube.models.core_v1 import Node

from metalmend.api import names
from metalmend.api.reboot import reboot_requests
from metalmend.api.resources import Machine
from metalmend.controllers.healthcheck import parse_check, target_of
from metalmend.policy.healthcheck import (
    InvalidSpec,
    NodeCondition,
    RemediateBy,
    Target,
    Template,
    View,
    decide,
    evaluate,
)
from metalmend.policy.remediation import Spec

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
# Small and quick: this runs with the unit tests (a few seconds in all).
FUZZ = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MATCHES = re.compile(r"self\.matches\('((?:[^'\\]|\\.)*)'\)")
INT64 = 2**63 - 1


def rfc3339(moment: dt.datetime) -> str:
    """As the API server writes times (strftime does not pad years below 1000)."""
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def schema(crd: str, *path: str) -> dict[str, Any]:
    document = yaml.safe_load((CRDS / crd).read_text())
    node: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for step in path:
        node = node["properties"][step]
    return node


def _format_regex(node: dict[str, Any]) -> str | None:
    """The regex a string must match: ``pattern``, else the first ``self.matches`` rule
    (CEL string escapes undone: ``\\\\.`` in CEL is ``\\.`` in the regex)."""
    if "pattern" in node:
        return str(node["pattern"])
    for rule in node.get("x-kubernetes-validations") or []:
        if found := MATCHES.search(rule["rule"]):
            return found.group(1).replace("\\\\", "\\")
    return None


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = node.get("minLength", 0), node.get("maxLength", 64)
    if "enum" in node:
        return st.sampled_from([str(v) for v in node["enum"]])
    if node.get("format") == "date-time":
        moments = st.datetimes(
            min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
            timezones=st.just(dt.UTC),
        )  # fmt: skip
        return moments.map(rfc3339)
    if (regex := _format_regex(node)) is not None:
        matching = st.from_regex(regex, fullmatch=True)
        # Huge numbers are where the edges are (issue 18's 99999999h), and from_regex rarely
        # writes long digit runs by itself: also widen them, up to maxLength.
        widened = st.tuples(matching, st.sampled_from(range(1, high + 1))).map(
            lambda pair: re.sub("[0-9]+", "9" * pair[1], pair[0])
        )
        return st.one_of(matching, widened).filter(lambda s: low <= len(s) <= high)
    return st.text(min_size=low, max_size=min(high, 64))


def from_schema(node: dict[str, Any], dense: bool = False) -> st.SearchStrategy[Any]:
    """Values admitted by one openAPIV3Schema node (or a superset, see the module doc).
    ``dense``: every property present and lists not empty, so that a small example budget
    reaches the arithmetic that optional fields feed."""
    if dense:
        return st.one_of(_from_schema(node, dense=True), _from_schema(node, dense=False))
    return _from_schema(node, dense=False)


def _from_schema(node: dict[str, Any], dense: bool) -> st.SearchStrategy[Any]:
    if node.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(-INT64 - 1, INT64), _string(node))
    kind = node.get("type")
    if kind == "string":
        return _string(node)
    if kind == "integer":
        bounds = (-(2**31), 2**31 - 1) if node.get("format") == "int32" else (-INT64 - 1, INT64)
        return st.integers(node.get("minimum", bounds[0]), node.get("maximum", bounds[1]))
    if kind == "number":
        return st.floats(node.get("minimum"), node.get("maximum"), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        limit = min(node.get("maxItems", 4), 4)
        least = max(node.get("minItems", 0), 1 if dense else 0)
        return st.lists(_from_schema(node["items"], dense), min_size=least, max_size=limit)
    if kind == "object":
        properties = node.get("properties") or {}
        if not properties and "additionalProperties" in node:
            values = _from_schema(node["additionalProperties"], dense)
            return st.dictionaries(st.text(min_size=1, max_size=20), values, max_size=4)
        required = set(properties) if dense else set(node.get("required") or [])
        return st.fixed_dictionaries(
            {k: _from_schema(v, dense) for k, v in properties.items() if k in required},
            optional={
                k: _from_schema(v, dense) for k, v in properties.items() if k not in required
            },
        )
    return st.none()  # untyped (metadata): the tests supply what they need


# ---- MachineHealthCheck ----------------------------------------------------------------

MHC_SPEC = from_schema(schema("cluster.x-k8s.io_machinehealthchecks.yaml", "spec"), dense=True)
MACHINE_STATUS = from_schema(schema("cluster.x-k8s.io_machines.yaml", "status"), dense=True)
NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)
MOMENTS = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
)
# Anyone may write annotations: any text, and our own key with any value.
ANNOTATIONS = st.dictionaries(
    st.sampled_from(
        [names.REMEDIATE_MACHINE, names.SKIP_REMEDIATION, names.REMEDIATION_ENDED_AT, "x.io/other"]
    ),
    st.one_of(st.text(max_size=40), MOMENTS.map(lambda m: m.isoformat())),
    max_size=3,
)


def node_conditions(spec: dict[str, Any]) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Node conditions, often of the types and statuses the check looks for (a Node's
    conditions are any strings; only matching ones reach the timeout arithmetic)."""
    rules = [r for r in spec.get("unhealthyConditions") or [] if isinstance(r, dict)]
    named = [{"type": str(r.get("type")), "status": str(r.get("status"))} for r in rules]
    pairs = st.fixed_dictionaries(
        {"type": st.sampled_from(["Ready", "KernelDeadlock"]), "status": st.text(max_size=8)}
    )
    if named:
        pairs = st.one_of(st.sampled_from(named), pairs)
    times = st.fixed_dictionaries(
        {},
        optional={
            "lastTransitionTime": MOMENTS.map(rfc3339),
            "lastHeartbeatTime": MOMENTS.map(rfc3339),
        },
    )
    condition = st.tuples(pairs, times).map(lambda both: {**both[0], **both[1]})
    return st.lists(condition, max_size=3, unique_by=lambda c: c["type"])


@st.composite
def targets(draw: st.DrawFn, spec: dict[str, Any]) -> list[Any]:
    found = []
    for index in range(draw(st.integers(0, 4))):
        status = draw(MACHINE_STATUS)
        machine = Machine.from_dict(
            {
                "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
                "metadata": {
                    "name": f"m{index}", "namespace": "ns",
                    "creationTimestamp": rfc3339(draw(MOMENTS)),
                    "annotations": draw(ANNOTATIONS),
                },
                "spec": {"clusterName": "c"},
                "status": status,
            }
        )  # fmt: skip
        node_name = ((status or {}).get("nodeRef") or {}).get("name")
        node = None
        if node_name is not None and draw(st.booleans()):
            conditions = draw(node_conditions(spec))
            node = Node.from_dict(
                {"metadata": {"name": node_name}, "status": {"conditions": conditions}}
            )
        found.append(target_of(machine, node, NOW, draw(st.booleans())))
    return found


@FUZZ
@given(spec=MHC_SPEC, data=st.data(), now=MOMENTS)
def test_every_admitted_health_check_evaluates_or_raises_invalid_spec(
    spec: dict[str, Any], data: st.DataObject, now: dt.datetime
) -> None:
    pool = data.draw(targets(spec))
    try:
        check = parse_check(spec)
    except InvalidSpec:
        return
    result = evaluate(check, pool, now)
    assert 0 <= result.remediations_allowed <= 2**31 - 1
    assert result.healthy + result.unhealthy == result.expected == len(pool)
    by = data.draw(st.sampled_from(list(RemediateBy)))
    template = Template("remediation.metal3.io/v1alpha1", "Metal3Remediation", {})
    decision = decide(View(check, tuple(pool), remediate_by=by, template=template), now)
    assert decision.requeue_at == result.next_deadline


def test_the_fuzzed_domain_holds_the_values_that_broke() -> None:
    """The format the schema admits, as the strategies read it, includes issue 18's
    ``99999999h`` (OverflowError) and the longest string the schema admits."""
    spec = schema("cluster.x-k8s.io_machinehealthchecks.yaml", "spec")
    timeout = spec["properties"]["unhealthyConditions"]["items"]["properties"]["timeout"]
    startup = spec["properties"]["nodeStartupTimeout"]
    for node in (timeout, startup):
        regex = _format_regex(node)
        assert regex is not None
        assert re.fullmatch(regex, "99999999h")
        assert re.fullmatch(regex, "9" * 31 + "h")
        assert node["maxLength"] == 32


SPEC_SCHEMA = schema("cluster.x-k8s.io_machinehealthchecks.yaml", "spec")
CONDITION_TIMEOUTS = _string(
    SPEC_SCHEMA["properties"]["unhealthyConditions"]["items"]["properties"]["timeout"]
)
STARTUP_TIMEOUTS = _string(SPEC_SCHEMA["properties"]["nodeStartupTimeout"])


@FUZZ
@given(
    timeout=CONDITION_TIMEOUTS, startup=STARTUP_TIMEOUTS, since=MOMENTS, created=MOMENTS,
    now=MOMENTS,
)  # fmt: skip
def test_every_admitted_duration_reaches_a_verdict(
    timeout: str, startup: str, since: dt.datetime, created: dt.datetime, now: dt.datetime
) -> None:
    """The durations alone, each into the arithmetic it feeds: a Node whose condition
    matches the rule, and a Machine still without a Node (the full-spec fuzz above reaches
    these paths only now and then within its budget)."""
    spec = {
        "unhealthyConditions": [{"type": "Ready", "status": "Unknown", "timeout": timeout}],
        "nodeStartupTimeout": startup,
    }
    try:
        check = parse_check(spec)
    except InvalidSpec:
        return
    with_node = Target(
        machine="ns/a", created=created, node_ref="a", node_exists=True,
        conditions={"Ready": NodeCondition("Unknown", since)},
    )  # fmt: skip
    without_node = Target(machine="ns/b", created=created)
    result = evaluate(check, [with_node, without_node], now)
    assert result.verdicts["ns/a"].kind in ("unhealthy", "waiting")
    assert result.verdicts["ns/b"].kind in ("unhealthy", "waiting")


# ---- reboot annotations and Metal3Remediation specs ------------------------------------


@FUZZ
@given(
    annotations=st.dictionaries(
        st.sampled_from([names.REBOOT, names.REBOOT_PREFIX + "a", names.REBOOT_PREFIX, "x/y"]),
        st.one_of(
            st.text(max_size=80),
            st.from_regex(r"\{'mode': ?'[a-z]{0,6}'\}", fullmatch=True),
            st.integers(1, 5000).map(lambda depth: "[" * depth),  # nesting past json's limit
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["mode", "x"]), inner, max_size=2)
                ),
            ).map(lambda v: yaml.safe_dump(v, default_flow_style=True)),
        ),
        max_size=3,
    )
)
def test_every_reboot_annotation_parses_to_a_request_or_a_problem(
    annotations: dict[str, str],
) -> None:
    for request in reboot_requests(annotations):
        assert request.mode in ("soft", "hard")
        assert request.problem is None or request.mode == "soft"


REMEDIATION_SPEC = from_schema(schema("remediation.metal3.io_metal3remediations.yaml", "spec"))


@FUZZ
@given(spec=REMEDIATION_SPEC)
def test_every_admitted_remediation_spec_reads(spec: dict[str, Any]) -> None:
    read = Spec.from_wire(spec)
    assert read.strategy in ("reboot", "escalate")
    for seconds in (read.power_off_timeout, read.power_on_timeout):
        # Every admitted timeout is a deadline within the calendar from any time today.
        assert NOW + dt.timedelta(seconds=seconds) > NOW


@pytest.mark.parametrize("crd", sorted(p.name for p in CRDS.glob("*.yaml")))
def test_a_strategy_can_be_built_for_every_crd(crd: str) -> None:
    document = yaml.safe_load((CRDS / crd).read_text())
    for version in document["spec"]["versions"]:
        assert from_schema(version["schema"]["openAPIV3Schema"]) is not None
