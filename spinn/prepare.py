"""The prepare stage: an NLI corpus file -> `<split>.parquet` + `<split>.rejects.jsonl`.

Good lines become rows of the prepared-pairs schema (spinn.schema); bad lines go
to the rejects file with file, line, field and reason; gold label `-` is counted
and skipped. Both outputs are written atomically. The stage fails only when the
share of rejected lines passes `max_reject_ratio`, and then it publishes the
rejects (to inspect) but not the Parquet file (so no later stage trains on it).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.atomic import atomic_path
from spinn.corpus import Pair, RecordProblem, Reject, Skip, TreeSource, iter_records, open_corpus, pair_from_record
from spinn.errors import SpinnError
from spinn.schema import PAIR_FIELDS, pair_schema

DEFAULT_MAX_REJECT_RATIO = 0.01
ROW_GROUP_ROWS = 65_536
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


class _PairWriter:
    """Buffers pairs column-wise and writes a Parquet row group every ROW_GROUP_ROWS rows."""

    def __init__(self, path: Path, schema: pa.Schema):
        self._writer = pq.ParquetWriter(path, schema)
        self._schema = schema
        self._columns: dict[str, list] = {f.name: [] for f in PAIR_FIELDS}
        self.rows = 0

    def add(self, pair: Pair) -> None:
        for name, values in self._columns.items():
            values.append(getattr(pair, name))
        self.rows += 1
        if len(self._columns["pair_id"]) >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self._columns["pair_id"]:
            self._writer.write_table(pa.table(self._columns, schema=self._schema))
            self._columns = {name: [] for name in self._columns}

    def close(self) -> None:
        self.flush()
        self._writer.close()


class TooManyRejects(SpinnError):
    """More lines were rejected than `max_reject_ratio` allows; carries the summary to show."""

    def __init__(self, message: str, summary: PrepareSummary):
        super().__init__(message)
        self.summary = summary


def prepare(
    input_path: Path,
    output_dir: Path,
    *,
    split: str | None = None,
    trees: TreeSource = TreeSource.AUTO,
    member: str | None = None,
    max_reject_ratio: float = DEFAULT_MAX_REJECT_RATIO,
) -> PrepareSummary:
    """Convert one corpus file into prepared pairs; see the module docstring for the contract."""
    input_path, output_dir = Path(input_path), Path(output_dir)
    with open_corpus(input_path, member) as (stream, name):
        source = f"{input_path}:{name}" if name != input_path.name else str(input_path)
        split = split or infer_split(name)
        summary = PrepareSummary(source, split, output_dir / f"{split}.parquet", output_dir / f"{split}.rejects.jsonl")
        failure: TooManyRejects | None = None
        with atomic_path(summary.rejects) as rejects_tmp:
            try:
                with atomic_path(summary.output) as parquet_tmp:
                    _convert_all(stream, name, parquet_tmp, rejects_tmp, summary, trees)
                    _check_reject_ratio(summary, max_reject_ratio)
            except TooManyRejects as error:
                failure = error
    if failure is not None:
        raise failure
    return summary


def _convert_all(stream, name: str, parquet_path: Path, rejects_path: Path, summary: PrepareSummary,
                 trees: TreeSource) -> None:
    """Stream every line into the Parquet writer, the rejects file or the skip count."""
    writer = _PairWriter(parquet_path, pair_schema(source=summary.source, trees=trees.value))
    with open(rejects_path, "w", encoding="utf-8") as rejects:
        for line, raw, record in iter_records(stream, name):
            summary.read += 1
            outcome = _convert(record, line, raw, summary.source, trees)
            if isinstance(outcome, Pair):
                writer.add(outcome)
            elif isinstance(outcome, Skip):
                summary.skipped += 1
            else:
                summary.rejected[outcome.reason.value] += 1
                rejects.write(outcome.to_json() + "\n")
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
