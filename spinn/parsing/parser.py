"""Constituency parsing of raw sentences with Stanza: the one door to Stanza.

New corpora arrive as plain text, so their trees come from Stanza's
constituency parser, then go through `spinn.trees.binarize` like SNLI's own trees.
Parsing is the slow step of the pipeline, and NLI data repeats itself (each
premise has several hypotheses), so `SentenceParser`:

- parses each distinct text once per call, in batches (Stanza is far faster on
  many sentences at once);
- keeps every parse in a SQLite cache keyed by (parser model, text), so reruns,
  overlapping corpora and parallel workers parse nothing twice. The key is a
  hash of the model files actually loaded, never their path, so a new model
  can never be served an old model's trees;
- turns every failure into an `Unparsed` with a reject reason, so one bad
  sentence never stops the others;
- runs Stanza with few torch threads (`threads`), in this process or in
  `workers` worker processes that parse batches of length-sorted sentences in
  parallel, while the caller goes on (`submit`).

Why threads are few: Stanza's small LSTMs gain nothing from more torch
threads, and when processes share cores, threads that wait on each other cost
several times the work (on two shared cores, 400 SNLI sentences took 2.8 s
with one thread and 19 s with two). Batches are cut from the length-sorted
distinct texts before they are handed out, so which sentences share a batch
never depends on the number of workers; the longest go out first, so no
worker is left with a long batch at the end while the others idle.

How workers start decides whether they pay on small inputs: a spawned worker
imports torch and Stanza and loads the models (about 5 s on the 2-core test
machine, as long as parsing 400 sentences), so on Linux with the parser on
the CPU this process loads Stanza once and forks the workers, which share
the loaded models and start at once. A parser on the GPU, or in a process
that runs other threads (a Prefect or Dask worker), spawns them instead.

Stanza (and torch behind it) is slow to import, so it is imported only inside
the functions that need it, and only here.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import Field

from spinn.data.rejects import RejectReason
from spinn.errors import SpinnError
from spinn.io import file_digest
from spinn.settings import AUTO, Device, Settings, count_or_auto, env_default, usable_cores
from spinn.trees.binarize import binarize
from spinn.trees.transitions import tree_to_transitions
from spinn.trees.tree import Tree, format_binary

DEFAULT_CACHE_PATH = Path("data/parse_cache/parses.sqlite")
STANZA_PROCESSORS = "tokenize,pos,constituency"
RESOURCES_FILE = "resources.json"
MODEL_PATH_SUFFIX = "_path"  # Stanza config keys naming model files: pos_model_path, pos_pretrain_path, ...
STANZA_LOG_LEVEL = "ERROR"  # Stanza logs every model it loads at INFO
# Bump when tree conversion, leaf normalisation or binarization changes what a cache entry holds.
OUTPUT_VERSION = "spinn-parse-1"
ROOT_LABEL = "ROOT"
CACHE_TIMEOUT_S = 60.0  # how long a writer waits for another process's transaction
PARENT_POLL_S = 0.5  # how often a parser worker checks that its parent still runs
CACHE_LOOKUP_CHUNK = 500  # texts per SELECT, well under SQLite's bound-parameter limit
CPU_BATCH_SIZE = 256
"""Parse batch auto on the CPU: 1,333 SNLI sentences took 11.7 s in batches of 64, 11.7 s of 1,024, 11.1 s
of 5,000 (one thread, 2-core EPYC): the size hardly matters there, and smaller batches balance workers."""
GPU_BATCH_SIZE = 1024
"""Parse batch auto on the GPU: 8,000 SNLI test pairs took 76 s in batches of 1,024 against 83 s of 256
(one H100, issue 17)."""
FORK_PLATFORM = "linux"  # fork is unsafe with macOS system libraries and absent on Windows

# Penn Treebank spellings of brackets and quotes, as in SNLI's parses.
PTB_FORMS = {
    "(": "-LRB-",
    ")": "-RRB-",
    "[": "-LSB-",
    "]": "-RSB-",
    "{": "-LCB-",
    "}": "-RCB-",
    "\u201c": "``",
    "\u201d": "''",
}
STRAIGHT_QUOTE = '"'
OPENING_QUOTE, CLOSING_QUOTE = "``", "''"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS parses (
    model_id TEXT NOT NULL,
    text TEXT NOT NULL,
    tokens TEXT NOT NULL,
    transitions TEXT NOT NULL,
    binary_parse TEXT NOT NULL,
    PRIMARY KEY (model_id, text)
) WITHOUT ROWID
"""
_INSERT = "INSERT OR REPLACE INTO parses VALUES (?, ?, ?, ?, ?)"


