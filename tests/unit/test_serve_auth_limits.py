"""The TokenReview cache and the failed-authentication limit of ``metalmend serve``
(web/auth.py; docs/teardown.md, "Authorization"), on a clock the test moves."""

from __future__ import annotations

import pytest

from metalmend.web.auth import Caller, FailureLimit, Known, ReviewCache

ALICE = Caller("alice", "u1", ("ops",), {})


class Clock:
    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


def test_the_cache_is_keyed_by_the_tokens_hash_never_the_token() -> None:
    cache = ReviewCache(10, 5)
    cache.put(ReviewCache.key("s3cret-token"), ALICE)
    assert all(b"s3cret" not in key for key in cache._answers)
    assert ReviewCache.key("s3cret-token") != ReviewCache.key("s3cret-token2")


@pytest.mark.parametrize(
    ("answer", "after", "found"),
    [
        (ALICE, 0.0, (True, ALICE)),
        (ALICE, 9.9, (True, ALICE)),
        (ALICE, 10.0, (False, None)),  # a revoked token works for the TTL at most
        (None, 5.0, (True, None)),  # a refusal is kept too: no second review
        (None, 10.0, (False, None)),
    ],
)
def test_answers_are_kept_for_the_ttl(
    answer: Caller | None, after: float, found: tuple[bool, Caller | None]
) -> None:
    clock = Clock()
    cache = ReviewCache(10, 5, clock)
    cache.put(ReviewCache.key("t"), answer)
    clock.at += after
    assert cache.get(ReviewCache.key("t")) == found


def test_the_cache_keeps_at_most_size_answers_dropping_the_oldest() -> None:
    cache = ReviewCache(10, 3)
    for n in range(5):
        cache.put(ReviewCache.key(f"t{n}"), None)
    assert [cache.get(ReviewCache.key(f"t{n}"))[0] for n in range(5)] == [
        False, False, True, True, True,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("failures", "after", "wait"),
    [
        (0, 0.0, 0.0),
        (9, 0.0, 0.0),  # within the burst
        (10, 0.0, 2.0),  # spent: one comes back every interval (2 s here)
        (10, 1.0, 1.0),
        (10, 2.0, 0.0),
        (30, 0.0, 2.0),  # failing more never digs deeper than an empty bucket
        (10, 100.0, 0.0),
    ],
)
def test_failed_authentications_are_a_token_bucket_per_address(
    failures: int, after: float, wait: float
) -> None:
    clock = Clock()
    limit = FailureLimit(burst=10, interval=2.0, addresses=100, now=clock)
    for _ in range(failures):
        limit.failed("192.0.2.1")
    clock.at += after
    assert limit.wait("192.0.2.1") == pytest.approx(wait)
    assert limit.wait("192.0.2.2") == 0.0, "another address has its own bucket"


def test_the_limit_remembers_at_most_so_many_addresses() -> None:
    limit = FailureLimit(burst=1, interval=60.0, addresses=2, now=Clock())
    for address in ("a", "b", "c"):
        limit.failed(address)
    assert [limit.wait(a) > 0 for a in ("a", "b", "c")] == [False, True, True]


def test_a_review_claims_its_budget_before_it_is_sent_and_a_valid_token_gives_it_back() -> None:
    """Issue 36, point 5: the claim is one synchronous step, so a hundred requests
    arriving together cannot all pass one check; a claim comes back when the token proved
    valid, so valid callers never spend an address's budget."""
    clock = Clock()
    limit = FailureLimit(burst=3, interval=600.0, addresses=100, now=clock)
    claims = [limit.claim("192.0.2.1") for _ in range(100)]
    assert claims[:3] == [0.0, 0.0, 0.0]
    assert all(wait > 0 for wait in claims[3:]), "only the burst is claimed"
    limit.refund("192.0.2.1")
    assert limit.claim("192.0.2.1") == 0.0, "a refunded claim can be claimed again"
    for _ in range(10):
        limit.refund("192.0.2.2")
    assert limit.claim("192.0.2.2") == 0.0, "refunds never fill a bucket beyond its burst"
    assert limit.wait("192.0.2.2") == 0.0


def test_what_reviews_said_is_kept_for_the_last_tokens_by_hash() -> None:
    known = Known(size=2)
    for n, valid in enumerate((True, False, True)):
        known.put(ReviewCache.key(f"t{n}"), valid)
    assert [known.get(ReviewCache.key(f"t{n}")) for n in range(3)] == [None, False, True]
