"""The prepare stage: an NLI corpus file -> `<split>.parquet` + `<split>.rejects.jsonl`.

Good lines become rows of the prepared-pairs schema (spinn.schema); bad lines go
to the rejects file with file, line, field and reason; gold label `-` is counted
and skipped. Both outputs are written atomically. The stage fails only when the
share of rejected lines passes `max_reject_ratio`, and then it publishes the
rejects (to inspect) but not the Parquet file (so no later stage trains on it).
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

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.atomic import atomic_path
from spinn.corpus import (
    LineFormat,
    Pair,
    RecordProblem,
    Reject,
    Skip,
    TreeSource,
    corpus_lines,
    open_corpus,
    pair_from_record,
    read_record,
)
from spinn.errors import SpinnError
from spinn.schema import PAIR_FIELDS, pair_schema

DEFAULT_MAX_REJECT_RATIO = 0.01
ROW_GROUP_ROWS = 65_536
CHUNK_LINES = 8_192
"""Lines per unit of work sent to a worker: big enough to amortize the hand-off."""
CHUNKS_IN_FLIGHT_PER_WORKER = 2
"""Bounded read-ahead, so memory stays flat however large the corpus is."""
MAX_DEFAULT_WORKERS = 4
"""Past this the single reader/writer process, not parsing, is the bottleneck."""
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
    return max(1, min(os.cpu_count() or 1, MAX_DEFAULT_WORKERS))


def prepare(
    input_path: Path,
    output_dir: Path,
    *,
    split: str | None = None,
    trees: TreeSource = TreeSource.AUTO,
    member: str | None = None,
    max_reject_ratio: float = DEFAULT_MAX_REJECT_RATIO,
    workers: int | None = None,
) -> PrepareSummary:
    """Convert one corpus file into prepared pairs; see the module docstring for the contract.

    Lines are converted in chunks by `workers` processes (default: the CPU count,
    at most MAX_DEFAULT_WORKERS) while this process reads and writes in order,
    so the output is the same whatever the number of workers.
    """
    input_path, output_dir = Path(input_path), Path(output_dir)
    with open_corpus(input_path, member) as (stream, name):
        source = f"{input_path}:{name}" if name != input_path.name else str(input_path)
        split = split or infer_split(name)
        summary = PrepareSummary(source, split, output_dir / f"{split}.parquet", output_dir / f"{split}.rejects.jsonl")
        line_format, lines = corpus_lines(stream, name)
        convert = partial(convert_chunk, line_format=line_format, source=source, trees=trees)
        failure: TooManyRejects | None = None
        with atomic_path(summary.rejects) as rejects_tmp:
            try:
                with atomic_path(summary.output) as parquet_tmp:
                    results = _run_chunks(convert, _chunks(lines), workers or default_workers())
                    _write_results(results, parquet_tmp, rejects_tmp, summary, trees)
                    _check_reject_ratio(summary, max_reject_ratio)
            except TooManyRejects as error:
                failure = error
    if failure is not None:
        raise failure
    return summary


def _chunks(lines: Iterator[tuple[int, bytes]]) -> Iterator[list[tuple[int, bytes]]]:
    while chunk := list(islice(lines, CHUNK_LINES)):
        yield chunk


def _run_chunks(convert, chunks: Iterable[list[tuple[int, bytes]]], workers: int) -> Iterator[ChunkResult]:
    """Convert chunks in order: inline for one worker, else in a process pool with bounded read-ahead.

    Worker processes are spawned, not forked, so a caller with threads (a
    Prefect task runner, say) is safe.
    """
    chunks = iter(chunks)
    first_two = list(islice(chunks, 2))
    if workers <= 1 or len(first_two) < 2:  # one chunk: a pool would cost more than it saves
        yield from map(convert, chain(first_two, chunks))
        return
    chunks = chain(first_two, chunks)
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        pending: deque[Future[ChunkResult]] = deque()
        for chunk in chunks:
            pending.append(pool.submit(convert, chunk))
            if len(pending) >= workers * CHUNKS_IN_FLIGHT_PER_WORKER:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def convert_chunk(chunk: list[tuple[int, bytes]], *, line_format: LineFormat, source: str,
                  trees: TreeSource) -> ChunkResult:
    """Turn raw lines into a table of pairs plus the rejects; runs in a worker process."""
    columns: dict[str, list] = {f.name: [] for f in PAIR_FIELDS}
    rejects: list[Reject] = []
    read = skipped = 0
    for line, raw in chunk:
        record = read_record(raw, line_format)
        if record is None:
            continue
        read += 1
        outcome = _convert(record[1], line, record[0], source, trees)
        if isinstance(outcome, Pair):
            for name, values in columns.items():
                values.append(getattr(outcome, name))
        elif isinstance(outcome, Skip):
            skipped += 1
        else:
            rejects.append(outcome)
    return ChunkResult(pa.table(columns, schema=pa.schema(PAIR_FIELDS)), rejects, read, skipped)


def _write_results(results: Iterable[ChunkResult], parquet_path: Path, rejects_path: Path,
                   summary: PrepareSummary, trees: TreeSource) -> None:
    """Write chunk results in order into the Parquet file and the rejects file, counting as they come."""
    schema = pair_schema(source=summary.source, trees=trees.value)
    writer = PairWriter(parquet_path, schema)
    with open(rejects_path, "w", encoding="utf-8") as rejects:
        for result in results:
            writer.add(result.pairs.replace_schema_metadata(schema.metadata))
            summary.read += result.read
            summary.skipped += result.skipped
            for reject in result.rejects:
                summary.rejected[reject.reason.value] += 1
                rejects.write(reject.to_json() + "\n")
    writer.close()
    summary.written = writer.rows


def _check_reject_ratio(summary: PrepareSummary, max_reject_ratio: float) -> None:
    if summary.reject_ratio > max_reject_ratio:
        raise TooManyRejects(
            f"{summary.source}: {summary.rejected_total} of {summary.read} lines rejected "
            f"({summary.reject_ratio:.2%}), more than --max-reject-ratio {max_reject_ratio:.2%}; "
            f"see {summary.rejects}; {summary.output} not written",
            summary,
        )


def _convert(record, line: int, raw: str, source: str, trees: TreeSource) -> Pair | Skip | Reject:
    """One line's outcome: its pair, a skip, or the reject that says why."""
    problem = record if isinstance(record, RecordProblem) else None
    if problem is None:
        try:
            return pair_from_record(record, line, trees)
        except RecordProblem as raised:
            problem = raised
    return Reject(source, line, problem.reason, problem.field, str(problem), raw)
