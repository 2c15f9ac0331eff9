"""The design store's pure rules: what a document must be, what a put changes, how two
revisions differ, which documents a query selects. No database, no I/O."""

from __future__ import annotations

import pytest

from metalmend.designs import documents, rules
from metalmend.designs.documents import DocumentsRejected, parse
from metalmend.designs.rules import BucketChange, Entry, Placed


def doc(name: str, value: object = 1, schema: str = "promenade/Node/v1", **metadata: str) -> str:
    extra = "".join(f", {k}: {v}" for k, v in metadata.items())
    return (
        f"---\nschema: {schema}\nmetadata: {{schema: metadata/Document/v1, name: {name}{extra}}}\n"
        f"data: {{value: {value}}}\n"
    )


def rejected(text: str) -> list[str]:
    with pytest.raises(DocumentsRejected) as caught:
        parse(text)
    return caught.value.problems


# ---- documents ---------------------------------------------------------------------------


def test_a_valid_body_gives_one_document_per_yaml_document_with_its_identity() -> None:
    parsed = parse(doc("a") + doc("b", schema="drydock/Region/v1") + "---\n")
    assert [d.identity for d in parsed] == [("promenade/Node/v1", "a"), ("drydock/Region/v1", "b")]
    assert parsed[0].data == {"value": 1}


def test_the_digest_ignores_key_order_and_formatting_but_not_values() -> None:
    one = parse(
        "schema: a/B/v1\nmetadata: {name: n, schema: metadata/Control/v1}\ndata: {x: 1, y: 2}"
    )
    two = parse(
        "data:\n  y: 2\n  x: 1\nmetadata:\n  schema: metadata/Control/v1\n  name: n\nschema: a/B/v1"
    )
    three = parse(
        "schema: a/B/v1\nmetadata: {name: n, schema: metadata/Control/v1}\ndata: {x: 1, y: 3}"
    )
    assert one[0].digest == two[0].digest != three[0].digest


def test_malformed_yaml_is_refused_with_its_line() -> None:
    (problem,) = rejected(doc("a") + "---\nschema: [unclosed\n")
    assert "not valid YAML" in problem
    assert "line" in problem


def test_a_document_without_schema_or_name_is_refused_naming_the_document() -> None:
    problems = rejected(
        doc("a")
        + "---\nmetadata: {schema: metadata/Document/v1, name: b}\ndata: {}\n"
        + "---\nschema: x/Y/v1\nmetadata: {schema: metadata/Document/v1}\ndata: {}\n"
    )
    assert any(p.startswith("document 2 (line 6)") and "no schema" in p for p in problems)
    assert any(p.startswith("document 3 (line 9)") and "no metadata.name" in p for p in problems)


def test_a_duplicate_identity_in_one_put_is_refused_naming_both_documents() -> None:
    (problem,) = rejected(doc("a") + doc("b") + doc("a", value=2))
    assert problem.startswith("document 3 (line 10)")
    assert "is also document 1" in problem
    assert "name 'a'" in problem


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("- just\n- a list\n", "a document is a mapping, not a list"),
        (
            "schema: nope\nmetadata: {schema: metadata/Document/v1, name: a}\ndata: {}",
            "is not namespace/Kind/vN",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Other/v1, name: a}\ndata: {}",
            "metadata.schema must be",
        ),
        ("schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a}", "no data"),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a}\ndata: {}\nextra: 1",
            "unknown top-level key(s) extra",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a, labels: {a: [1]}}\ndata: {}",
            "metadata.labels",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a, storagePolicy: secret}\ndata: {}",
            "storagePolicy",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a}\ndata: {1: x}",
            "key '1' at data is not a string",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a}\ndata: {b: !!binary aGk=}",
            "data.b: a binary value cannot be stored",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: a}\ndata: {n: .nan}",
            "not a number JSON can hold",
        ),
        (
            'schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: "a\\0b"}\ndata: {}',
            "control characters",
        ),
        (
            "schema: a/B/v1\nmetadata: {schema: metadata/Document/v1, name: pw,"
            " storagePolicy: encrypted}\ndata: secret",
            "(schema a/B/v1, name 'pw'): metadata.storagePolicy is encrypted, but this store"
            " has no encryption",
        ),
    ],
)
def test_each_kind_of_bad_document_is_refused_saying_why(body: str, expected: str) -> None:
    problems = rejected(body)
    assert any(expected in p for p in problems), problems


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 10)}]")
    (problem,) = rejected("\n".join(lines))
    assert "aliases are expanded" in problem


