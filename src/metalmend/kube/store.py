"""An informer's in-memory copy of one kind, with secondary indexes.

Objects are keyed "namespace/name" (or "name" for cluster-scoped kinds). An index maps an
object to zero or more values; ``by_index`` answers "which objects have this value", for
example Machines by host ("metal3.io/BareMetalHost" annotation) or by node name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

IndexFunc = Callable[[Any], Iterable[str]]


class IndexConflict(ValueError):
    """Two different functions were registered under one index name."""


def _qualified(func: IndexFunc) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def object_key(obj: Any) -> str:
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else str(meta.name)


def split_key(key: str) -> tuple[str | None, str]:
    namespace, _, name = key.rpartition("/")
    return (namespace or None), name


class Store:
    def __init__(self, indexes: dict[str, IndexFunc] | None = None) -> None:
        self._objects: dict[str, Any] = {}
        self._index_funcs = dict(indexes or {})
        # index name -> value -> keys; and what each key contributed, to undo it cheaply
        self._indexes: dict[str, dict[str, set[str]]] = {
            n: defaultdict(set) for n in self._index_funcs
        }
        self._contributed: dict[str, dict[str, tuple[str, ...]]] = {
            n: {} for n in self._index_funcs
        }

    def add_index(self, name: str, func: IndexFunc) -> None:
        """Add an index (before or after objects arrive). Registering the same function
        under its name again is a no-op (every controller on a shared informer asks for
        the indexes it reads); a *different* function under a taken name is refused, since
        whoever registered second would silently read the first one's index."""
        present = self._index_funcs.get(name)
        if present is not None:
            if present is not func:
                raise IndexConflict(
                    f"index {name!r} is already defined by {_qualified(present)};"
                    f" refusing {_qualified(func)} under the same name"
                    " (define each index once, in metalmend.api.indexes)"
                )
            return
        self._index_funcs[name] = func
        self._indexes[name] = defaultdict(set)
        self._contributed[name] = {}
        for key, obj in self._objects.items():
            self._reindex_one(name, key, obj)

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, key: str) -> Any | None:
        return self._objects.get(key)

    def keys(self) -> list[str]:
        return list(self._objects)

    def values(self) -> list[Any]:
        return list(self._objects.values())

    def by_index(self, index: str, value: str) -> list[Any]:
        return [self._objects[k] for k in sorted(self._indexes[index].get(value, ()))]

    def upsert(self, obj: Any) -> Any | None:
        """Insert or replace; return the previous version."""
        key = object_key(obj)
        previous = self._objects.get(key)
        self._objects[key] = obj
        self._reindex(key, obj)
        return previous

    def delete(self, key: str) -> Any | None:
        previous = self._objects.pop(key, None)
        self._reindex(key, None)
        return previous

    def replace(self, objects: Iterable[Any]) -> None:
        """Make the store hold exactly ``objects`` (after a list)."""
        self._objects.clear()
        for name in self._index_funcs:
            self._indexes[name].clear()
            self._contributed[name].clear()
        for obj in objects:
            self.upsert(obj)

    def _reindex(self, key: str, obj: Any | None) -> None:
        for name in self._index_funcs:
            self._reindex_one(name, key, obj)

    def _reindex_one(self, name: str, key: str, obj: Any | None) -> None:
        index = self._indexes[name]
        for value in self._contributed[name].pop(key, ()):
            index[value].discard(key)
            if not index[value]:
                del index[value]
        if obj is not None:
            values = tuple(dict.fromkeys(self._index_funcs[name](obj)))
            if values:
                self._contributed[name][key] = values
            for value in values:
                index[value].add(key)