WorkerCount = count_or_auto("processes")
SentenceCount = count_or_auto("sentences")


class ParserSettings(Settings):
    """How Stanza runs, and where its parses are cached."""

    stanza_dir: Path | None = Field(
        default_factory=env_default("SPINN_STANZA_DIR"),
        validate_default=True,
        json_schema_extra={"cli": "--stanza-dir"},
    )
    """A local stanza_resources folder, used offline (default: Stanza's own models under
    STANZA_RESOURCES_DIR, downloaded when missing)."""
    language: str = Field("en", json_schema_extra={"cli": "--parser-language"})
    """Stanza's language code."""
    batch_size: SentenceCount = Field(AUTO, json_schema_extra={"cli": "--parse-batch-size"})
    """Sentences per Stanza batch; auto: 256 on the CPU (no size was faster there), 1024 on the GPU."""
    device: Device = Field("auto", json_schema_extra={"cli": "--parser-device"})
    """Where Stanza runs; auto: the GPU when there is one."""
    max_tokens: int = Field(100, ge=1, json_schema_extra={"cli": "--max-tokens"})
    """Longer sentences are rejected (too_long)."""
    cache_path: Path | None = Field(DEFAULT_CACHE_PATH, json_schema_extra={"cli": "--parse-cache"})
    """Parses cached by sentence and parser model (none: no cache; the CLI's --no-parse-cache)."""
    workers: WorkerCount = Field(AUTO, json_schema_extra={"cli": "--workers"})
    """Parser processes: 1 parses in this process; more start that many worker processes (trees do not depend
    on it); auto: one per core this process may use when Stanza runs on the CPU, 1 on the GPU."""
    threads: int = Field(1, ge=1, json_schema_extra={"cli": "--parser-threads"})
    """torch threads per parser process: Stanza's small models gain nothing from more, and lose much when
    processes share cores."""
    pretokenized: bool = Field(False, json_schema_extra={"cli": "--pretokenized/--raw-text"})
    """The sentences are already tokenized, tokens separated by spaces: Stanza's tokenizer is skipped (faster).
    Leave off for raw text, which Stanza tokenizes."""


DEFAULT_SETTINGS = ParserSettings()


@dataclass(frozen=True)
class Parsed:
    tokens: list[str]  # PTB-normalised leaves
    transitions: list[int]  # SHIFT/REDUCE of the binarized tree, 2n - 1 long
    binary_parse: str  # SNLI's `( left right )` format


@dataclass(frozen=True)
class Unparsed:
    reason: RejectReason  # EMPTY_SENTENCE, TOO_LONG or PARSE_FAILED
    message: str


@dataclass
class ParseStats:
    """Running totals over all `parse` calls; counts are of input texts, except `parsed`,
    which counts the (stripped) texts Stanza actually ran."""

    requested: int = 0
    distinct: int = 0
    cache_hits: int = 0
    parsed: int = 0
    rejected: int = 0
    parse_seconds: float = 0.0


Progress = Callable[[int], None]
"""Told the number of distinct sentences each time a batch of them is parsed."""


