"""Design documents as Deckhand takes them (no I/O): multi-document YAML read and checked,
each document's identity, its canonical form and digest, and YAML out again.

A document is exactly ``schema`` (``namespace/Kind/vN``), ``metadata`` (``schema``:
``metadata/Document/v1`` or ``metadata/Control/v1``, ``name``; ``labels`` a mapping of
strings, ``layeringDefinition`` a mapping, ``storagePolicy`` cleartext or encrypted, when
given) and ``data``. Its identity is (``schema``, ``metadata.name``). A ``status`` that
a document read from this store carries is dropped on the way in, so that what was read
can be put back.

Every value must survive JSON (the stored form): mapping keys are strings, no YAML
timestamps (read as strings), no binary, no NaN. YAML is read by ``yamlsafe``: a body
nested too deeply, holding too many documents or values, or that its aliases would expand
past the limits, is refused before it is composed (``YamlLimits``).

``storagePolicy: encrypted`` is refused: this store has no encryption, and would keep and
serve such a document in cleartext.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from metalmend import yamlsafe
from metalmend.yamlsafe import YamlLimits

DOCUMENT_METADATA = "metadata/Document/v1"
CONTROL_METADATA = "metadata/Control/v1"
METADATA_SCHEMAS = (DOCUMENT_METADATA, CONTROL_METADATA)
ENCRYPTED = "encrypted"  # refused: no encryption here (docs/design-store.md)
STORAGE_POLICIES = ("cleartext", ENCRYPTED)
TOP_LEVEL = ("schema", "metadata", "data")
IGNORED_TOP_LEVEL = ("status",)  # what this store adds on the way out
NAME_LIMIT = 255
MAX_PROBLEMS = 100  # listed in one refusal; the count of the others follows

_SCHEMA = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/v[0-9]+(\.[0-9]+)?")
# Buckets and tags are path segments: letters, digits and - _ . (no / no space).
_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

Identity = tuple[str, str]  # (schema, metadata.name)


@dataclass(frozen=True)
class Document:
    """One document as stored: ``body`` is its canonical JSON, ``digest`` its SHA-256."""

    schema: str
    name: str
    metadata: Mapping[str, Any]
    data: Any
    body: str
    digest: str

    @property
    def identity(self) -> Identity:
        return (self.schema, self.name)

    @property
    def labels(self) -> Mapping[str, Any]:
        labels = self.metadata.get("labels")
        return labels if isinstance(labels, Mapping) else {}

    @property
    def layering(self) -> Mapping[str, Any]:
        layering = self.metadata.get("layeringDefinition")
        return layering if isinstance(layering, Mapping) else {}

    @property
    def abstract(self) -> bool:
        return self.layering.get("abstract") is True

    def to_wire(self, bucket: str, revision: int) -> dict[str, Any]:
        """The document as Deckhand answers it: with ``status``, and with Deckhand's
        metadata defaults (``with_defaults``: a document put since they are filled in at
        the put has them already; one stored before gets them here)."""
        return {
            "schema": self.schema,
            "metadata": with_defaults(self.metadata),
            "data": self.data,
            "status": {"bucket": bucket, "revision": revision},
        }


def with_defaults(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with Deckhand's defaults filled in where absent, as Deckhand stores
    every document (airshipit/deckhand ``deckhand/db/sqlalchemy/api.py``,
    ``_fill_in_metadata_defaults``): ``storagePolicy: cleartext`` and
    ``layeringDefinition.abstract: false``. Filled in when a document is put (``check``),
    so that a document read back and put again, or put with the defaults spelt out, is
    unchanged, as in Deckhand; and on the way out (``Document.to_wire``) for documents
    stored before (docs/design-store.md, "Migrations")."""
    filled = dict(metadata)
    if not filled.get("storagePolicy"):
        filled["storagePolicy"] = "cleartext"
    layering = filled.get("layeringDefinition")
    if layering is None:
        filled["layeringDefinition"] = {"abstract": False}
    elif isinstance(layering, Mapping) and "abstract" not in layering:
        filled["layeringDefinition"] = {**layering, "abstract": False}
    return filled


