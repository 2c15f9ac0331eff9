"""Which store metalmend serve may serve (metalmend.policy.store): the table of the module
and docs/design-store.md, "When the store is replaced"."""

from __future__ import annotations

import datetime as dt

import pytest

from metalmend.policy.store import StoreId, Verdict, decide_store

A = StoreId("a" * 32, dt.datetime(2026, 11, 1, 10, 0, tzinfo=dt.UTC))
B = StoreId("b" * 32, dt.datetime(2026, 11, 26, 14, 0, tzinfo=dt.UTC))
WHERE = "ConfigMap metalmend-system/metalmend-serve-store"


@pytest.mark.parametrize(
    ("recorded", "current", "accepted", "verdict", "loss_accepted"),
    [
        (None, A, "", Verdict.RECORD, False),  # first start, or the record deleted
        (None, B, A.id, Verdict.RECORD, False),
        (A, A, "", Verdict.SERVE, False),  # restarted on the same store
        (A, A, B.id, Verdict.SERVE, False),  # an acceptance left set accepts nothing else
        (A, B, B.id, Verdict.RECORD, False),  # the operator confirmed this store
        (A, B, "", Verdict.REFUSE, False),  # replaced: the records of A are not there
        (A, B, A.id, Verdict.REFUSE, False),
        (A, B, "b", Verdict.REFUSE, False),  # a prefix is not the store
        (A, B, "", Verdict.RECORD, True),  # an emptyDir, its loss accepted: warned
        (A, A, "", Verdict.SERVE, True),
    ],
)
def test_a_store_is_served_only_when_recorded_or_accepted_by_its_id(
    recorded: StoreId | None, current: StoreId, accepted: str, verdict: Verdict,
    loss_accepted: bool,
) -> None:  # fmt: skip
    decision = decide_store(recorded, current, accepted, WHERE, loss_accepted)
    assert decision.verdict is verdict
    assert decision.warn is (loss_accepted and recorded is not None and recorded != current)


def test_a_refusal_names_both_stores_where_the_record_is_and_how_to_confirm() -> None:
    message = decide_store(A, B, "", WHERE).message
    assert f"store {B.id} (created 2026-11-26 14:00:00 UTC)" in message
    assert f"store {A.id} (created 2026-11-01 10:00:00 UTC)" in message
    assert WHERE in message
    assert f"serve.accept_store={B.id}" in message
    assert "\n" not in message


def test_a_refusal_of_a_store_this_start_created_offers_no_id_that_will_be_removed() -> None:
    """Issue 36, point 8: the file this start created is removed when it refuses, so the
    refusal cannot name it to accept; it says to restore the file or delete the record."""
    decision = decide_store(A, B, "", WHERE, created=True)
    assert decision.verdict is Verdict.REFUSE
    assert "the database file does not exist" in decision.message
    assert "nothing was created" in decision.message
    assert f"Restore the file of store {A.id}" in decision.message
    assert f"delete {WHERE}" in decision.message
    assert B.id not in decision.message
    assert decide_store(A, B, "", WHERE, True, created=True).verdict is Verdict.RECORD