class PendingParses:
    """The parses of one `submit` call: `result()` waits for the batches still running in workers."""

    def __init__(self, parser: SentenceParser, texts: list[str], keys: list[str]) -> None:
        self._parser, self._texts, self._keys = parser, texts, keys
        self._early: dict[str, Parsed | Unparsed] = {}
        self._keys_by_text: dict[str, list[str]] = {}
        self._outcomes: dict[str, Parsed | Unparsed] = {}
        self._futures: dict[str, Future] = {}  # text -> the future of its batch (this call's or an earlier one's)
        self._started = time.perf_counter()
        self._last_done = self._started
        self.to_parse = 0
        """Distinct texts this call gives to Stanza (not cached, not already in flight)."""

    @property
    def seconds(self) -> float:
        """Wall seconds from the call until its last batch was parsed (waiting for `result` not counted)."""
        return self._last_done - self._started

    def seconds_after(self, moment: float) -> float:
        """Wall seconds of parsing after `moment` (perf_counter): time that parses of an earlier call,
        queued ahead of this one's, did not already account for."""
        return max(self._last_done - max(self._started, moment), 0.0)

    @property
    def finished_at(self) -> float:
        return self._last_done

    def _done(self, _future: Future | None = None) -> None:
        self._last_done = max(self._last_done, time.perf_counter())

    def result(self) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order."""
        return self._parser._finish(self)


class SentenceParser:
    """Parses raw sentences into binary trees; Stanza loads on the first text the cache lacks.

    Without a cache (cache_path None) a temporary one lives as long as the parser, so
    a sentence is still parsed once however many shards or calls it appears in."""

    def __init__(self, settings: ParserSettings = DEFAULT_SETTINGS) -> None:
        _check_settings(settings)
        self.stats = ParseStats()
        self._use_gpu = _resolve_gpu(settings.device)
        self.settings = _decided(settings, self._use_gpu)
        self._models: _Models | None = None
        self._model_id: str | None = None
        self._pipeline: Any = None
        self._cache: _ParseCache | None = None
        self._scratch: Path | None = None  # the temporary cache's folder when cache_path is None
        self._pool: ProcessPoolExecutor | None = None
        self._in_flight: dict[str, Future] = {}

    @property
    def workers(self) -> int:
        """Parser processes this parser uses (auto decided)."""
        return int(self.settings.workers)

    @property
    def model_id(self) -> str:
        """sha256 over Stanza's version, the tokenization and the bytes of every model file the pipeline loads."""
        if self._model_id is None:
            self._model_id = _model_id(self._resolved().files, self.settings.pretokenized)
        return self._model_id

    def parse(self, sentences: Iterable[str]) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order."""
        return self.submit(sentences).result()

    def submit(self, sentences: Iterable[str], progress: Progress | None = None) -> PendingParses:
        """Start parsing what the cache lacks and return at once when workers parse (else when done).

        A text already in flight for an earlier call waits for that call's batch: never parsed twice."""
        texts = list(sentences)
        pending = PendingParses(self, texts, list(dict.fromkeys(texts)))
        pending._early, pending._keys_by_text = _precheck_all(pending._keys, self.settings.max_tokens)
        wanted = list(pending._keys_by_text)
        pending._outcomes = self._cached(wanted)
        self.stats.cache_hits += sum(len(pending._keys_by_text[text]) for text in pending._outcomes)
        waiting = [text for text in wanted if text not in pending._outcomes]
        pending._futures = {text: self._in_flight[text] for text in waiting if text in self._in_flight}
        missing = [text for text in waiting if text not in pending._futures]
        pending.to_parse = len(missing)
        if missing:
            self._loaded_models()  # before any try: a missing model is an error, not a rejected sentence
        for batch in _batches(missing, int(self.settings.batch_size)):
            if self.workers > 1:
                future = self._worker_pool().submit(_parse_in_worker, batch)
                pending._futures.update(dict.fromkeys(batch, future))
                self._in_flight.update(dict.fromkeys(batch, future))
                if progress is not None:
                    future.add_done_callback(_told(progress, len(batch)))
            else:
                outcomes = self._parse_batch(batch)
                self._keep(outcomes)
                pending._outcomes.update(outcomes)
                if progress is not None:
                    progress(len(batch))
        self.stats.parsed += len(missing)
        pending._done()
        for future in dict.fromkeys(pending._futures.values()):
            future.add_done_callback(pending._done)
        return pending

    def _finish(self, pending: PendingParses) -> dict[str, Parsed | Unparsed]:
        outcomes = pending._outcomes
        for future in dict.fromkeys(pending._futures.values()):
            parsed, seconds = future.result()
            if any(self._in_flight.get(text) is future for text in parsed):  # not yet kept by an earlier call
                self._keep(parsed)
                self.stats.parse_seconds += seconds
                for text in parsed:
                    self._in_flight.pop(text, None)
            outcomes.update({text: parsed[text] for text in parsed if text in pending._keys_by_text})
        results = dict(pending._early)
        for text, text_keys in pending._keys_by_text.items():
            results.update(dict.fromkeys(text_keys, _within_limit(outcomes[text], self.settings.max_tokens)))
        self.stats.requested += len(pending._texts)
        self.stats.distinct += len(pending._keys)
        self.stats.rejected += sum(isinstance(result, Unparsed) for result in results.values())
        return {key: results[key] for key in pending._keys}

    def close(self) -> None:
        """Stop the workers and close the cache connection (a later `parse` reopens both)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            self._in_flight.clear()
        if self._cache is not None:
            self._cache.close()
            self._cache = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ cache

    def _open_cache(self) -> _ParseCache:
        if self._cache is None:
            if self.settings.cache_path is not None:
                path = Path(self.settings.cache_path)
            else:
                self._scratch = Path(tempfile.mkdtemp(prefix="spinn-parses-"))
                path = self._scratch / "parses.sqlite"
            self._cache = _ParseCache(path)
        return self._cache

    def _cached(self, texts: list[str]) -> dict[str, Parsed | Unparsed]:
        """The parses the cache already holds for this model."""
        return dict(self._open_cache().get(self.model_id, texts)) if texts else {}

    def _keep(self, outcomes: dict[str, Parsed | Unparsed]) -> None:
        """Cache a batch's parses in one transaction (failures are not cached: a rerun tries them again)."""
        self._open_cache().put(self.model_id, {text: out for text, out in outcomes.items() if isinstance(out, Parsed)})

    # ------------------------------------------------------------------ Stanza

    def _parse_batch(self, texts: list[str]) -> dict[str, Parsed | Unparsed]:
        """Parse texts together; if Stanza fails on the batch, retry one by one to isolate the culprit."""
        try:
            documents = self._run_stanza(texts)
        except Exception:  # noqa: BLE001 - any Stanza failure: find out which sentence caused it
            return {text: self._parse_one(text) for text in texts}
        return {text: _outcome(document.sentences) for text, document in zip(texts, documents, strict=True)}

    def _parse_one(self, text: str) -> Parsed | Unparsed:
        try:
            (document,) = self._run_stanza([text])
        except Exception as error:  # noqa: BLE001 - a sentence Stanza cannot parse is rejected, not fatal
            return Unparsed(RejectReason.PARSE_FAILED, f"Stanza failed: {_describe(error)}")
        return _outcome(document.sentences)

    def _run_stanza(self, texts: list[str]) -> list[Any]:
        """Stanza's trees for the texts; in inference mode, which spares torch's autograd bookkeeping on each
        of the parser's many small ops (Stanza's own no_grad keeps some), with the same numbers."""
        import torch

        pipeline = self._loaded_pipeline()
        started = time.perf_counter()
        try:
            with torch_threads(self.settings.threads), torch.inference_mode(), gc_frozen():
                return pipeline.bulk_process(texts)  # pretokenized: each text's tokens split on spaces
        finally:
            self.stats.parse_seconds += time.perf_counter() - started

    def _loaded_models(self) -> None:
        """Stanza ready to parse: here, or in every worker (started now)."""
        if self.workers > 1:
            self._worker_pool()
        else:
            self._loaded_pipeline()

    def _loaded_pipeline(self) -> Any:
        if self._pipeline is None:
            with torch_threads(self.settings.threads):  # no larger thread pool for forked workers to inherit
                self._pipeline = _build_pipeline(self.settings, self._resolved(), self._use_gpu)
        return self._pipeline

    def _worker_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._resolved()  # a missing model is one clear error here, not one per worker (downloads once too)
            pipeline = self._loaded_pipeline() if _can_fork(self._use_gpu) else None
            self._pool = _start_pool(self.settings, pipeline)
        return self._pool

    def _resolved(self) -> _Models:
        if self._models is None:
            self._models = _resolve_models(self.settings)
        return self._models


