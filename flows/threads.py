"""Side by side in a flow: one call per item in a bounded thread pool, each thread in the flow's Prefect context.

A flow that calls a subflow per item runs them one after another; when one
item leaves the workers idle (its planning, its merge, its MLflow run, its
last shard) the next could have used them. Threads fit: a subflow mostly waits
on its Dask futures and on the Prefect and MLflow servers. Each call runs in a
copy of the submitting thread's contextvars (`contextvars.copy_context()`,
one per call: a context is entered by one thread at a time), so Prefect sees
the flow run as the parent of the subflow, and its logger and settings follow.
The results come back to the calling thread as they finish, so whatever they
update (an index file) is written by one thread only.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

THREAD_PREFIX = "spinn-flow"


def side_by_side(call: Callable[[Item], Result], items: Iterable[Item], at_once: int) -> Iterator[tuple[Item, Result]]:
    """(item, call(item)) as each call finishes, at most `at_once` running together. A call that raises
    raises here, in the caller's thread; then, or when the caller stops early, the calls not yet started
    are dropped and the ones running end first."""
    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix=THREAD_PREFIX) as pool:
        futures = {pool.submit(contextvars.copy_context().run, call, item): item for item in items}
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        finally:
            for future in futures:
                future.cancel()
