"""The parse stage: sentence pairs without parses -> the same prepared Parquet as `spinn prepare`.

Trees come from Stanza (spinn.parsing.parser) and go through the project's head-driven
binarizer, so a model trained on SNLI's binary parses meets the same kind of
tree here. Pairs are processed in chunks: each chunk's distinct sentences are
parsed once (premises repeat a lot in NLI corpora) and the disk cache makes a
rerun, or an overlapping corpus, parse nothing twice.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

import pyarrow as pa
from pydantic import Field

from spinn.data.column_sidecar import over_sidecar
from spinn.data.label_schemes import AUTO, three_way_label
from spinn.data.prepare import PairWriter, PrepareSummary, infer_split
from spinn.data.rejects import Reject, RejectReason
from spinn.data.schema import GOLD_COLUMN, gold_scheme, pair_schema
from spinn.data.sentence_pairs import Columns, Format, InputPair, read_input_pairs
from spinn.data.split_files import prepared_files, with_partner
from spinn.ground.errors import SpinnWarning
from spinn.ground.io import atomic_paths, publishing
from spinn.ground.settings import Settings
from spinn.parsing.parser import SentenceParser
from spinn.parsing.parser_settings import ParserSettings
from spinn.parsing.protocol import BatchClock, Parsed, Parser, Progress, Unparsed, told
from spinn.parsing.workers import start_tokenizers, tokenize_in_worker
from spinn.trees.tokenize import tokenize

TREES_STANZA, TREES_NONE = "stanza", "none"
CHUNK_PAIRS = 10_000
"""Pairs whose sentences are parsed together: large enough for good Stanza batches and deduplication."""
SENTENCES = ("premise", "hypothesis")
TOKENIZE_BATCH = 2_048
"""Distinct texts per tokenizer worker task: a few hundredths of a second of work, enough to spread a shard
over the workers while each task's overhead stays small."""


@dataclass(frozen=True)
class Tokenized:
    """TokenOnly's finished `submit`: a `PendingParse` that is ready at once."""

    results: dict[str, Parsed | Unparsed]
    seconds: float
    to_parse: int

    def result(self) -> dict[str, Parsed | Unparsed]:
        return self.results

    def seconds_after(self, moment: float) -> float:
        return self.seconds

    @property
    def finished_at(self) -> float:
        return 0.0


class TokenOnly:
    """The `Parser` without a parser: SNLI's tokens (spinn.trees.tokenize) and no tree.

    For models that build their own trees (rl, or spinn on predicted
    transitions): pairs are stored with empty transition lists. With `workers`
    above 1 the text is tokenized in that many worker processes
    (spinn.parsing.workers) and `submit` returns at once, so a label run's next
    shard is tokenized while the model labels this one.
    """

    model_id = TREES_NONE

    def __init__(self, max_tokens: int, workers: int = 1) -> None:
        self.max_tokens, self._workers = max_tokens, workers
        self._pool: ProcessPoolExecutor | None = None

    @property
    def workers(self) -> int:
        """Tokenizer processes (1: tokenizes in this process)."""
        return self._workers

    def parse(self, sentences: Iterable[str]) -> dict[str, Parsed | Unparsed]:
        """Each distinct text tokenized once (NLI corpora repeat their premises, as SentenceParser knows)."""
        return self.submit(sentences).result()

    def submit(self, sentences: Iterable[str], progress: Progress | None = None) -> Tokenized | Tokenizing:
        """SentenceParser.submit's twin: in this process the result is ready at once; with workers it is on
        its way."""
        texts = list(dict.fromkeys(sentences))
        if self._workers > 1:
            return Tokenizing(self, texts, progress)
        started = time.perf_counter()
        results = {text: self.outcome(tokenize(text)) for text in texts}
        if progress is not None:
            progress(len(results))
        return Tokenized(results, time.perf_counter() - started, len(results))

    def outcome(self, tokens: list[str]) -> Parsed | Unparsed:
        """A text's tokens as the parser's answer: rejected when there are none, or more than the limit."""
        if not tokens:
            return Unparsed(RejectReason.EMPTY_SENTENCE, "no tokens")
        if len(tokens) > self.max_tokens:
            return Unparsed(RejectReason.TOO_LONG, f"{len(tokens)} tokens, more than the limit of {self.max_tokens}")
        return Parsed(tokens, [], "")

    def pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = start_tokenizers(self._workers)
        return self._pool

    def close(self) -> None:
        """Stop the tokenizer workers, if any started."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class Tokenizing(BatchClock):
    """TokenOnly's `submit` with workers: a `PendingParse` whose batches are tokenized in worker processes."""

    def __init__(self, tokens: TokenOnly, texts: list[str], progress: Progress | None) -> None:
        super().__init__()
        self._tokens = tokens
        self._batches = [texts[start : start + TOKENIZE_BATCH] for start in range(0, len(texts), TOKENIZE_BATCH)]
        self._futures = [tokens.pool().submit(tokenize_in_worker, batch) for batch in self._batches]
        for batch, future in zip(self._batches, self._futures, strict=True):
            future.add_done_callback(self._done)
            if progress is not None:
                future.add_done_callback(told(progress, len(batch)))
        self.to_parse = len(texts)

    def result(self) -> dict[str, Parsed | Unparsed]:
        """One result per distinct text, in input order (waits for the batches still in the workers)."""
        outcome, results = self._tokens.outcome, {}
        for batch, future in zip(self._batches, self._futures, strict=True):
            results.update(zip(batch, map(outcome, future.result()), strict=True))
        return results