@contextmanager
def gc_frozen() -> Iterator[None]:
    """Every object alive when the block starts (a loaded Stanza is ~326,000) is out of the garbage collector's
    sight during it: the collections that parsing triggers stop walking them (about 10% less CPU on the test
    machine). Both steps are O(1); afterwards they are collectable again, so a closed parser's models (Stanza's
    processors and pipeline refer to each other) are freed. Python's gc docs advise freezing before fork, so
    forked workers do not copy the pages the collector would touch. In a worker process the freeze is for life."""
    if _WORKER is not None:  # a worker process: frozen for life (_adopt_worker)
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _batches(texts: list[str], size: int) -> list[list[str]]:
    """Batches of the texts sorted by length (less padding in Stanza), cut the same way for any worker count;
    longest first, so the long batches are not the last ones left while other workers idle."""
    ordered = sorted(texts, key=lambda text: (len(text), text))
    return [ordered[start : start + size] for start in range(0, len(ordered), size)][::-1]


def _told(progress: Progress, size: int) -> Callable[[Future], None]:
    """A future's done-callback that reports its batch's size."""
    return lambda _: progress(size)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with that many torch intra-op threads, and give the caller its own setting back."""
    import torch

    previous = torch.get_num_threads()
    if previous != threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if previous != threads:
            torch.set_num_threads(previous)


# ---------------------------------------------------------------------- worker processes

_WORKER: SentenceParser | None = None
"""A worker process's own parser: no cache (the parent keeps it), one process's worth of threads."""


def _can_fork(use_gpu: bool) -> bool:
    """Whether workers may be forked from this process: Linux, Stanza on the CPU (a forked child cannot use
    the parent's CUDA state), and no other thread running (a child gets only the forking thread, and any lock
    another thread held stays locked in it: a Prefect or Dask worker process spawns instead)."""
    import multiprocessing

    return (
        sys.platform.startswith(FORK_PLATFORM)
        and not use_gpu
        and threading.active_count() == 1
        and "fork" in multiprocessing.get_all_start_methods()
    )


def _start_pool(settings: ParserSettings, pipeline: Any) -> ProcessPoolExecutor:
    """`workers` processes, started now so they are ready when the batches come. Given the `pipeline` this
    process loaded, they are forked: they share its models (copy-on-write, inherited, nothing pickled) and
    parse at once, and are told the CPU so they never ask CUDA anything. Without it they are spawned (a fresh
    interpreter: no forked torch or CUDA state) and each loads Stanza itself."""
    import multiprocessing

    forked = pipeline is not None
    own = settings.replace(workers=1, cache_path=None, device="cpu" if forked else settings.device)
    pool = ProcessPoolExecutor(
        settings.workers,
        mp_context=multiprocessing.get_context("fork" if forked else "spawn"),
        initializer=_adopt_worker,
        initargs=(own, os.getpid(), pipeline),  # a worker's parser: no cache (this process keeps it)
    )
    with gc_frozen():  # forked children are made here, and stay frozen
        for _ in range(settings.workers):
            pool.submit(time.sleep, 0)
    return pool


def _adopt_worker(settings: ParserSettings, parent: int, pipeline: Any) -> None:
    """Make this process a worker: its own parser, with `pipeline` when it came loaded from the parent (fork),
    else loading Stanza now (spawn)."""
    import torch

    global _WORKER
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="exit-with-parent").start()
    torch.set_num_threads(settings.threads)
    _WORKER = SentenceParser(settings)
    _WORKER._pipeline = pipeline
    _WORKER._loaded_pipeline()
    gc.freeze()  # a worker parses until it ends: what it loaded stays out of the collector's sight


def _exit_with(parent: int) -> None:
    """End this worker once its parent is gone: a killed `spinn label` (kill -9 runs no cleanup) must not
    leave its workers behind, waiting forever for batches."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _parse_in_worker(texts: list[str]) -> tuple[dict[str, Parsed | Unparsed], float]:
    """(outcome by text, seconds Stanza ran) for one batch, in a worker process."""
    assert _WORKER is not None, "the pool's initializer loads the worker's parser"
    before = _WORKER.stats.parse_seconds
    return _WORKER._parse_batch(texts), _WORKER.stats.parse_seconds - before


