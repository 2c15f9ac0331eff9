"""bmc/turns.py: namespaces take turns at a busy BMC endpoint (pure, no I/O)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metalmend.bmc.turns import TURN_HOLD, WAIT_GRACE, Turns, next_in_line

EP = "ipmi/127.0.0.1/623"


@pytest.mark.parametrize(
    ("namespaces", "last", "expected"),
    [
        (["a"], None, "a"),
        (["a", "b"], None, "a"),
        (["a", "b"], "a", "b"),
        (["a", "b"], "b", "a"),  # wraps
        (["a", "c"], "b", "c"),  # the one served last need not wait any more
        (["default", "t2"], "t2", "default"),
        (["default", "t2", "t3"], "default", "t2"),
    ],
)
def test_next_in_line_is_round_robin_by_name(
    namespaces: list[str], last: str | None, expected: str
) -> None:
    assert next_in_line(namespaces, last) == expected


def test_a_namespace_waiting_gets_the_endpoint_before_the_one_served_calls_again() -> None:
    turns = Turns()
    turns.started(EP, "t2", "t2/h1")
    for i in range(2, 13):  # twelve t2 hosts on the endpoint
        turns.wait(EP, "t2", f"t2/h{i}", now=0.0, retry=1.0)
    turns.wait(EP, "default", "default/worker-1", now=0.0, retry=1.0)
    assert turns.ahead(EP, "default", 0.0) == 0  # t2 was served last: default is next
    assert turns.ahead(EP, "t2", 0.0) == 1
    assert turns.freed(EP, 0.5) == "default/worker-1"  # woken at once
    assert not turns.may_start(EP, "t2", 0.5)
    assert turns.may_start(EP, "default", 0.5)
    turns.started(EP, "default", "default/worker-1")
    assert turns.freed(EP, 0.6) == "t2/h2"  # then t2 again, oldest first
    assert turns.may_start(EP, "t2", 0.6)


@pytest.mark.parametrize(
    ("case", "now", "may_t2"),
    [
        ("within the hold, the turn is default's", TURN_HOLD / 2, False),
        ("the hold passed: whoever comes", TURN_HOLD + 0.1, True),
    ],
)
def test_a_turn_not_taken_is_not_kept_for_ever(case: str, now: float, may_t2: bool) -> None:
    turns = Turns()
    turns.started(EP, "t2", "t2/h1")
    turns.wait(EP, "t2", "t2/h2", now=0.0, retry=5.0)
    turns.wait(EP, "default", "default/w", now=0.0, retry=5.0)
    turns.freed(EP, 0.0)
    assert turns.may_start(EP, "t2", now) is may_t2, case


def test_a_waiter_that_does_not_ask_again_drops_out_of_line() -> None:
    turns = Turns()
    turns.started(EP, "t2", "t2/h1")
    turns.wait(EP, "default", "default/gone", now=0.0, retry=1.0)
    assert turns.waiting(EP, 1.0 + WAIT_GRACE) == ["default"]
    assert turns.waiting(EP, 1.1 + WAIT_GRACE) == []
    assert turns.freed(EP, 5.0) is None  # nobody waits: the endpoint is forgotten
    assert turns.may_start(EP, "t2", 5.0)
    assert turns.waiting_by_namespace(5.0) == {}


def test_nobody_else_waiting_means_no_turns() -> None:
    turns = Turns()
    turns.started(EP, "t2", "t2/h1")
    turns.wait(EP, "t2", "t2/h2", now=0.0, retry=1.0)
    assert turns.freed(EP, 0.1) == "t2/h2"
    assert turns.may_start(EP, "t2", 0.1)
    assert turns.may_start(EP, "default", 0.1)  # a newcomer of another namespace: its turn
    assert turns.waiting_by_namespace(0.1) == {"t2": 1}


Step = tuple[str, str]  # ("arrive", namespace) | ("finish", order seed)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("arrive"), st.sampled_from(["a", "b", "c", "default"])),
            st.tuples(st.just("finish"), st.integers(0, 1000).map(str)),
        ),
        max_size=80,
    )
)
def test_between_two_calls_of_a_waiting_namespace_each_other_namespace_starts_at_most_one(
    steps: list[Step],
) -> None:
    """Calls arrive and find the endpoint busy (they wait) or free (they start); when the
    call under way ends, the waiters ask again in an arbitrary order and the first one
    allowed starts. Whatever the order: from the moment namespace N waits until a call of
    N starts, no other namespace starts two calls."""
    turns = Turns()
    running: str | None = None  # the namespace of the call under way
    waiters: dict[str, str] = {}  # waiter -> namespace
    starts_while_waiting: dict[str, dict[str, int]] = {}  # N -> other namespace -> starts
    now, made = 0.0, 0

    def start(waiter: str, namespace: str) -> None:
        nonlocal running
        turns.started(EP, namespace, waiter)
        waiters.pop(waiter, None)
        running = namespace
        starts_while_waiting.pop(namespace, None)
        for waiting, counts in starts_while_waiting.items():
            counts[namespace] = counts.get(namespace, 0) + 1
            assert counts[namespace] <= 1, f"{waiting} waited behind two calls of {namespace}"

    for kind, value in steps:
        now += 0.01
        if kind == "arrive":
            made += 1
            waiter = f"{value}/h{made}"
            if running is None and turns.may_start(EP, value, now):
                start(waiter, value)
            else:
                turns.wait(EP, value, waiter, now, retry=100.0)
                waiters[waiter] = value
                starts_while_waiting.setdefault(value, {})
        elif running is not None:
            running = None
            woken = turns.freed(EP, now)
            if not waiters:
                assert woken is None
                continue
            assert woken in waiters
            order = sorted(waiters)
            random.Random(int(value)).shuffle(order)
            allowed = [w for w in order if turns.may_start(EP, waiters[w], now)]
            assert woken in allowed, "the woken waiter may start"
            start(allowed[0], waiters[allowed[0]])