class ParseSettings(Settings):
    """How raw sentence pairs are read and parsed."""

    trees: Literal["stanza", "none"] = TREES_STANZA
    """none: tokens only, no parser, for models that build their own trees (rl)."""
    input_format: Format | None = Field(None, json_schema_extra={"cli": "--format"})
    """Input format (default: from the file name)."""
    columns: Columns = Columns()
    """Which columns hold the pair."""
    parsing: ParserSettings = ParserSettings()
    """How Stanza runs."""


def parse_pairs(
    input_path: Path,
    output_dir: Path,
    settings: ParseSettings | None = None,
    *,
    split: str | None = None,
    parser: Parser | None = None,
) -> PrepareSummary:
    """Parse, binarize and write `<split>.parquet` and `<split>.rejects.jsonl` under output_dir.

    trees="none" stores tokens only (no Stanza): data for models that build their own trees. Each pair's gold
    value is kept in its own scheme (the `gold` column, the scheme in the file's metadata: what `spinn
    evaluate` scores); its `label`, for training, only where that value is one of the model's classes."""
    settings = settings or ParseSettings()
    trees, columns, input_format = settings.trees, settings.columns, settings.input_format
    input_path, output_dir = Path(input_path), Path(output_dir)
    split = split or infer_split(input_path.name)
    summary = PrepareSummary(str(input_path), split, *prepared_files(output_dir, split))
    outputs = (summary.output, summary.rejects)
    max_tokens = settings.parsing.max_tokens
    pairs = read_input_pairs(input_path, columns, input_format, max_tokens=max_tokens)  # whole-file problems: now
    scheme = over_sidecar(input_path, columns).label_scheme or AUTO  # the sidecar's, unless one was named
    not_three_way: Counter[str] = Counter()
    with publishing(outputs, inputs=with_partner(input_path), names=(split,)):
        own_parser = parser is None
        parser = parser or _own_parser(trees, settings.parsing)
        try:
            _write(_counting_not_three_way(pairs, scheme, not_three_way), parser, summary, trees, scheme)
        finally:
            if own_parser:
                parser.close()
    if not_three_way:
        values = ", ".join(f"{value!r} {rows}" for value, rows in not_three_way.most_common(10))
        message = (
            f"{input_path}: {sum(not_three_way.values())} rows have gold labels that are not the model's three "
            f"classes ({values}): written with their gold value but no training label (a prepared split trains "
            "on the model's classes); `spinn evaluate` scores them in their own scheme"
        )
        warnings.warn(SpinnWarning(message), stacklevel=2)
    return summary


