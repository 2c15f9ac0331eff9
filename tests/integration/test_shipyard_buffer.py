"""The configdocs buffer's writers are serialized (siteactions.configdocs.buffer_writer), on a
SQLite file and on PostgreSQL: two operators putting at the same moment with the default
buffermode=rejectoncontents never both find the buffer empty."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.errors import Conflict
from metalmend.siteactions.configdocs import put_in_buffer

ROUNDS = 5


def documents(name: str, value: int) -> str:
    return f"---\nschema: promenade/Node/v1\nmetadata: {{schema: metadata/Document/v1, name: {name}}}\ndata: {{v: {value}}}\n"


@pytest.fixture
def store(database_url: str) -> Iterator[DesignStore]:
    db = Database.open(database_url)
    db.upgrade()
    yield DesignStore(db)
    db.dispose()


def test_two_puts_at_once_one_wins_the_other_is_told_the_buffer_is_taken(
    store: DesignStore,
) -> None:
    store.put("base", parse(documents("base", 0)))
    store.tag(1, "committed", {})
    for round_ in range(ROUNDS):
        outcomes: dict[str, str] = {}

        def put(
            collection: str,
            start: threading.Barrier = threading.Barrier(2),  # noqa: B008 - one per round
            outcomes: dict[str, str] = outcomes,
            round_: int = round_,
        ) -> None:
            start.wait()
            try:
                put_in_buffer(
                    store, collection, parse(documents(collection, round_)), "rejectoncontents"
                )
                outcomes[collection] = "stored"
            except Conflict:
                outcomes[collection] = "refused"

        threads = [threading.Thread(target=put, args=(c,)) for c in ("left", "right")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes.values()) == ["refused", "stored"], (round_, outcomes)
        store.tag(store.newest() or 0, "committed", {})  # commit, for the next round
