"""Worker processes that end with their parent, however the parent ends.

A pool's workers wait for work from their parent. When the parent is killed
(kill -9 runs no cleanup, so no pool shutdown reaches them) they would wait
for good, holding memory and, for a forked worker, copies of the parent's
files. Each worker therefore runs `exit_with_parent` when it starts (as the
pool's initializer): a daemon thread that polls the parent's pid and ends the
worker once the parent is gone. Polling works for spawned and forked workers
alike, on any POSIX system, where prctl's parent-death signal is Linux-only and
fires when the parent's thread, not its process, ends.
"""

from __future__ import annotations

import os
import threading
import time

PARENT_POLL_S = 0.5
"""How often a worker checks that its parent still runs: a dead parent's workers are gone within this."""
EXIT_ORPHANED = 1
"""A worker's exit status when it ends because its parent is gone."""


def exit_with_parent(parent: int) -> None:
    """In a worker: end this process once `parent` (the pid that started it) is no longer its parent."""
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="exit-with-parent").start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(EXIT_ORPHANED)
