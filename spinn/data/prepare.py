"""The prepare stage: an NLI corpus file -> `<split>.parquet` + `<split>.rejects.jsonl`.

Good lines become rows of the prepared-pairs schema (spinn.data.schema); bad lines go
to the rejects file with file, line, field and reason (a pair id seen on an
earlier line too, as `duplicate_id`); gold label `-` is counted and skipped.
Both outputs are published together (`spinn.ground.io.atomic_paths`: a reader never
sees a new Parquet file beside the old rejects). The stage fails when the share of
rejected lines passes `max_reject_ratio`, and then it publishes the rejects
(to inspect) but not the Parquet file (so no later stage trains on it); and
when no line gave a pair, publishing nothing, since an empty split is no
split. Temporaries a killed run left in the output folder go at the start.
"""

from __future__ import annotations

import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, islice
from multiprocessing import get_context
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from spinn.data.corpus import (
    ID_FIELD,
    LineFormat,
    Pair,
    Skip,
    TreeSource,
    corpus_lines,
    open_corpus,
    pair_from_record,
    read_record,
)
from spinn.data.limits import DEFAULT_MAX_TOKENS, MaxTokens
from spinn.data.rejects import RecordProblem, Reject, RejectReason, reject_pair_id
from spinn.data.schema import PAIR_FIELDS, pair_schema
from spinn.data.split_files import prepared_files, with_partner
from spinn.data.text_lines import Overlong
from spinn.ground.children import exit_with_parent
from spinn.ground.cores import usable_cores
from spinn.ground.errors import SpinnError
from spinn.ground.io import atomic_paths, publish, publishing, tidy_folder
from spinn.ground.paths import plain_file_name
from spinn.ground.settings import Settings

DEFAULT_MAX_REJECT_RATIO = 0.01
PIPELINE_SPLITS = ("train", "dev", "test")
"""The splits the pipeline trains on, selects on, and reports on."""
ROW_GROUP_ROWS = 65_536
CHUNK_LINES = 8_192
"""Lines per unit of work sent to a worker: big enough to amortize the hand-off."""
CHUNKS_IN_FLIGHT_PER_WORKER = 2
"""Bounded read-ahead, so memory stays flat however large the corpus is."""
MAX_DEFAULT_WORKERS = 4
"""Past this the single reader/writer process, not parsing, is the bottleneck."""
"""A prepared split is two files: `<split>.parquet` and `<split>.rejects.jsonl`, published together."""
_SPLIT_NAME = re.compile(r"(?:^|[_.-])((?:train|dev|test|validation)(?:[_-]\w+)?)$")
_CORPUS_SUFFIXES = (".gz", ".jsonl", ".json", ".txt", ".tsv")


@dataclass
class PrepareSummary:
    """What the stage did, for the CLI, Prefect artifacts and tests."""

    source: str
    split: str
    output: Path
    rejects: Path
    read: int = 0
    written: int = 0
    skipped: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def reject_ratio(self) -> float:
        return self.rejected_total / self.read if self.read else 0.0

    def report(self) -> list[str]:
        lines = [
            f"{self.source} -> {self.output}",
            f"read {self.read}  written {self.written}  skipped (no consensus) {self.skipped}  "
            f"rejected {self.rejected_total} ({self.reject_ratio:.2%})",
        ]
        lines += [f"  rejected {reason}: {count}" for reason, count in sorted(self.rejected.items())]
        if self.rejected_total:
            lines.append(f"rejects listed in {self.rejects}")
        return lines


def infer_split(name: str) -> str:
    """`snli_1.0_train.jsonl` -> `train`; `multinli_1.0_dev_matched.txt` -> `dev_matched`."""
    stem = Path(name).name
    while stem.endswith(_CORPUS_SUFFIXES):
        stem = stem.rsplit(".", 1)[0]
    match = _SPLIT_NAME.search(stem)
    return match.group(1) if match else stem


@dataclass
class ChunkResult:
    """The outcome of converting one chunk of lines, in line order."""

    pairs: pa.Table
    rejects: list[Reject]
    read: int
    skipped: int


class PairWriter:
    """Collects converted chunks and writes one Parquet row group per ROW_GROUP_ROWS rows."""

    def __init__(self, path: Path, schema: pa.Schema):
        self._writer = pq.ParquetWriter(path, schema)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0

    def add(self, pairs: pa.Table) -> None:
        self._pending.append(pairs)
        self._pending_rows += pairs.num_rows
        self.rows += pairs.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._pending_rows:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=ROW_GROUP_ROWS)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        self.flush()
        self._writer.close()


class TooManyRejects(SpinnError):
    """More lines were rejected than `max_reject_ratio` allows; carries the summary to show."""

    def __init__(self, message: str, summary: PrepareSummary):
        super().__init__(message)
        self.summary = summary


