"""Parser worker processes: a pool that parses batches of sentences while the caller goes on.

How workers start decides whether they pay on small inputs: a spawned worker
imports torch and Stanza and loads the models (about 5 s on the 2-core test
machine, as long as parsing 400 sentences), so on Linux with the parser on
the CPU the caller loads Stanza once and forks the workers, which share the
loaded models and start at once. A parser on the GPU, or in a process that
runs other threads (a Prefect or Dask worker), spawns them instead.

Tokenizer workers (`start_tokenizers`) serve a model that builds its own
trees: they only cut text into SNLI's tokens and never touch torch, so they
are forked beside a model on the GPU too (as torch's own data loader workers
are), and spawned only where another thread runs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from spinn.ground.children import WATCHER, exit_with_parent
from spinn.ground.collector import forget_pauses, freeze_for_life, gc_frozen, gc_paused
from spinn.ground.cores import use_threads
from spinn.parsing.parser_settings import ParserSettings, resolve_gpu
from spinn.parsing.protocol import Parsed, Unparsed
from spinn.parsing.stanza_pipeline import StanzaRunner
from spinn.trees.tokenize import tokenize

FORK_PLATFORM = "linux"  # fork is unsafe with macOS system libraries and absent on Windows

_WORKER: StanzaRunner | None = None
"""A worker process's own Stanza: no cache (the parent keeps it), one process's worth of threads."""


def can_fork(use_gpu: bool) -> bool:
    """Whether workers may be forked from this process: Linux, Stanza on the CPU (a forked child cannot use
    the parent's CUDA state), and no other thread running but the command's own watcher (a child gets only
    the forking thread, and any lock another thread held stays locked in it: a Prefect or Dask worker
    process spawns instead)."""
    import multiprocessing

    current = threading.current_thread()
    others = [thread for thread in threading.enumerate() if thread is not current and thread.name != WATCHER]
    return (
        sys.platform.startswith(FORK_PLATFORM)
        and not use_gpu
        and not others
        and "fork" in multiprocessing.get_all_start_methods()
    )


def start_pool(settings: ParserSettings, pipeline: Any) -> ProcessPoolExecutor:
    """`workers` processes, started now so they are ready when the batches come. Given the `pipeline` this
    process loaded, they are forked: they share its models (copy-on-write, inherited, nothing pickled) and
    parse at once, and are told the CPU so they never ask CUDA anything. Without it they are spawned (a fresh
    interpreter: no forked torch or CUDA state) and each loads Stanza itself."""
    forked = pipeline is not None
    # a worker's parser: no cache (this process keeps it)
    own = settings.replace(workers=1, cache_path=None, device="cpu" if forked else settings.device)
    return _started(settings.workers, forked, _adopt_worker, (own, os.getpid(), pipeline))


def _adopt_worker(settings: ParserSettings, parent: int, pipeline: Any) -> None:
    """Make this process a worker: its own Stanza, with `pipeline` when it came loaded from the parent (fork),
    else loading Stanza now (spawn)."""
    global _WORKER
    exit_with_parent(parent)
    use_threads(settings.threads, where="parser worker")
    _WORKER = StanzaRunner(settings, resolve_gpu(settings.device), pipeline)
    _WORKER.loaded()
    freeze_for_life()


def parse_in_worker(texts: list[str]) -> tuple[dict[str, Parsed | Unparsed], float]:
    """(outcome by text, seconds Stanza ran) for one batch, in a worker process."""
    assert _WORKER is not None, "the pool's initializer loads the worker's Stanza"
    return _WORKER.parse_batch(texts)


def start_tokenizers(workers: int) -> ProcessPoolExecutor:
    """`workers` processes that tokenize (`tokenize_in_worker`), ending with this process, started now: forked
    where no other thread runs (at once, and a script that calls spinn needs no `__main__` guard, which a
    spawned child would re-import), else spawned (a fresh interpreter: it imports the tokenizer alone)."""
    return _started(workers, can_fork(use_gpu=False), _adopt_tokenizer, (os.getpid(),))  # never asks CUDA anything


def _started(workers: int, forked: bool, initializer: Any, initargs: tuple) -> ProcessPoolExecutor:
    """A pool of `workers` processes, forked or spawned, each made now (not at its first task), so they are
    ready when the batches come; forked children are made under gc_frozen, and what they inherit stays so."""
    import multiprocessing

    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("fork" if forked else "spawn"),
        initializer=initializer,
        initargs=initargs,
    )
    with gc_frozen():
        for _ in range(workers):
            pool.submit(time.sleep, 0)
    return pool


def _adopt_tokenizer(parent: int) -> None:
    exit_with_parent(parent)
    forget_pauses()  # a forked child inherits the pause of the shard that started it, not the shard's end
    freeze_for_life()


def tokenize_in_worker(texts: list[str]) -> list[list[str]]:
    """Each text's tokens, in a tokenizer worker: token lists cross back (they unpickle faster than Parsed)."""
    with gc_paused():  # lists of strings, no cycles
        return [tokenize(text) for text in texts]