class DocumentsRejected(ValueError):
    """A body that cannot be stored: one line per problem, each naming its document."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def from_stored(body: str, digest: str) -> Document:
    """A document from its stored canonical JSON (checked when it was put)."""
    raw = json.loads(body)
    metadata = raw["metadata"]
    return Document(raw["schema"], metadata["name"], metadata, raw["data"], body, digest)


def make(schema: str, metadata: Mapping[str, Any], data: Any) -> Document:
    body = canonical({"schema": schema, "metadata": metadata, "data": data})
    digest = hashlib.sha256(body.encode()).hexdigest()
    return Document(schema, str(metadata["name"]), metadata, data, body, digest)


# --- YAML in ------------------------------------------------------------------------------


def _raw_documents(text: str, limits: YamlLimits | None) -> Iterator[tuple[int, int, Any]]:
    """(position from 1, line from 1, value) per YAML document; empty documents skipped."""
    for position, line, value in yamlsafe.documents(text, limits, yamlsafe.DocumentLoader):
        if value is not None:  # an empty document (``---`` twice): nothing to store
            yield position, line, value


def parse(text: str, limits: YamlLimits | None = None) -> list[Document]:
    """The documents of a multi-document YAML body, every one checked; DocumentsRejected
    lists the problems found (the first MAX_PROBLEMS; a YAML error, or a body past one of
    ``limits``, stops the reading where it is)."""
    problems: list[str] = []
    documents: list[Document] = []
    seen: dict[Identity, int] = {}
    try:
        for position, line, raw in _raw_documents(text, limits):
            where = f"document {position} (line {line})"
            try:
                document = check(raw, where)
            except DocumentsRejected as rejected:
                problems.extend(rejected.problems)
                continue
            first = seen.setdefault(document.identity, position)
            if first != position:
                problems.append(
                    f"{where}: schema {document.schema} name {document.name!r} is also"
                    f" document {first}: each (schema, name) once per bucket"
                )
                continue
            documents.append(document)
    except yamlsafe.YamlRefused as error:
        problems.append(f"the body is past a limit of this service: {error}")
    except yaml.YAMLError as error:
        problems.append(f"the body is not valid YAML: {_yaml_error(error)}")
    if problems:
        raise DocumentsRejected(_first(problems))
    return documents


def _first(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    more = len(problems) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], f"... and {more} more problem(s) not listed"]


def _yaml_error(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def check(raw: Any, where: str) -> Document:
    """One document read from YAML, checked: a Document, or DocumentsRejected naming
    ``where`` (and the document's schema and name, when it has them)."""
    if not isinstance(raw, dict):
        raise DocumentsRejected([f"{where}: a document is a mapping, not {_kind(raw)}"])
    schema, metadata = raw.get("schema"), raw.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = where
    if isinstance(schema, str) and isinstance(name, str):
        label = f"{where} (schema {schema[:NAME_LIMIT]}, name {name[:NAME_LIMIT]!r})"
    problems = [f"{label}: {p}" for p in _problems(raw)]
    if problems:
        raise DocumentsRejected(problems)
    content = {k: raw[k] for k in TOP_LEVEL}
    return make(content["schema"], with_defaults(content["metadata"]), content["data"])


def _problems(raw: dict[Any, Any]) -> Iterator[str]:
    unknown = [str(k) for k in raw if k not in TOP_LEVEL and k not in IGNORED_TOP_LEVEL]
    if unknown:
        allowed = ", ".join(TOP_LEVEL)
        yield f"unknown top-level key(s) {', '.join(unknown)} (a document has {allowed})"
    schema = raw.get("schema")
    if schema is None:
        yield "no schema"
    elif not isinstance(schema, str) or len(schema) > NAME_LIMIT or not _SCHEMA.fullmatch(schema):
        yield f"schema {str(schema)[:80]!r} is not namespace/Kind/vN"
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict):
        yield "no metadata mapping" if metadata is None else "metadata is not a mapping"
    else:
        yield from _metadata_problems(metadata)
    if "data" not in raw:
        yield "no data (write data: {} for none)"
    yield from _json_problems(raw, "")