def default_workers() -> int:
    """One process per core this process may use (affinity and cgroup quota), up to the cap."""
    return min(usable_cores(), MAX_DEFAULT_WORKERS)


class PrepareSettings(Settings):
    """How a corpus file becomes prepared pairs."""

    section: ClassVar[str] = "prepare"
    not_on_cli: ClassVar[dict[str, str]] = {
        "splits": "`spinn prepare` converts one file (INPUT, --member); dvc.yaml's foreach and the flows "
        "prepare every split of `splits`"
    }

    max_reject_ratio: float = Field(DEFAULT_MAX_REJECT_RATIO, ge=0, le=1)
    """Fail when more than this share of lines is rejected."""
    trees: TreeSource = TreeSource.AUTO
    """Tree source: the corpus's binary parse, or its n-ary parse through our binarizer (auto: binary if present)."""
    workers: int | None = Field(None, ge=1)
    """Parsing processes (default: the CPU count, at most 4); the output is the same for any number."""
    max_tokens: MaxTokens = DEFAULT_MAX_TOKENS
    """A sentence longer than this many tokens allows in characters (spinn.data.limits) is rejected as
    too_long before its tree is read."""
    splits: dict[str, str] | None = None
    """Split -> file in the archive (default: the corpus's train, dev and test files)."""

    @field_validator("splits")
    @classmethod
    def _pipeline_splits(cls, splits: dict[str, str] | None) -> dict[str, str] | None:
        missing = sorted(set(PIPELINE_SPLITS) - set(splits or PIPELINE_SPLITS))
        if missing:
            raise ValueError(f"splits must name {', '.join(PIPELINE_SPLITS)}; missing {missing}")
        for split in splits or {}:  # each becomes a file name: refused here, before any stage or flow runs
            try:
                plain_file_name(split)
            except SpinnError as error:
                raise ValueError(str(error)) from None
        return splits


def prepare(
    input_path: Path,
    output_dir: Path,
    settings: PrepareSettings | None = None,
    *,
    split: str | None = None,
    member: str | None = None,
) -> PrepareSummary:
    """Convert one corpus file into prepared pairs; see the module docstring for the contract.

    Lines are converted in chunks by `settings.workers` processes while this
    process reads and writes in order, so the output is the same whatever the
    number of workers.
    """
    settings = settings or PrepareSettings()
    trees, workers = settings.trees, settings.workers
    input_path, output_dir = Path(input_path), Path(output_dir)
    tidy_folder(output_dir)
    with open_corpus(input_path, member) as (stream, name):
        source = f"{input_path}:{name}" if name != input_path.name else str(input_path)
        split = split or infer_split(name)
        summary = PrepareSummary(source, split, *prepared_files(output_dir, split))
        line_format, lines = corpus_lines(stream, name, settings.max_tokens)
        convert = partial(
            convert_chunk, line_format=line_format, source=source, trees=trees, max_tokens=settings.max_tokens
        )
        with (
            publishing((summary.output, summary.rejects), inputs=with_partner(input_path), names=(split,)),
            atomic_paths(summary.output, summary.rejects) as (parquet_tmp, rejects_tmp),
        ):
            results = _run_chunks(convert, _chunks(lines), workers or default_workers())
            _write_results(results, parquet_tmp, rejects_tmp, summary, trees)
            _check_reject_ratio(summary, settings.max_reject_ratio, rejects_tmp)
            _check_some_pairs(summary)
    return summary


def _chunks(lines: Iterator[tuple[int, bytes | Overlong]]) -> Iterator[Chunk]:
    while chunk := list(islice(lines, CHUNK_LINES)):
        yield chunk


Chunk = list[tuple[int, bytes | Overlong]]
"""(line number, raw bytes, or an over-long line's start and length) of consecutive lines."""


def _run_chunks(convert, chunks: Iterable[Chunk], workers: int) -> Iterator[tuple[Chunk, ChunkResult]]:
    """Convert chunks in order: inline for one worker, else in a process pool with bounded read-ahead.
    Each result comes with its chunk, whose raw lines a reject found after conversion quotes.

    Worker processes are spawned, not forked, so a caller with threads (a
    Prefect task runner, say) is safe; they end with this process, even when it is killed.
    """
    chunks = iter(chunks)
    first_two = list(islice(chunks, 2))
    if workers <= 1 or len(first_two) < 2:  # one chunk: a pool would cost more than it saves
        yield from ((chunk, convert(chunk)) for chunk in chain(first_two, chunks))
        return
    chunks = chain(first_two, chunks)
    spawn = get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=spawn, initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        pending: deque[tuple[Chunk, Future[ChunkResult]]] = deque()
        for chunk in chunks:
            pending.append((chunk, pool.submit(convert, chunk)))
            if len(pending) >= workers * CHUNKS_IN_FLIGHT_PER_WORKER:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()


