"""Processes that end with their parent, however the parent ends: pool workers, and every command itself.

A pool's workers wait for work from their parent. When the parent is killed
(kill -9 runs no cleanup, so no pool shutdown reaches them) they would wait
for good, holding memory and, for a forked worker, copies of the parent's
files. Each worker therefore runs `exit_with_parent` when it starts (as the
pool's initializer): a daemon thread that polls the parent's pid and ends the
worker once the parent is gone. Polling works for spawned and forked workers
alike, on any POSIX system, where prctl's parent-death signal is Linux-only and
fires when the parent's thread, not its process, ends.

A command is the same kind of child, of whatever started it: `dvc repro`, a
Prefect worker, a CI job. One killed with SIGKILL leaves its stage running as
an orphan, which goes on writing into the outputs that the orchestrator's
next run writes too. So every command watches its parent the same way
(`stop_when_orphaned`, armed by the CLI's shared entry, and first thing by
every Prefect flow of flows/, since a worker's flow run process, `python -m
prefect.engine`, calls the flow without any CLI) and, once it is gone,
stops as a hang-up would stop it, cleanly: a `Hangup` raised in the main
thread ends the MLflow run, lets go of the locks and leaves only published
files. A command that does not stop within ORPHAN_GRACE_S is ended outright.
"""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_POLL_S = 0.5
"""How often a worker checks that its parent still runs: a dead parent's workers are gone within this."""
EXIT_ORPHANED = 1
"""A worker's exit status when it ends because its parent is gone."""
ORPHAN_GRACE_S = 60
"""How long an orphaned command may take to stop cleanly (a training step, a parser batch on busy cores)."""
INIT_PID = 1
"""The parent of a process started by init (or adopted by it): there is no starter to outlive."""

_orphaned = threading.Event()
_armed: list[int] = []
"""The parent this process watches, once armed (a command runs in-process many times in tests)."""


class Hangup(BaseException):
    """The process that started this command is gone (or its terminal hung up): stop, cleaning up.

    A BaseException, like KeyboardInterrupt, so no `except Exception` of a stage swallows it."""


def exit_with_parent(parent: int) -> None:
    """In a worker: end this process once `parent` (the pid that started it) is no longer its parent."""
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="exit-with-parent").start()


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(EXIT_ORPHANED)


def stop_when_orphaned() -> None:
    """In a command's main thread: raise `Hangup` there once the process that started it is gone.

    Left off where there is no starter to outlive (a parent that is init already) and where the user asked
    the command to outlive its terminal (`nohup` ignores SIGHUP); armed once per process."""
    parent = os.getppid()
    if _armed or threading.current_thread() is not threading.main_thread():
        return
    if parent <= INIT_PID or signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return
    _armed.append(parent)
    signal.signal(signal.SIGHUP, _hang_up)
    main = threading.main_thread().ident
    threading.Thread(target=_stop_with, args=(parent, main), daemon=True, name="stop-with-parent").start()


def orphaned() -> int | None:
    """The pid of the starter this process outlived, or None while it runs (or nobody watches)."""
    return _armed[0] if _orphaned.is_set() else None


def _hang_up(_signum: int, _frame) -> None:
    raise Hangup


def _stop_with(parent: int, main: int) -> None:
    """Poll the parent; once it is gone, signal the main thread (a signal also ends a blocking wait there),
    then end the process if it has not ended ORPHAN_GRACE_S later."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _orphaned.set()
    signal.pthread_kill(main, signal.SIGHUP)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(EXIT_ORPHANED)
