"""One read-only view over several informers of one meaning (the Machines of Cluster API and
of OpenShift's machine-api: controllers/machines.py): ``store.get``, ``values`` and
``by_index`` read every store, first informer first; ``add_handler`` hears every informer.

Keys stay ``namespace/name``: where two informers hold an object of the same key, ``get``
returns the first informer's (the indexes and ``values`` return both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metalmend.kube.informer import Handler, Informer


class UnionStore:
    def __init__(self, informers: Sequence[Informer]) -> None:
        self._informers = tuple(informers)

    def __len__(self) -> int:
        return sum(len(i.store) for i in self._informers)

    def get(self, key: str) -> Any | None:
        for informer in self._informers:
            found = informer.store.get(key)
            if found is not None:
                return found
        return None

    def values(self) -> list[Any]:
        return [obj for i in self._informers for obj in i.store.values()]

    def by_index(self, index: str, value: str) -> list[Any]:
        return [obj for i in self._informers for obj in i.store.by_index(index, value)]


class UnionInformer:
    """Stands where an Informer is read and watched (``store``, ``add_handler``); the
    informers themselves are the manager's, which runs and syncs them."""

    def __init__(self, informers: Sequence[Informer]) -> None:
        self.informers = tuple(informers)
        self.store = UnionStore(self.informers)
        self.name = "+".join(i.name for i in self.informers)

    def add_handler(self, handler: Handler) -> None:
        for informer in self.informers:
            informer.add_handler(handler)