def convert_chunk(
    chunk: Chunk, *, line_format: LineFormat, source: str, trees: TreeSource, max_tokens: int
) -> ChunkResult:
    """Turn raw lines into a table of pairs plus the rejects; runs in a worker process."""
    columns: dict[str, list] = {f.name: [] for f in PAIR_FIELDS}
    rejects: list[Reject] = []
    read = skipped = 0
    for line, raw in chunk:
        record = read_record(raw, line_format)
        if record is None:
            continue
        read += 1
        outcome = _convert(record[1], line, record[0], source, trees, max_tokens)
        if isinstance(outcome, Pair):
            for name, values in columns.items():
                values.append(getattr(outcome, name))
        elif isinstance(outcome, Skip):
            skipped += 1
        else:
            rejects.append(outcome)
    return ChunkResult(pa.table(columns, schema=pa.schema(PAIR_FIELDS)), rejects, read, skipped)


def _write_results(
    results: Iterable[tuple[Chunk, ChunkResult]],
    parquet_path: Path,
    rejects_path: Path,
    summary: PrepareSummary,
    trees: TreeSource,
) -> None:
    """Write chunk results in order into the Parquet file and the rejects file, counting as they come.

    Pair ids are checked here, across chunks (the workers each see one): a
    pair whose id an earlier line had is rejected as `duplicate_id`."""
    schema = pair_schema(source=summary.source, trees=trees.value)
    writer = PairWriter(parquet_path, schema)
    first_lines: dict[str, int] = {}
    with open(rejects_path, "w", encoding="utf-8") as rejects:
        for chunk, result in results:
            pairs, duplicates = _without_duplicates(result.pairs, chunk, first_lines, summary.source)
            writer.add(pairs.replace_schema_metadata(schema.metadata))
            summary.read += result.read
            summary.skipped += result.skipped
            for reject in sorted(result.rejects + duplicates, key=lambda reject: reject.line):
                summary.rejected[reject.reason.value] += 1
                rejects.write(reject.to_json() + "\n")
    writer.close()
    summary.written = writer.rows


def _without_duplicates(
    pairs: pa.Table, chunk: Chunk, first_lines: dict[str, int], source: str
) -> tuple[pa.Table, list[Reject]]:
    """The chunk's pairs whose id is new, and a reject for each one whose id an earlier line had."""
    keep, duplicates = [], []
    lines = pairs.column("source_line").to_pylist()
    for pair_id, line in zip(pairs.column("pair_id").to_pylist(), lines, strict=True):
        first = first_lines.setdefault(pair_id, line)
        keep.append(first == line)
        if first != line:
            message = f"pair id {pair_id!r} is on line {first} already"
            raw = _raw(chunk, line)
            duplicates.append(Reject(source, line, RejectReason.DUPLICATE_ID, ID_FIELD, message, raw, pair_id))
    return (pairs if all(keep) else pairs.filter(pa.array(keep))), duplicates


def _raw(chunk: Chunk, line: int) -> str:
    """The line as written, for a reject record."""
    raw = next(raw for number, raw in chunk if number == line)
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _check_some_pairs(summary: PrepareSummary) -> None:
    """An input without one valid pair is a mistake (an empty or wrong file), never a split to publish."""
    if summary.written == 0:
        raise SpinnError(
            f"{summary.source}: no valid pairs (read {summary.read} lines: {summary.skipped} without consensus, "
            f"{summary.rejected_total} rejected); {summary.output} and {summary.rejects} left as they were"
        )


def _check_reject_ratio(summary: PrepareSummary, max_reject_ratio: float, rejects_tmp: Path) -> None:
    """Too many rejects: publish the rejects file alone, for the user to see why, and fail."""
    if summary.reject_ratio > max_reject_ratio:
        publish(rejects_tmp, summary.rejects)
        raise TooManyRejects(
            f"{summary.source}: {summary.rejected_total} of {summary.read} lines rejected "
            f"({summary.reject_ratio:.2%}), more than max_reject_ratio {max_reject_ratio:.2%}; "
            f"see {summary.rejects}; {summary.output} not written",
            summary,
        )


def _convert(record, line: int, raw: str, source: str, trees: TreeSource, max_tokens: int) -> Pair | Skip | Reject:
    """One line's outcome: its pair, a skip, or the reject that says why."""
    problem = record if isinstance(record, RecordProblem) else None
    if problem is None:
        try:
            return pair_from_record(record, line, trees, max_tokens)
        except RecordProblem as raised:
            problem = raised
    return Reject.of(problem, source, line, raw, reject_pair_id(record, ID_FIELD, line))