def test_a_self_referencing_alias_is_refused() -> None:
    (problem,) = rejected("a: &a [*a]")
    assert "contains itself" in problem


def test_dates_stay_the_strings_they_were_written_as() -> None:
    (parsed,) = parse(
        "schema: a/B/v1\nmetadata: {schema: metadata/Control/v1, name: a}\ndata: {date: 2026-11-23}"
    )
    assert parsed.data == {"date": "2026-11-23"}


def test_a_document_read_from_the_store_can_be_put_back_unchanged() -> None:
    (original,) = parse(doc("a"))
    echoed = documents.dump_all([original.to_wire("site", 3)])
    (again,) = parse(echoed)
    assert again.digest == original.digest


@pytest.mark.parametrize("name", ["", "a/b", "a b", "-x", "x" * 256])
def test_bucket_and_tag_names_are_path_segments(name: str) -> None:
    with pytest.raises(DocumentsRejected):
        documents.path_name(name, "bucket")


def test_tag_data_is_an_optional_mapping() -> None:
    assert documents.tag_data("") == {}
    assert documents.tag_data("a: b\n") == {"a": "b"}
    with pytest.raises(DocumentsRejected, match="must be a mapping"):
        documents.tag_data("- a\n")


# ---- puts ---------------------------------------------------------------------------------


def placed(bucket: str, name: str, digest: str, revision: int) -> Placed:
    return Placed(bucket, ("promenade/Node/v1", name), digest, revision)


def test_a_put_of_what_the_bucket_holds_changes_nothing() -> None:
    a, b = parse(doc("a") + doc("b"))
    head = [placed("site", "a", a.digest, 1), placed("site", "b", b.digest, 2)]
    plan = rules.plan_put(head, "site", [a, b])
    assert not plan.changed
    assert [r for _, r in plan.mine] == [1, 2]


def test_a_put_changes_documents_that_differ_and_deletes_those_left_out() -> None:
    a, b = parse(doc("a") + doc("b", value=2))
    head = [
        placed("site", "a", a.digest, 1),
        placed("site", "b", "old", 1),
        placed("site", "c", "x", 1),
    ]
    plan = rules.plan_put(head, "site", [a, b])
    assert plan.changed
    assert [(d.name, r) for d, r in plan.mine] == [("a", 1), ("b", None)]
    assert not rules.plan_put(head[:2], "site", [a]).elsewhere
    assert rules.plan_put(head, "site", [a]).changed  # b and c deleted


def test_a_document_living_in_another_bucket_is_a_conflict() -> None:
    (a,) = parse(doc("a"))
    plan = rules.plan_put([placed("global", "a", a.digest, 1)], "site", [a])
    assert plan.elsewhere == ((("promenade/Node/v1", "a"), "global"),)
    (line,) = rules.conflict_lines(plan.elsewhere, "site")
    assert "lives in bucket global" in line
    # Deckhand's own words (its DuplicateDocumentExists): schema, layer, name, bucket.
    assert rules.conflict_message(plan.elsewhere, [a]) == (
        "Document [promenade/Node/v1, None] a already exists in bucket: global"
    )
    (b,) = parse(doc("b", layeringDefinition="{layer: site}"))
    two = rules.plan_put(
        [placed("global", "a", "x", 1), placed("other", "b", "y", 1)], "site", [a, b]
    )
    assert rules.conflict_message(two.elsewhere, [a, b]).endswith(
        "in bucket: global (and 1 more document(s) in other buckets)"
    )


def test_rollback_keeps_the_revision_of_what_did_not_change() -> None:
    head = [placed("site", "a", "1", 3), placed("site", "b", "2", 4)]
    target = [
        placed("site", "a", "1", 1),
        placed("site", "b", "old", 1),
        placed("other", "c", "3", 1),
    ]
    assert rules.rollback_revisions(head, target) == [3, None, None]


# ---- diffs -------------------------------------------------------------------------------


def test_the_diff_names_every_bucket_of_either_revision() -> None:
    older = rules.contents_of(
        [placed("kept", "a", "1", 1), placed("changed", "b", "1", 1), placed("gone", "c", "1", 1)]
    )
    newer = rules.contents_of(
        [placed("kept", "a", "1", 1), placed("changed", "b", "2", 2), placed("new", "d", "1", 2)]
    )
    assert rules.bucket_diff(older, newer) == {
        "changed": BucketChange.MODIFIED,
        "gone": BucketChange.DELETED,
        "kept": BucketChange.UNMODIFIED,
        "new": BucketChange.CREATED,
    }


