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

The starter is not always the parent: `dvc repro` (on a machine without
$SHELL, as under CI or cron) runs a stage as `/bin/sh -c "spinn train ..."`,
and dash does not exec its last command, so the shell stays between the two
and outlives the killed `dvc repro`; so do wrappers that wait for the command
they run (`timeout`, `flock`, `uv run`). A command therefore watches its parent
and, while that is such a go-between, its parent in turn, up to the first
ancestor that is not one (`lineage`): any of them gone, and the command stops.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PARENT_POLL_S = 0.5
"""How often a worker checks that its parent still runs: a dead parent's workers are gone within this."""
EXIT_ORPHANED = 1
"""A worker's exit status when it ends because its parent is gone."""
ORPHAN_GRACE_S = 60
"""How long an orphaned command may take to stop cleanly (a training step, a parser batch on busy cores)."""
INIT_PID = 1
"""The parent of a process started by init (or adopted by it): there is no starter to outlive."""
UNSEEN = -1
"""The parent `_parent_of` gives a process that has ended (or that /proc cannot show)."""
ZOMBIE = "Z"
"""/proc's state of a process that has ended and waits for its parent to collect it."""
GO_BETWEENS = frozenset(
    {"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish", "busybox"} | {"timeout", "time", "flock", "uv", "conda"}
)
"""Programs that run a command for whoever started them and wait for it (shells, and wrappers that do not exec
it): a command's real starter is above them."""
WATCHER = "stop-with-parent"
"""The name of a command's thread that watches its starter (`stop_when_orphaned`): it polls /proc and holds no
lock a forked child could need, so workers may still be forked beside it."""
INTERRUPTS = (signal.SIGINT, signal.SIGHUP)
"""Ctrl-C, and the hang-up that stops an orphaned command: what `deferred_interrupts` holds back."""

_armed: list[int] = []
"""The processes this one watches (`lineage`), once armed (a command runs in-process many times in tests)."""
_outlived: list[int] = []
"""The watched process found gone (or moved to a new parent), once one is."""


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
    if _armed or threading.current_thread() is not threading.main_thread():
        return
    if os.getppid() <= INIT_PID or signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return
    _armed.extend(lineage())
    signal.signal(signal.SIGHUP, _hang_up)
    main = threading.main_thread().ident
    threading.Thread(target=_stop_with, args=(main,), daemon=True, name=WATCHER).start()


def orphaned() -> int | None:
    """The pid of the starter (or the go-between) this process outlived, or None while it runs (or
    nobody watches)."""
    return _outlived[0] if _outlived else None


def lineage() -> list[int]:
    """The processes this one outlives: its parent and, while that is a go-between, its parent in turn, up to the
    first that is not one (or a child of init). Only the parent where /proc cannot tell (not Linux)."""
    chain = [os.getppid()]
    while _name_of(chain[-1]) in GO_BETWEENS and (above := _parent_of(chain[-1])) > INIT_PID:
        chain.append(above)
    return chain


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, parent, ...), None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _parent_of(pid: int) -> int:
    fields = _stat(pid)
    return UNSEEN if fields is None or fields[0] == ZOMBIE else int(fields[1])


def _name_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _gone() -> int | None:
    """The first watched process that has ended, else None. Each is watched through the one below it, which
    moves to a new parent when it ends (this process's own parent by os.getppid, which needs no /proc); the
    starter's own parent is not its business."""
    below = [os.getppid(), *map(_parent_of, _armed[:-1])]
    return next((pid for pid, parent in zip(_armed, below, strict=True) if parent != pid), None)


def _hang_up(_signum: int, _frame) -> None:
    raise Hangup


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C and the hang-up back until the block ends, then let the first one act as it would have.

    For a write that an interrupt would tear: torch.save's writer, interrupted mid-record, closes with its own
    RuntimeError ("unexpected pos"), which replaces the interrupt, so the command died with a traceback instead
    of stopping cleanly. Signal handlers run in the main thread only, so elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def note(number: int, _frame) -> None:
        arrived.append(number)

    # a handler not set from Python (None) could not be put back: that signal is not held
    held = [number for number in INTERRUPTS if signal.getsignal(number) is not None]
    handlers: dict[int, Any] = {}
    try:
        with _blocked(held):  # no handler runs between two of these: each one set is put back below
            for number in held:
                handlers[number] = signal.signal(number, note)
        yield
    finally:
        with _blocked(held):  # one that arrives now acts after all are back, not halfway
            for number, handler in handlers.items():
                signal.signal(number, handler)
        if arrived:
            signal.raise_signal(arrived[0])  # its own handler now: an exception, the default action, or nothing


@contextmanager
def _blocked(numbers: list[int]) -> Iterator[None]:
    """The signals wait at the process's door for the block's length, then arrive as they would have."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _stop_with(main: int) -> None:
    """Poll the lineage; once one of it has ended, signal the main thread (a signal also ends a blocking wait
    there), then end the process if it has not ended ORPHAN_GRACE_S later."""
    while (gone := _gone()) is None:
        time.sleep(PARENT_POLL_S)
    _outlived.append(gone)
    signal.pthread_kill(main, signal.SIGHUP)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(EXIT_ORPHANED)
