"""YAML from callers, read so that one body can neither crash nor starve the process.

PyYAML's fast loader (``CSafeLoader``) composes in C, one C stack frame per level of
nesting: a body of ~30,000 ``[`` overflows the C stack and kills the whole process with
SIGSEGV before any check written in Python can run. Here libyaml only scans and parses,
which it does iteratively, one event at a time; PyYAML's own Python composer builds the
nodes from those events, and this module checks each node *before* composing it:

- nesting: at most ``depth`` levels (the composer and the constructor recurse once per
  level, so their recursion is bounded by this, far below Python's own limit);
- documents: at most ``documents`` YAML documents in one body (empty ones count);
- values per document: at most ``document_values`` nodes, counted as written (the node
  tree of one document is what composing holds in memory, ~400 bytes a node);
- values in the body: at most ``values`` nodes, an alias counted as a copy of what it names
  (what JSON, the stored form, writes out), so the "billion laughs" is refused after a few
  hundred events instead of being expanded;
- text: at most ``characters`` characters of scalars, aliases expanded (one alias of a long
  string repeated ten thousand times is not a small body once written out).

An alias of a node that is still being composed (a value that contains itself) is refused:
JSON cannot write it. Anchors and aliases are otherwise allowed (they are plain YAML, and
Deckhand reads documents with PyYAML's ``safe_load_all``, which accepts them); they buy
nothing past these limits. Results are exactly PyYAML's safe loader's (the same composer,
resolver and constructor), within the limits; speed is within a few percent of the C
composer's (benchmarks/body_memory.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, ScalarEvent
from yaml.nodes import Node
from yaml.resolver import Resolver

try:  # libyaml's scanner and parser (iterative, in C); PyYAML's own when it is missing
    from yaml.cyaml import CParser as _Parser  # type: ignore[attr-defined]

    _PARTS: tuple[type, ...] = (_Parser,)
except ImportError:  # pragma: no cover - PyYAML wheels ship libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    _PARTS = (Reader, Scanner, Parser)


@dataclass(frozen=True)
class YamlLimits:
    """What one body may hold; the defaults are ``metalmend serve``'s (ServeSettings)."""

    depth: int = 100
    """Nesting levels. A site design nests a dozen levels; 100 leaves room for any chart
    values override, and keeps the Python recursion of composing far from its limit."""

    documents: int = 5_000
    """YAML documents in a body: 2.5 times the 2,000-document site design of
    benchmarks/design_store.py (every host its own document)."""

    document_values: int = 100_000
    """Values (nodes) in one document as written: a document's node tree is held whole
    while it is composed (~400 bytes a value, so ~40 MB at this limit); the largest
    documents of a site design (rendered chart values) hold a few thousand."""

    values: int = 500_000
    """Values in the whole body, aliases expanded. The 2,000-document design holds
    ~150,000 (one value per ~9 bytes of YAML): a realistic design of the largest body
    accepted (4 MiB) holds ~470,000. Denser YAML is what costs: a million short strings
    took 190 MB and 28 s to put (benchmarks/body_memory.py); this halves both."""

    characters: int = 4 << 20
    """Characters of scalars, aliases expanded: no more than a body of the size limit
    could hold written out."""


class YamlRefused(yaml.YAMLError):
    """A body past one of the limits: the message says which, and where it was."""


def load_all(text: str, limits: YamlLimits | None = None) -> list[Any]:
    """Every document of ``text`` as PyYAML's ``safe_load_all`` reads it (``None`` for an
    empty one), within ``limits``: YamlRefused, a ``yaml.YAMLError``, past one."""
    return [value for _, _, value in documents(text, limits)]