def test_against_the_empty_revision_everything_is_created() -> None:
    newer = rules.contents_of([placed("a", "x", "1", 1), placed("b", "y", "1", 1)])
    assert set(rules.bucket_diff({}, newer).values()) == {BucketChange.CREATED}


def test_a_document_moved_between_documents_of_a_bucket_is_a_modification() -> None:
    older = rules.contents_of([placed("site", "a", "1", 1)])
    newer = rules.contents_of([placed("site", "b", "1", 2)])
    assert rules.bucket_diff(older, newer) == {"site": BucketChange.MODIFIED}


# ---- queries -----------------------------------------------------------------------------


def entries() -> list[Entry]:
    body = (
        doc("n1", schema="promenade/Node/v1", labels="{role: worker, rack: r1}")
        + doc("n2", schema="promenade/Node/v1", labels="{role: master}")
        + doc(
            "base",
            schema="promenade/Genesis/v1",
            layeringDefinition="{abstract: true, layer: global}",
        )
        + doc("p1", schema="prometheus/Rule/v1", layeringDefinition="{layer: site}")
    )
    parsed = parse(body)
    return [Entry("site" if d.name != "p1" else "global", 1, d) for d in parsed]


def names(query: list[tuple[str, str]], rendered: bool = False) -> list[str]:
    chosen = rules.select(entries(), rules.document_query(query, rendered), rendered)
    return [e.document.name for e in chosen]


@pytest.mark.parametrize(
    ("wanted", "schema", "matches"),
    [
        ("promenade", "promenade/Node/v1", True),
        ("promenade/Node", "promenade/Node/v1", True),
        ("promenade/Node/v1", "promenade/Node/v1", True),
        ("prom", "promenade/Node/v1", False),
        ("promenade/No", "promenade/Node/v1", False),
        ("promenade/Node/v1/extra", "promenade/Node/v1", False),
    ],
)
def test_schema_filters_match_whole_segments(wanted: str, schema: str, matches: bool) -> None:
    assert rules.schema_matches(wanted, schema) is matches


def test_filters_combine() -> None:
    assert names([("schema", "promenade")]) == ["base", "n1", "n2"]
    assert names([("schema", "prom")]) == []
    assert names([("metadata.name", "n2")]) == ["n2"]
    assert names([("metadata.label", "role=worker"), ("metadata.label", "rack=r1")]) == ["n1"]
    assert names([("metadata.label", "role=worker"), ("metadata.label", "rack=r2")]) == []
    assert names([("status.bucket", "global"), ("status.bucket", "nowhere")]) == ["p1"]
    assert names([("metadata.layeringDefinition.abstract", "true")]) == ["base"]
    assert names([("metadata.layeringDefinition.layer", "site")]) == ["p1"]
    assert names([("sort", "metadata.name"), ("order", "desc"), ("limit", "2")]) == ["p1", "n2"]


def test_rendered_documents_leave_abstract_ones_out() -> None:
    assert "base" not in names([], rendered=True)
    assert "base" in names([])


@pytest.mark.parametrize(
    "query",
    [
        [("schmea", "x")],
        [("metadata.label", "novalue")],
        [("limit", "-2")],
        [("limit", "illegal")],
        [("limit", "2.5")],
        [("limit", "1"), ("limit", "2")],
        [("order", "up")],
        [("order", "asc"), ("order", "desc")],
        [("sort", "data")],
        [("metadata.layeringDefinition.abstract", "yes")],
    ],
)
def test_a_bad_query_is_refused_not_ignored(query: list[tuple[str, str]]) -> None:
    with pytest.raises(DocumentsRejected):
        rules.document_query(query)


def test_rendered_documents_take_no_layering_filters() -> None:
    with pytest.raises(DocumentsRejected, match="unknown query parameter"):
        rules.document_query([("metadata.layeringDefinition.layer", "site")], rendered=True)


