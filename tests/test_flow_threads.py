"""flows/threads.py: calls side by side in a bounded thread pool, each in a copy of the caller's context."""

from __future__ import annotations

import contextvars
import threading

import pytest

from flows.threads import side_by_side

RUN = contextvars.ContextVar("RUN", default=None)
WAIT_S = 10.0
"""How long a call waits for the others it must run beside: a failure's delay, never a passing run's."""


def test_calls_run_together_up_to_the_bound_and_each_sees_the_callers_context():
    """Every call waits at a barrier for a second one: they can pass only two at a time, never three."""
    at_once, items = 2, range(6)
    barrier, lock = threading.Barrier(at_once, timeout=WAIT_S), threading.Lock()
    running, most = [0], [0]

    def call(item: int) -> tuple[int, str | None]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        barrier.wait()
        with lock:
            running[0] -= 1
        return item * item, RUN.get()

    RUN.set("parent run")
    results = dict(side_by_side(call, items, at_once))
    assert results == {item: (item * item, "parent run") for item in items}
    assert most[0] == at_once


def test_a_call_that_raises_raises_in_the_caller_after_the_ones_beside_it_end():
    ended = []

    def call(item: int) -> int:
        if item == 0:
            raise ValueError("bad item")
        ended.append(item)
        return item

    with pytest.raises(ValueError, match="bad item"):
        list(side_by_side(call, [1, 0], at_once=2))
    assert ended == [1]
