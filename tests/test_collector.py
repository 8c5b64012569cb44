"""The garbage collector's policy (spinn/ground/collector.py): frozen objects come back, paused blocks nest."""

from __future__ import annotations

import gc
import json
import os
import threading
import weakref

import pytest

from spinn.ground import collector


class Node:
    pass


def test_objects_frozen_for_a_parse_are_collectable_again_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed parser's models must not leak: Stanza's pipeline and processors refer to each other."""
    cycle = Node()
    cycle.me = cycle
    alive = weakref.ref(cycle)
    with collector.gc_frozen():
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert alive() is not None  # frozen: the collector does not see it
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None
    monkeypatch.setattr(collector, "_FROZEN_FOR_LIFE", True)  # a worker process: the freeze stays
    with collector.gc_frozen():
        assert gc.get_freeze_count() == 0


def test_a_pause_nests_and_the_collector_runs_again_after_the_outer_block() -> None:
    assert gc.isenabled()
    with collector.gc_paused():
        assert not gc.isenabled()
        with collector.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_pause_ends_when_the_last_thread_leaves_its_block() -> None:
    """Shards labelled at once in one process (a Dask worker's threads): the first to finish must not turn
    the collector back on under the other."""
    entered, leave = threading.Event(), threading.Event()

    def shard() -> None:
        with collector.gc_paused():
            entered.set()
            leave.wait(timeout=30)

    other = threading.Thread(target=shard)
    other.start()
    assert entered.wait(timeout=30)
    with collector.gc_paused():
        leave.set()
        other.join(timeout=30)
        assert not other.is_alive()
        assert not gc.isenabled()  # the other thread's block ended; this one's has not
    assert gc.isenabled()


def test_a_pause_keeps_a_collector_the_process_had_disabled() -> None:
    gc.disable()
    try:
        with collector.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_cycles_made_during_a_pause_are_collected_after_it() -> None:
    with collector.gc_paused():
        cycle = Node()
        cycle.me = cycle
        alive = weakref.ref(cycle)
        del cycle
    gc.collect()
    assert alive() is None


def test_a_forked_child_leaves_its_parents_pause_behind() -> None:
    """A tokenizer worker forked from inside a shard's pause: the forking thread never leaves that block in the
    child, so the child must not stay paused for life, and its own pauses must still end."""
    read, write = os.pipe()
    with collector.gc_paused():
        child = os.fork()
        if child == 0:
            try:
                collector.forget_pauses()
                states = [gc.isenabled()]
                with collector.gc_paused():
                    states.append(gc.isenabled())
                states.append(gc.isenabled())
                os.write(write, json.dumps(states).encode())
            finally:
                os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as answer:
        assert json.loads(answer.read()) == [True, False, True]
    assert gc.isenabled()