def test_one_filter_repeated_matches_any_of_its_values_as_deckhand() -> None:
    # Deckhand's deepfilter: a repeated filter is a list, matched by intersection (OR);
    # metadata.label alone is a mapping every pair of which must match (AND).
    assert names([("metadata.name", "n1"), ("metadata.name", "p1")]) == ["p1", "n1"]
    assert names([("schema", "prometheus"), ("schema", "promenade/Genesis")]) == ["p1", "base"]
    assert names(
        [
            ("metadata.layeringDefinition.layer", "site"),
            ("metadata.layeringDefinition.layer", "global"),
        ]
    ) == ["p1", "base"]  # the default sort: bucket (global, site), schema, name
    both = [("metadata.layeringDefinition.abstract", v) for v in ("true", "false")]
    assert names(both) == names([])
    # Different filters all apply.
    assert names([("schema", "promenade"), ("metadata.layeringDefinition.abstract", "false")]) == [
        "n1",
        "n2",
    ]
    assert names([("metadata.name", "n1"), ("metadata.name", "n1")]) == ["n1"]


@pytest.mark.parametrize(
    "query",
    [
        [("schema", "prom")],  # a partial namespace
        [("schema", "promenade/No")],  # a partial kind
        [("schema", "promenade/Node/v2")],  # another version
        [("metadata.name", "nobody")],
        [("metadata.label", "role=worker"), ("metadata.label", "role=master")],
        [("status.bucket", "nowhere")],
        [("metadata.layeringDefinition.layer", "region")],
        [("schema", "prometheus"), ("metadata.name", "n1")],
        [("limit", "0")],  # Deckhand's documents[:0]
    ],
)
def test_a_filter_nothing_satisfies_selects_nothing_without_an_error(
    query: list[tuple[str, str]],
) -> None:
    assert names(query) == []


def test_limit_counts_after_sorting_and_past_every_document_is_no_limit() -> None:
    ordered = [("sort", "metadata.name"), ("sort", "schema")]
    assert names([*ordered, ("limit", "2")]) == ["base", "n1"]
    assert names([*ordered, ("limit", "9" * 40)]) == ["base", "n1", "n2", "p1"]


def test_revision_queries() -> None:
    assert rules.revision_query(
        [("tag", "a"), ("tag", "b"), ("order", "desc")]
    ) == rules.RevisionQuery(("a", "b"), ("id",), True)
    assert rules.revision_query(
        [("sort", "createdAt"), ("sort", "id"), ("sort", "created_at")]
    ) == rules.RevisionQuery((), ("createdAt", "id"), False)
    for bad in ([("tags", "a")], [("sort", "name")], [("order", "up")], [("order", "a")] * 2):
        with pytest.raises(DocumentsRejected):
            rules.revision_query(bad)


@pytest.mark.parametrize(
    ("metadata", "answered"),
    [
        (
            {"name": "a"},
            {"name": "a", "storagePolicy": "cleartext", "layeringDefinition": {"abstract": False}},
        ),
        (
            {"name": "a", "storagePolicy": "cleartext", "layeringDefinition": {"layer": "site"}},
            {
                "name": "a",
                "storagePolicy": "cleartext",
                "layeringDefinition": {"layer": "site", "abstract": False},
            },
        ),
        (
            {"name": "a", "storagePolicy": "cleartext", "layeringDefinition": {"abstract": True}},
            {"name": "a", "storagePolicy": "cleartext", "layeringDefinition": {"abstract": True}},
        ),
        (
            {"name": "a", "storagePolicy": "", "layeringDefinition": {"abstract": False}},
            {"name": "a", "storagePolicy": "cleartext", "layeringDefinition": {"abstract": False}},
        ),
    ],
    ids=["neither", "layer-only", "abstract-kept", "empty-policy"],
)
def test_documents_are_answered_with_deckhands_metadata_defaults(
    metadata: dict[str, object], answered: dict[str, object]
) -> None:
    """Deckhand's ``_fill_in_metadata_defaults``: on the way out for a document stored
    before they were filled in at the put (``make`` stores what it is given)."""
    document = documents.make("a/B/v1", metadata, {})
    assert document.to_wire("site", 3)["metadata"] == answered
    assert dict(document.metadata) == metadata


def test_a_put_fills_in_deckhands_defaults_so_either_spelling_is_one_document() -> None:
    (bare,) = parse(doc("a"))
    (spelt,) = parse(
        "schema: promenade/Node/v1\nmetadata: {schema: metadata/Document/v1, name: a,"
        " storagePolicy: cleartext, layeringDefinition: {abstract: false}}\ndata: {value: 1}"
    )
    assert bare.metadata["storagePolicy"] == "cleartext"
    assert bare.metadata["layeringDefinition"] == {"abstract": False}
    assert bare.digest == spelt.digest
