"""The work queue's priority rule, against a model, over random sequences of operations
(hypothesis): keys asked for now, background keys (polls, resyncs), workers taking and
finishing keys. What must hold whatever the order:

- a key is never held by two workers, and never handed out unless it was waiting;
- a key waiting twice is handed out once (asked for now and in the background: as asked
  for now);
- while any key asked for now waits (not held), no background key is handed out;
- nothing waiting is lost: once the workers drain the queue, every key waiting was handed
  out, each once;
- ``len`` is the number of keys waiting and not held;
- ``handed_out_in_background`` says how the held key was handed out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from metalmend.kube.workqueue import WorkQueue

KEYS = ["ns/a", "ns/b", "ns/c", "ns/d"]
URGENT, BACKGROUND = "urgent", "background"

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(KEYS)),
        st.tuples(st.just("background"), st.sampled_from(KEYS)),
        st.tuples(st.just("get"), st.none()),
        st.tuples(st.just("done"), st.none()),
    ),
    max_size=60,
)


@dataclass
class Model:
    waiting: dict[str, str] = field(default_factory=dict)  # key -> URGENT | BACKGROUND
    held: dict[str, str] = field(default_factory=dict)  # key -> how it was handed out

    def add(self, key: str) -> None:
        self.waiting[key] = URGENT  # asked for now wins over a background wait

    def background(self, key: str) -> None:
        self.waiting.setdefault(key, BACKGROUND)

    def available(self) -> dict[str, str]:
        return {k: p for k, p in self.waiting.items() if k not in self.held}


async def check(queue: WorkQueue, model: Model, ops: list[tuple[str, str | None]]) -> None:
    for op, key in ops:
        if op == "add" and key is not None:
            queue.add(key)
            model.add(key)
        elif op == "background" and key is not None:
            queue.add_at(key, 0.0, background=True)  # a poll come due
            model.background(key)
        elif op == "get" and model.available():
            await take(queue, model)
        elif op == "done" and model.held:
            finished = sorted(model.held)[0]
            queue.done(finished)
            del model.held[finished]
        assert len(queue) == len(model.available())
    while model.held or model.available():  # the workers drain the queue
        while model.available():
            await take(queue, model)
        for finished in sorted(model.held):
            queue.done(finished)
            del model.held[finished]
    assert len(queue) == 0


async def take(queue: WorkQueue, model: Model) -> None:
    available = model.available()
    key = await asyncio.wait_for(queue.get(), 1.0)
    assert key is not None
    assert key in available, f"{key} handed out but not waiting, or held: {model}"
    if URGENT in available.values():
        assert available[key] == URGENT, f"background {key} before a key asked for now"
    assert queue.handed_out_in_background(key) == (available[key] == BACKGROUND)
    model.held[key] = model.waiting.pop(key)


@settings(max_examples=400, deadline=None)
@given(operations)
def test_the_priority_rule_holds_for_any_order_of_operations(
    ops: list[tuple[str, str | None]],
) -> None:
    asyncio.run(check(WorkQueue(), Model(), ops))