def documents(
    text: str, limits: YamlLimits | None = None, loader: type[GuardedLoader] | None = None
) -> Iterator[tuple[int, int, Any]]:
    """(position from 1, line from 1, value) per YAML document, read one at a time: a
    refusal stops the reading where it is (raised from the iteration)."""
    reader = (loader or GuardedLoader)(text, limits or YamlLimits())
    try:
        while reader.check_node():
            node: Any = reader.get_node()
            yield reader.position, node.start_mark.line + 1, reader.construct_document(node)
    finally:
        reader.dispose()


class GuardedLoader(Composer, *_PARTS, SafeConstructor, Resolver):  # type: ignore[misc]
    """PyYAML's safe loader with the composer in Python, over libyaml's events, checking
    ``YamlLimits`` before each node. ``Composer`` comes first: ``CParser`` has a composer
    of its own, in C, which is what recursion kills."""

    def __init__(self, text: str, limits: YamlLimits) -> None:
        for part in _PARTS:
            part.__init__(self, text)  # type: ignore[misc]
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.limits = limits
        self.position = 0  # the document being read, from 1
        self._line = 0
        self._depth = 0
        self._written = 0  # nodes of this document, as written
        self._values = 0  # nodes of the body, aliases expanded
        self._characters = 0  # scalar characters of the body, aliases expanded
        self._sizes: dict[str, tuple[int, int]] = {}  # anchor -> (values, characters)

    def dispose(self) -> None:
        if hasattr(_PARTS[0], "dispose"):  # pragma: no branch
            super().dispose()

    def _refuse(self, problem: str, event: Any) -> YamlRefused:
        mark = event.start_mark
        return YamlRefused(
            f"document {self.position} (line {self._line}): {problem}"
            f" (at line {mark.line + 1}, column {mark.column + 1})"
        )

    def compose_document(self) -> Any:
        start = self.peek_event()
        self.position += 1
        self._line = start.start_mark.line + 1
        if self.position > self.limits.documents:
            raise YamlRefused(f"more than {self.limits.documents} documents in one body")
        self._written = 0
        self._sizes = {}
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Any:
        # Called once per node of every body: kept to plain attribute arithmetic.
        event = self.peek_event()
        anchor = event.anchor
        if type(event) is AliasEvent:
            node = Composer.compose_node(self, parent, index)  # unknown: an error
            size = self._sizes.get(anchor)
            if size is None:
                problem = f"the alias *{anchor} is inside the value it names"
                raise self._refuse(f"{problem} (a value that contains itself)", event)
            self._values += size[0]
            self._characters += size[1]
            self._check(event)
            return node
        limits = self.limits
        depth = self._depth = self._depth + 1
        written = self._written = self._written + 1
        if depth > limits.depth:
            raise self._refuse(f"nested deeper than {limits.depth} levels", event)
        if written > limits.document_values:
            problem = f"more than {limits.document_values} values in one document"
            raise self._refuse(problem, event)
        values, characters = self._values, self._characters
        node = Composer.compose_node(self, parent, index)
        self._depth = depth - 1
        self._values += 1
        if type(event) is ScalarEvent:
            self._characters += len(event.value)
        self._check(event)
        if anchor is not None:
            self._sizes[anchor] = (self._values - values, self._characters - characters)
        return node

    def _check(self, event: Any) -> None:
        limits = self.limits
        if self._values > limits.values:
            raise self._refuse(
                f"the body holds more than {limits.values} values once YAML aliases are"
                " expanded (an alias counts as a copy of what it names)", event,
            )  # fmt: skip
        if self._characters > limits.characters:
            raise self._refuse(
                f"the body holds more than {limits.characters} characters of text once"
                " YAML aliases are expanded", event,
            )  # fmt: skip


class DocumentLoader(GuardedLoader):
    """GuardedLoader without implicit timestamps: ``2026-11-23`` stays the string it was
    written as (JSON has no dates, and a document must read back as it was put)."""

    yaml_implicit_resolvers: ClassVar[dict[Any, list[tuple[str, Any]]]] = {  # type: ignore[misc]
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in GuardedLoader.yaml_implicit_resolvers.items()
    }