# ---------------------------------------------------------------------- settings and models


def _check_settings(settings: ParserSettings) -> None:
    folder = settings.stanza_dir
    if folder is not None and not Path(folder).is_dir():
        raise SpinnError(f"Stanza model folder {folder} does not exist")
    if folder is not None and not (Path(folder) / RESOURCES_FILE).is_file():
        raise SpinnError(f"Stanza model folder {folder} has no {RESOURCES_FILE}: not a stanza_resources folder")


def decided(settings: ParserSettings) -> ParserSettings:
    """The settings with every auto decided for this machine: what a parser with them runs."""
    return _decided(settings, _resolve_gpu(settings.device))


def _decided(settings: ParserSettings, use_gpu: bool) -> ParserSettings:
    batch_size = settings.batch_size
    if batch_size == AUTO:
        batch_size = GPU_BATCH_SIZE if use_gpu else CPU_BATCH_SIZE
    return settings.replace(workers=_resolve_workers(settings.workers, use_gpu), batch_size=batch_size)


def _resolve_workers(workers: int | str, use_gpu: bool) -> int:
    """auto: one process per core this process may use on the CPU; one on the GPU, which a single Stanza
    process already shares with the model."""
    if workers != AUTO:
        return int(workers)
    if use_gpu:
        return 1
    return usable_cores()