def _metadata_problems(metadata: dict[Any, Any]) -> Iterator[str]:
    kind = metadata.get("schema")
    if kind not in METADATA_SCHEMAS:
        yield f"metadata.schema must be {' or '.join(METADATA_SCHEMAS)}, not {str(kind)[:80]!r}"
    name = metadata.get("name")
    if name is None:
        yield "no metadata.name"
    elif not isinstance(name, str) or not name.strip() or len(name) > NAME_LIMIT:
        yield f"metadata.name must be a non-empty string of at most {NAME_LIMIT} characters"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        yield "metadata.name must not contain control characters"
    labels = metadata.get("labels")
    if labels is not None and not (
        isinstance(labels, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        yield "metadata.labels must map strings to strings"
    layering = metadata.get("layeringDefinition")
    if layering is not None and not isinstance(layering, dict):
        yield "metadata.layeringDefinition must be a mapping"
    policy = metadata.get("storagePolicy")
    if policy == ENCRYPTED:
        yield (
            "metadata.storagePolicy is encrypted, but this store has no encryption: it would"
            " keep and serve the document in cleartext (keep secrets out of the design)"
        )
    elif policy is not None and policy not in STORAGE_POLICIES:
        yield f"metadata.storagePolicy must be {' or '.join(STORAGE_POLICIES)}"


def _json_problems(value: Any, path: str) -> Iterator[str]:
    """What JSON cannot hold, the first few with where (an iterative walk: no recursion)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    found = 0
    while stack and found < 3:
        item, at = stack.pop()
        problem = None
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    problem = f"key {str(key)[:40]!r} at {at or '.'} is not a string"
                    break
                stack.append((child, f"{at}.{key}" if at else key))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, float) and not math.isfinite(item):
            problem = f"{at}: {item} is not a number JSON can hold"
        elif not isinstance(item, str | int | float | bool) and item is not None:
            problem = f"{at}: a {_kind(item)} value cannot be stored (write it as a string)"
        if problem:
            found += 1
            yield problem


def _kind(value: Any) -> str:
    names = {list: "a list", str: "a string", int: "a number", float: "a number",
             bool: "a boolean", bytes: "binary", set: "a set", type(None): "empty"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


# --- YAML out ----------------------------------------------------------------------------

_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_all(documents: list[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in the order given (schema, metadata, data, status)."""
    return yaml.dump_all(
        documents, Dumper=_DUMPER, sort_keys=False, default_flow_style=False,
        explicit_start=True, allow_unicode=True,
    )  # fmt: skip


def dump(value: Any) -> str:
    return yaml.dump(
        value, Dumper=_DUMPER, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def path_name(raw: str, what: str) -> str:
    """A bucket's or a tag's name: a path segment of letters, digits and - _ ."""
    if len(raw) > NAME_LIMIT or not _PATH_NAME.fullmatch(raw):
        raise DocumentsRejected(
            [f"{what} {raw[:80]!r} is not a name: letters, digits, '-', '_' and '.',"
             f" at most {NAME_LIMIT} characters, starting with a letter or digit"]
        )  # fmt: skip
    return raw


def tag_data(text: str, limits: YamlLimits | None = None) -> dict[str, Any]:
    """A tag's body: empty, or a YAML (or JSON) mapping."""
    if not text.strip():
        return {}
    try:
        raw = next(_raw_documents(text, limits), (0, 0, None))[2]
    except yamlsafe.YamlRefused as error:
        problem = f"the tag's data is past a limit of this service: {error}"
        raise DocumentsRejected([problem]) from None
    except yaml.YAMLError as error:
        raise DocumentsRejected(
            [f"the tag's data is not valid YAML: {_yaml_error(error)}"]
        ) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise DocumentsRejected([f"the tag's data must be a mapping, not {_kind(raw)}"])
    problems = [f"the tag's data: {p}" for p in _json_problems(raw, "")]
    if problems:
        raise DocumentsRejected(problems)
    return raw