def _counting_not_three_way(
    pairs: Iterator[InputPair | Reject], scheme: str, not_three_way: Counter[str]
) -> Iterator[InputPair | Reject]:
    """The pairs as they come, counting the gold values that are none of the model's classes (`_row` writes
    them without a training label): a gold label never keeps a pair out."""
    for pair in pairs:
        if isinstance(pair, InputPair) and pair.label is not None and three_way_label(pair.label, scheme) is None:
            not_three_way[pair.label] += 1
        yield pair


def _own_parser(trees: str, parsing: ParserSettings) -> Parser:
    """The parser a call without one gets: Stanza, or tokens only for trees="none"."""
    return TokenOnly(parsing.max_tokens) if trees == TREES_NONE else SentenceParser(parsing)


def _write(
    pairs: Iterator[InputPair | Reject], parser: Parser, summary: PrepareSummary, trees: str, scheme: str
) -> None:
    """Parse the pairs chunk by chunk into the split's two files, published together; `scheme`: the gold
    values', as named (auto: found from the values where they are scored)."""
    with (
        atomic_paths(summary.output, summary.rejects) as (parquet_tmp, rejects_tmp),
        rejects_tmp.open("w", encoding="utf-8") as rejects,
    ):
        source = summary.source
        tree_source = TREES_NONE if trees == TREES_NONE else f"stanza:{parser.model_id}"
        schema = pair_schema(source=source, trees=tree_source, label_scheme=scheme)
        writer = PairWriter(parquet_tmp, schema)
        for chunk in _chunks(pairs):
            writer.add(_parse_chunk(chunk, parser, schema, summary, rejects))
        writer.close()


def _chunks(items: Iterator[InputPair | Reject]) -> Iterator[list[InputPair | Reject]]:
    while chunk := list(islice(items, CHUNK_PAIRS)):
        yield chunk


def _parse_chunk(
    chunk: list[InputPair | Reject], parser: Parser, schema: pa.Schema, summary: PrepareSummary, rejects
) -> pa.Table:
    """Parse the chunk's distinct sentences; return its good pairs as a table of `schema`, log the rest as
    rejects."""
    pairs = [item for item in chunk if isinstance(item, InputPair)]
    parsed = parser.parse(text for pair in pairs for text in (pair.premise, pair.hypothesis))
    rows, scheme = [], gold_scheme(schema)
    summary.read += len(chunk)
    for item in chunk:
        problem = item if isinstance(item, Reject) else _first_problem(item, parsed, summary.source)
        if problem is not None:
            summary.rejected[problem.reason.value] += 1
            rejects.write(problem.to_json() + "\n")
            continue
        rows.append(_row(item, parsed[item.premise], parsed[item.hypothesis], scheme))
    summary.written += len(rows)
    return pa.Table.from_pylist(rows, schema=schema)


def _first_problem(pair: InputPair, parsed: dict[str, Parsed | Unparsed], source: str) -> Reject | None:
    for name in SENTENCES:
        result = parsed[getattr(pair, name)]
        if isinstance(result, Unparsed):
            raw = json.dumps(
                {"pair_id": pair.pair_id, "premise": pair.premise, "hypothesis": pair.hypothesis, "label": pair.label},
                ensure_ascii=False,
            )
            return Reject(source, pair.line, result.reason, name, result.message, raw, pair.pair_id)
    return None


def _row(pair: InputPair, premise: Parsed, hypothesis: Parsed, scheme: str | None) -> dict:
    """The pair's row: its gold value as given, and as `label` the model's class that value is, if any."""
    return {
        "pair_id": pair.pair_id,
        "label": three_way_label(pair.label, scheme),
        GOLD_COLUMN: pair.label,
        "premise": pair.premise,
        "hypothesis": pair.hypothesis,
        "premise_tokens": premise.tokens,
        "hypothesis_tokens": hypothesis.tokens,
        "premise_transitions": premise.transitions,
        "hypothesis_transitions": hypothesis.transitions,
        "source_line": pair.line,
    }