def _resolve_gpu(device: str) -> bool:
    """True when Stanza should run on CUDA: asked for, or `auto` with a GPU present."""
    import torch

    if device == "cpu":  # asks nothing of CUDA: a worker forked from a process that uses the GPU must not
        return False
    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise SpinnError("device 'cuda' was requested but torch sees no CUDA GPU; use device 'cpu' or 'auto'")
    return available and device != "cpu"


@dataclass(frozen=True)
class _Models:
    folder: Path  # a stanza_resources folder
    files: dict[str, Path]  # Stanza config key (pos_model_path, pos_pretrain_path, ...) -> model file


def _resolve_models(settings: ParserSettings) -> _Models:
    """The model files the pipeline will load, as Stanza itself resolves them.

    Offline (stanza_dir given), a missing file is a SpinnError; otherwise Stanza
    downloads what is missing into its default folder first.
    """
    from stanza.resources.common import DEFAULT_MODEL_DIR

    folder = Path(settings.stanza_dir or DEFAULT_MODEL_DIR)
    files = (
        _stanza_model_files(folder, settings.language, settings.pretokenized)
        if (folder / RESOURCES_FILE).is_file()
        else {}
    )
    missing = sorted({str(path.relative_to(folder)) for path in files.values() if not path.is_file()})
    if files and not missing:
        return _Models(folder, files)
    if settings.stanza_dir is not None:
        raise SpinnError(f"Stanza model folder {folder} lacks {', '.join(missing) or STANZA_PROCESSORS + ' models'}")
    _download_models(folder, settings.language)
    return _Models(folder, _stanza_model_files(folder, settings.language, settings.pretokenized))


def _stanza_model_files(folder: Path, language: str, pretokenized: bool) -> dict[str, Path]:
    """Ask Stanza's own resolver which files a tokenize,pos,constituency pipeline loads from folder
    (pretokenized text needs no multi-word token model, so Stanza loads none)."""
    from stanza.pipeline.core import build_default_config
    from stanza.resources.common import (
        add_dependencies,
        load_resources_json,
        logging_level_context,
        maintain_processor_list,
        process_pipeline_parameters,
    )

    resources = load_resources_json(str(folder))
    if language not in resources:
        raise SpinnError(f"Stanza model folder {folder} has no models for language {language!r}")
    with logging_level_context(STANZA_LOG_LEVEL, None):
        lang, _, package, processors = process_pipeline_parameters(language, str(folder), "default", STANZA_PROCESSORS)
        processor_list = maintain_processor_list(resources, lang, package, processors, maybe_add_mwt=not pretokenized)
        load_list = add_dependencies(resources, lang, processor_list)
    config = build_default_config(resources, lang, str(folder), load_list)
    return {key: Path(value) for key, value in config.items() if key.endswith(MODEL_PATH_SUFFIX)}


def _download_models(folder: Path, language: str) -> None:
    import stanza

    try:
        stanza.download(
            language,
            model_dir=str(folder),
            processors=STANZA_PROCESSORS,
            logging_level=STANZA_LOG_LEVEL,
            download_json=not (folder / RESOURCES_FILE).is_file(),
        )
    except Exception as error:
        raise SpinnError(
            f"could not download Stanza's {language!r} models into {folder} ({_describe(error)}); "
            "give a local stanza_resources folder (stanza_dir) to run offline"
        ) from error


def _model_id(files: dict[str, Path], pretokenized: bool) -> str:
    """Raw and pretokenized text of the same sentence may be split differently: their parses never mix."""
    import stanza

    digest = hashlib.sha256(f"stanza {stanza.__version__}\0{OUTPUT_VERSION}".encode())
    if pretokenized:
        digest.update(b"\0pretokenized")
    for key, path in sorted(files.items()):
        digest.update(f"\0{key}\0{file_digest(path)}".encode())
    return digest.hexdigest()


def _build_pipeline(settings: ParserSettings, models: _Models, use_gpu: bool) -> Any:
    """A pipeline that loads exactly the hashed files, never goes online, and keeps each text one sentence."""
    import stanza

    model_paths = {key: str(path) for key, path in models.files.items()}
    return stanza.Pipeline(
        settings.language,
        dir=str(models.folder),
        processors=STANZA_PROCESSORS,
        download_method=None,
        use_gpu=use_gpu,
        logging_level=STANZA_LOG_LEVEL,
        tokenize_no_ssplit=True,
        tokenize_pretokenized=settings.pretokenized,
        tokenize_batch_size=settings.batch_size,
        pos_batch_size=settings.batch_size,
        constituency_batch_size=settings.batch_size,
        **model_paths,
    )


# ---------------------------------------------------------------------- sentences and trees


def _precheck_all(keys: list[str], max_tokens: int) -> tuple[dict[str, Parsed | Unparsed], dict[str, list[str]]]:
    """(early rejections by input text, input texts to parse by their stripped text)."""
    rejections: dict[str, Parsed | Unparsed] = {}
    keys_by_text: dict[str, list[str]] = {}
    for key in keys:
        rejection = _precheck(key.strip(), max_tokens)
        if rejection is None:
            keys_by_text.setdefault(key.strip(), []).append(key)
        else:
            rejections[key] = rejection
    return rejections, keys_by_text


def _precheck(text: str, max_tokens: int) -> Unparsed | None:
    """Reject what needs no parser: empty text, or too many words even before tokenization."""
    if not text:
        return Unparsed(RejectReason.EMPTY_SENTENCE, "empty sentence")
    words = len(text.split())
    if words > max_tokens:
        return Unparsed(RejectReason.TOO_LONG, f"{words} words, more than the limit of {max_tokens} tokens")
    return None


def _within_limit(outcome: Parsed | Unparsed, max_tokens: int) -> Parsed | Unparsed:
    """Apply the token limit to Stanza's tokens (punctuation splits off, so they outnumber words)."""
    if isinstance(outcome, Parsed) and len(outcome.tokens) > max_tokens:
        return Unparsed(RejectReason.TOO_LONG, f"{len(outcome.tokens)} tokens, more than the limit of {max_tokens}")
    return outcome


def _outcome(sentences: Sequence[Any]) -> Parsed | Unparsed:
    """The Parsed form of one document's sentences (normally exactly one)."""
    if not sentences:
        return Unparsed(RejectReason.PARSE_FAILED, "Stanza found no words")
    binary = binarize(_document_tree([sentence.constituency for sentence in sentences]))
    transitions = [int(transition) for transition in tree_to_transitions(binary)]
    return Parsed(tokens=binary.leaves(), transitions=transitions, binary_parse=format_binary(binary))


def _document_tree(roots: Sequence[Any]) -> Tree:
    """One ROOT over the children of every sentence's ROOT, with PTB-normalised leaves.

    The conversion walks Stanza's nodes, never its string form, in which a `(`
    leaf would read as a bracket.
    """
    words = iter(_ptb_words([word for root in roots for word in root.leaf_labels()]))
    return Tree(ROOT_LABEL, tuple(_convert(child, words) for root in roots for child in root.children))


def _convert(node: Any, words: Iterator[str]) -> Tree:
    if not node.children:
        return Tree(next(words))
    return Tree(node.label, tuple(_convert(child, words) for child in node.children))


def _ptb_words(words: Sequence[str]) -> list[str]:
    """Brackets -> -LRB- etc.; straight double quotes alternate `` (opening) and '' (closing)."""
    normalised = []
    quote_open = False
    for word in words:
        if word == STRAIGHT_QUOTE:
            word = CLOSING_QUOTE if quote_open else OPENING_QUOTE
            quote_open = not quote_open
        normalised.append(PTB_FORMS.get(word, word))
    return normalised


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


# ---------------------------------------------------------------------- the disk cache


class _ParseCache:
    """Parses in SQLite, keyed by (model_id, text), as JSON text; safe to share between processes (WAL)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A Dask or Prefect worker may call from different threads, one at a time.
        self._db = sqlite3.connect(path, timeout=CACHE_TIMEOUT_S, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            with self._db:
                self._db.execute(_CREATE_TABLE)
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise SpinnError(f"parse cache {path} is unusable: {error}") from error

    def get(self, model_id: str, texts: list[str]) -> Iterator[tuple[str, Parsed]]:
        for start in range(0, len(texts), CACHE_LOOKUP_CHUNK):
            chunk = texts[start : start + CACHE_LOOKUP_CHUNK]
            rows = self._db.execute(
                f"SELECT text, tokens, transitions, binary_parse FROM parses "
                f"WHERE model_id = ? AND text IN ({', '.join('?' * len(chunk))})",
                [model_id, *chunk],
            )
            for text, tokens, transitions, binary_parse in rows:
                yield text, Parsed(json.loads(tokens), json.loads(transitions), binary_parse)

    def put(self, model_id: str, parses: dict[str, Parsed]) -> None:
        with self._db:  # one transaction per batch
            self._db.executemany(
                _INSERT,
                [
                    (
                        model_id,
                        text,
                        json.dumps(parsed.tokens, ensure_ascii=False),
                        json.dumps(parsed.transitions),
                        parsed.binary_parse,
                    )
                    for text, parsed in parses.items()
                ],
            )

    def close(self) -> None:
        self._db.close()
