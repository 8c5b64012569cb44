"""The label stage: a new sentence-pair corpus + a trained model -> predictions Parquet, in resumable shards.

Large inputs are cut once into shards of `shard_size` rows (`plan_shards`),
each shard is labelled on its own (`label_shard`: parse or tokenize, then the
model) and written atomically, and the shards are merged at the end
(`merge_shards`). A killed job rerun with the same arguments reuses the plan
and every finished shard, so the output has exactly one row per input row:
labelled rows in the Parquet file, rejected rows (with the reason) in the
rejects file, never both, never twice. The plan records a fingerprint of the
arguments (the input's and the checkpoint's digests, the parser model,
columns, shard size): a rerun that would mix results of another model or
input is refused instead.

One run at a time works on an output: the run holds a lock file in the parts
folder (`hold_output`), and a second run is refused at once, naming the
first. The merge checks that every input row is in its shard exactly once,
labelled or rejected, before it publishes anything.

Shards are independent, so the Prefect flow runs them as tasks on a Dask
cluster; every worker reads its shard from the parts folder beside the
output (a shared filesystem when the cluster spans machines).

Throughput: the parser is most of the time. Each distinct sentence is parsed
once per run (the parse cache, or the parser's own temporary one), Stanza and
the model run with few torch threads (`threads`, the parser's `threads`:
threads that wait on each other on shared cores cost several times the work),
and with parser `workers` the model labels shard k while the workers parse
shard k+1.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from pydantic import Field

from spinn.data.example import Example
from spinn.data.rejects import Reject
from spinn.data.schema import LABELS
from spinn.data.sentence_pairs import Columns, Format, InputPair, read_input_pairs
from spinn.data.vocab import unknown_count, warn_if_mostly_unknown
from spinn.errors import SpinnError
from spinn.io import LOCK_NAME, atomic_path, atomic_paths, file_digest, lock_folder, tidy_folder
from spinn.labeling.progress import LabelProgress, ShardShare
from spinn.model.batch import WIDTH_STEP, bucket_batches, make_batch, own_steps
from spinn.model.loading import LoadedModel, load_model, resolve_device
from spinn.parsing import protocol
from spinn.parsing.cpu import torch_threads
from spinn.parsing.parse import SENTENCES, TokenOnly
from spinn.parsing.parser import SentenceParser
from spinn.parsing.protocol import Parsed, PendingParse, Unparsed
from spinn.parsing.settings import ParserSettings
from spinn.settings import Device, Settings
from spinn.training.step import InferStep
from spinn.trees.transitions import right_branching, transitions_to_tree
from spinn.trees.tree import format_binary

DEFAULT_SHARD_SIZE = 10_000
DEFAULT_BATCH_SIZE = 256
PARTS_SUFFIX = ".parts"
PLAN_NAME = "plan.json"
PLAN_VERSION = 1
PARSER_STANZA = "stanza"
PARSER_MODEL = "model"
PARSER_AUTO = "auto"
Parser = Literal["auto", "stanza", "model"]
PROBABILITY_COLUMNS = tuple(f"p_{label}" for label in LABELS)
TOKENS_KEY, UNKNOWN_TOKENS_KEY = "spinn.tokens", "spinn.unknown_tokens"
"""A labels shard's metadata: its tokens and those outside the vocabulary, so a reused shard still counts."""

INPUT_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int64(), nullable=False),
        pa.field("line", pa.int64(), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("premise", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
        pa.field("gold_label", pa.string(), nullable=True),
    ]
)
OUTPUT_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("row", pa.int64(), nullable=False),
        pa.field("premise", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
        pa.field("label", pa.string(), nullable=False),
        *(pa.field(name, pa.float32(), nullable=False) for name in PROBABILITY_COLUMNS),
        pa.field("premise_tree", pa.string(), nullable=False),
        pa.field("hypothesis_tree", pa.string(), nullable=False),
        pa.field("gold_label", pa.string(), nullable=True),
        pa.field("model", pa.string(), nullable=False),
        pa.field("parser", pa.string(), nullable=False),
    ]
)


class LabelSettings(Settings):
    """How to read, parse and batch; everything that changes the output is in the plan's fingerprint."""

    parser: Parser = PARSER_AUTO
    """stanza: parse first; model: a spinn or rl model builds its own trees from tokens; auto: model for rl
    (it learned its own trees), else stanza (the models were trained on parses)."""
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1)
    """Pairs per model batch (the labels do not depend on it)."""
    shard_size: int = Field(DEFAULT_SHARD_SIZE, ge=1)
    """Rows per shard: the unit of resuming and of parallel work."""
    device: Device = "auto"
    """Where the model runs; auto: the GPU when there is one."""
    threads: int = Field(1, ge=1)
    """torch threads for the model on CPU (more pay only on idle cores; the labels do not depend on it)."""
    columns: Columns = Columns()
    """Which columns hold the pair."""
    input_format: Format | None = Field(None, json_schema_extra={"cli": "--format"})
    """Input format (default: from the file name)."""
    parsing: ParserSettings = ParserSettings()
    """How Stanza runs."""


@dataclass(frozen=True)
class ShardPlan:
    """The input cut into shards, and where each shard's input and results live."""

    input: str
    output: str
    parts: str
    shards: int
    rows: int
    fingerprint: dict

    def input_pairs(self, index: int) -> Path:
        return shard_file(self.parts, "input", index, ".parquet")

    def input_rejects(self, index: int) -> Path:
        return shard_file(self.parts, "input", index, ".rejects.jsonl")

    def labels(self, index: int) -> Path:
        return shard_file(self.parts, "labels", index, ".parquet")

    def label_rejects(self, index: int) -> Path:
        return shard_file(self.parts, "labels", index, ".rejects.jsonl")


def shard_file(parts: str | Path, kind: str, index: int, suffix: str) -> Path:
    """`input-00003.parquet`, `labels-00003.rejects.jsonl`, ... inside the parts folder."""
    return Path(parts) / f"{kind}-{index:05d}{suffix}"


@dataclass
class ShardResult:
    index: int
    labelled: int = 0
    rejected: int = 0
    reused: bool = False
    parse_seconds: float = 0.0
    model_seconds: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    unknown_tokens: int = 0
    """Tokens of the labelled pairs, and those the model's vocabulary lacks (kept in the shard's metadata)."""


@dataclass
class LabelSummary:
    """What the stage did, for the CLI, the flow's artifacts and MLflow."""

    output: Path
    rejects: Path
    model: str
    parser: str
    rows: int
    labelled: int
    rejected: int
    shards: int
    shards_reused: int
    reasons: dict[str, int]
    parse_seconds: float
    model_seconds: float
    tokens: int = 0
    unknown_tokens: int = 0
    seconds: float = 0.0
    """The whole run, wall clock: loading the model and the parser included."""
    parser_workers: int = 1
    """Parser processes the run used (the parser settings' workers, auto decided)."""

    @property
    def pairs_per_second(self) -> float | None:
        """Rows done per second of the whole run, end to end (reused shards count as done)."""
        return self.rows / self.seconds if self.seconds else None

    @property
    def oov_share(self) -> float | None:
        """The share of the labelled pairs' tokens outside the model's vocabulary (None: no tokens)."""
        return self.unknown_tokens / self.tokens if self.tokens else None

    @property
    def parse_pairs_per_second(self) -> float | None:
        return self.labelled / self.parse_seconds if self.parse_seconds else None

    @property
    def model_pairs_per_second(self) -> float | None:
        return self.labelled / self.model_seconds if self.model_seconds else None

    def report(self) -> list[str]:
        lines = [
            (
                f"{self.rows} rows -> {self.output}: {self.labelled} labelled, {self.rejected} rejected "
                f"({self.shards} shards, {self.shards_reused} reused from an earlier run)"
            )
        ]
        lines += [f"  rejected {reason}: {count}" for reason, count in sorted(self.reasons.items())]
        if self.rejected:
            lines.append(f"rejects listed in {self.rejects}")
        speeds = [
            f"{name} {rate:.0f} pairs/s"
            for name, rate in (
                ("parse" if self.parser == PARSER_STANZA else "tokenize", self.parse_pairs_per_second),
                ("model", self.model_pairs_per_second),
                ("end to end", self.pairs_per_second),
            )
            if rate
        ]
        if speeds:
            lines.append(f"throughput (work done in this run): {', '.join(speeds)}")
        if self.oov_share is not None:
            lines.append(f"out of the model's vocabulary: {self.oov_share:.1%} of tokens")
        workers = f" ({self.parser_workers} workers)" if self.parser_workers > 1 else ""
        lines.append(f"model {self.model}, parser {self.parser}{workers}")
        return lines


# ----------------------------------------------------------------------------- the model and the parser


class Labeller:
    """A loaded model and its parser: built once per process and shared by the shards it labels."""

    def __init__(self, model_reference: str | Path, settings: LabelSettings) -> None:
        from spinn.tracking import store as tracking

        self.settings = settings
        self.is_registered = tracking.is_model_uri(str(model_reference))
        # An alias is resolved once, first: the version loaded is the version every output row names.
        reference = str(model_reference)
        self.reference = tracking.resolve_model_uri(reference) if self.is_registered else reference
        self.loaded: LoadedModel = load_model(self.reference, resolve_device(settings.device))
        self.parser_name = resolve_parser(settings.parser, self.loaded)
        self.infer = InferStep(self.loaded.model, predict_transitions=self.parser_name == PARSER_MODEL)
        self.parser: protocol.Parser = (
            SentenceParser(settings.parsing)
            if self.parser_name == PARSER_STANZA
            else TokenOnly(settings.parsing.max_tokens)
        )

    @cached_property
    def checkpoint_sha256(self) -> str:
        return file_digest(self.loaded.checkpoint, "sha256")

    @cached_property
    def model_name(self) -> str:
        """`models:/spinn/3` for a registry URI (the alias resolved), else the checkpoint and its digest."""
        return self.reference if self.is_registered else f"{self.reference} (sha256 {self.checkpoint_sha256[:12]})"

    def fingerprint(self) -> dict:
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "parser": self.parser_name,
            "parser_model": self.parser.model_id,
            "max_tokens": self.settings.parsing.max_tokens,
        }

    def close(self) -> None:
        self.parser.close()


def resolve_parser(parser: str, loaded: LoadedModel) -> str:
    """`auto`: an rl model builds its own trees (it learned them); the others were trained on parses."""
    config = loaded.model.config
    if parser == PARSER_MODEL and not config.predicts_transitions:
        raise SpinnError(
            f"parser model needs a model that predicts its own transitions (spinn, rl); this one is {config.variant}"
        )
    if parser == PARSER_AUTO:
        return PARSER_MODEL if config.samples_transitions else PARSER_STANZA
    return parser


# ----------------------------------------------------------------------------- plan


def parts_folder(output: Path) -> Path:
    return Path(output).with_name(Path(output).name + PARTS_SUFFIX)


def plan_shards(input_path: Path, output: Path, settings: LabelSettings, labeller_fingerprint: dict) -> ShardPlan:
    """Cut the input into shard files once; a rerun with the same arguments reuses them."""
    input_path, output = Path(input_path), Path(output)
    if not input_path.is_file():
        raise SpinnError(f"{input_path}: no such input file")
    parts = parts_folder(output)
    fingerprint = {
        "version": PLAN_VERSION,
        "input": str(input_path.resolve()),
        "input_sha256": file_digest(input_path, "sha256"),
        "columns": settings.columns.model_dump(),
        "format": settings.input_format,
        "shard_size": settings.shard_size,
        **labeller_fingerprint,
    }
    existing = _read_plan(parts)
    if existing is not None:
        _check_same_arguments(existing, fingerprint, parts)
        return existing
    parts.mkdir(parents=True, exist_ok=True)
    shards, rows = _write_input_shards(input_path, parts, settings)
    plan = ShardPlan(str(input_path), str(output), str(parts), shards, rows, fingerprint)
    with atomic_path(parts / PLAN_NAME) as temporary:
        temporary.write_text(json.dumps(asdict(plan), indent=2), encoding="utf-8")
    return plan


def _read_plan(parts: Path) -> ShardPlan | None:
    path = parts / PLAN_NAME
    if not path.is_file():
        return None
    try:
        return ShardPlan(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as error:
        raise SpinnError(f"{path}: not a label plan ({error}); delete {parts} to start over") from None


def _check_same_arguments(plan: ShardPlan, fingerprint: dict, parts: Path) -> None:
    changed = sorted(
        key for key in fingerprint.keys() | plan.fingerprint.keys() if fingerprint.get(key) != plan.fingerprint.get(key)
    )
    if changed:
        raise SpinnError(
            f"{parts}: holds shards of another run (different {', '.join(changed)}); "
            "rerun with the same arguments to resume, or delete the folder or choose another output"
        )


def _write_input_shards(input_path: Path, parts: Path, settings: LabelSettings) -> tuple[int, int]:
    """Stream the input once, writing each shard's pairs and reading rejects; returns (shards, rows)."""
    pairs: list[InputPair] = []
    rejects: list[dict] = []
    shard = rows = 0
    for rows, item in enumerate(read_input_pairs(input_path, settings.columns, settings.input_format), start=1):
        if isinstance(item, InputPair):
            pairs.append(item)
        else:
            rejects.append({**item.to_dict(), "row": rows})
        if rows % settings.shard_size == 0:
            _write_input_shard(parts, shard, pairs, rejects)
            shard, pairs, rejects = shard + 1, [], []
    if pairs or rejects or shard == 0:
        _write_input_shard(parts, shard, pairs, rejects)
        shard += 1
    return shard, rows


def _write_input_shard(parts: Path, index: int, pairs: list[InputPair], rejects: list[dict]) -> None:
    table = pa.Table.from_pylist(
        [
            {
                "row": p.row,
                "line": p.line,
                "pair_id": p.pair_id,
                "premise": p.premise,
                "hypothesis": p.hypothesis,
                "gold_label": p.label,
            }
            for p in pairs
        ],
        schema=INPUT_SCHEMA,
    )
    _write_jsonl(shard_file(parts, "input", index, ".rejects.jsonl"), rejects)
    with atomic_path(shard_file(parts, "input", index, ".parquet")) as temporary:
        pq.write_table(table, temporary)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(_jsonl(records), encoding="utf-8")


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


# ----------------------------------------------------------------------------- one shard


@dataclass
class ShardParse:
    """A shard's pairs and the parse of their sentences, started (`start_parse`) and maybe still running."""

    pairs: list[dict]
    pending: PendingParse
    share: ShardShare


def start_parse(plan: ShardPlan, index: int, labeller: Labeller, progress: LabelProgress | None = None) -> ShardParse:
    """Read the shard and hand its sentences to the parser; with parser workers this returns while they parse."""
    pairs = pq.read_table(plan.input_pairs(index)).to_pylist()
    share = ShardShare(progress, len(pairs))
    pending = labeller.parser.submit((pair[name] for pair in pairs for name in SENTENCES), share)
    share.known(pending.to_parse)
    return ShardParse(pairs, pending, share)


def label_shard(
    plan: ShardPlan,
    index: int,
    labeller: Labeller,
    parse: ShardParse | None = None,
    progress: LabelProgress | None = None,
) -> ShardResult:
    """Label one shard unless a finished result is already there (its Parquet file is written last).

    `parse`: the shard's parse, if it was started earlier (see `label_shards`)."""
    if plan.labels(index).is_file():
        result = _reused(plan, index)
        if progress is not None:
            progress.skipped(len(shard_rows(plan, index)))
        return result
    parse = parse or start_parse(plan, index, labeller, progress)
    result = ShardResult(index)
    trees, rejects = _sentence_trees(parse, plan.input, result)
    if progress is not None:
        progress.skipped(len(_lines(plan.input_rejects(index))))
        progress.labelled(len(rejects))  # rejected by the parser: parsed, and never reach the model
    kept = [pair for pair in parse.pairs if pair["row"] in trees]
    rows = _predict(kept, trees, labeller, result, progress)
    result.labelled, result.rejected = len(rows), len(rejects)
    result.reasons = dict(Counter(reject["reason"] for reject in rejects))
    _write_jsonl(plan.label_rejects(index), rejects)
    counts = {TOKENS_KEY: str(result.tokens), UNKNOWN_TOKENS_KEY: str(result.unknown_tokens)}
    with atomic_path(plan.labels(index)) as temporary:
        pq.write_table(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA.with_metadata(counts)), temporary)
    return result


def _reused(plan: ShardPlan, index: int) -> ShardResult:
    reasons = Counter(json.loads(line)["reason"] for line in _lines(plan.label_rejects(index)))
    labelled = pq.read_metadata(plan.labels(index)).num_rows
    counts = pq.read_schema(plan.labels(index)).metadata or {}
    tokens, unknown = (int(counts.get(key.encode(), 0)) for key in (TOKENS_KEY, UNKNOWN_TOKENS_KEY))
    return ShardResult(
        index, labelled, sum(reasons.values()), True, reasons=dict(reasons), tokens=tokens, unknown_tokens=unknown
    )


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line] if path.is_file() else []


@dataclass(frozen=True)
class _Sentence:
    tokens: list[str]
    transitions: list[int] | None  # None: the model predicts them
    tree: str | None


def _sentence_trees(
    parse: ShardParse, source: str, result: ShardResult
) -> tuple[dict[int, tuple[_Sentence, _Sentence]], list[dict]]:
    """Row -> (premise, hypothesis) ready for the model, and a reject for every row that is not."""
    analysed = parse.pending.result()
    parse.share.finish()
    result.parse_seconds = parse.pending.seconds
    trees, rejects = {}, []
    for pair in parse.pairs:
        sentences = [analysed[pair[name]] for name in SENTENCES]
        failed = next(
            ((name, s) for name, s in zip(SENTENCES, sentences, strict=True) if isinstance(s, Unparsed)), None
        )
        if failed is None:
            trees[pair["row"]] = tuple(_as_sentence(s) for s in sentences)
        else:
            name, problem = failed
            raw = json.dumps(pair, ensure_ascii=False)
            reject = Reject(source, pair["line"], problem.reason, name, problem.message, raw)
            rejects.append({**reject.to_dict(), "row": pair["row"]})
    return trees, rejects


def _as_sentence(analysed: Parsed) -> _Sentence:
    """Tokens only (no transitions) means the model builds the tree."""
    if not analysed.transitions:
        return _Sentence(list(analysed.tokens), None, None)
    return _Sentence(list(analysed.tokens), list(analysed.transitions), analysed.binary_parse)


def _transitions(sentence: _Sentence) -> tuple[int, ...]:
    """The parser's transitions; for a sentence whose tree the model builds, a right-branching stand-in:
    the batch format needs a legal sequence of 2n - 1 steps, but a model predicting its own never reads it."""
    return tuple(sentence.transitions or right_branching(len(sentence.tokens)))


def _predict(
    pairs: list[dict], trees: dict, labeller: Labeller, result: ShardResult, progress: LabelProgress | None
) -> list[dict]:
    """Run the model over the shard in length-sorted batches; the order of rows does not change any number."""
    if not pairs:
        return []
    vocabulary, model = labeller.loaded.vocabulary, labeller.loaded.model
    predict = labeller.parser_name == PARSER_MODEL
    examples = []
    for pair in pairs:
        premise, hypothesis = trees[pair["row"]]
        examples.append(
            Example(
                tuple(vocabulary.encode(premise.tokens)),
                _transitions(premise),
                tuple(vocabulary.encode(hypothesis.tokens)),
                _transitions(hypothesis),
            )
        )
    result.tokens, result.unknown_tokens = unknown_count(ids for e in examples for ids in (e.premise, e.hypothesis))
    device = next(model.parameters()).device
    probabilities = torch.zeros(len(pairs), len(LABELS))
    ran: list[tuple[int, ...] | None] = [None] * (2 * len(pairs))
    start = time.perf_counter()
    outputs = []  # kept on the device until the shard is done: one read back, not one per batch
    with torch_threads(labeller.settings.threads):
        for indices in bucket_batches(examples, labeller.settings.batch_size, shuffle=False):
            batch = make_batch([examples[i] for i in indices], width_step=WIDTH_STEP).to(device, non_blocking=True)
            output = labeller.infer(batch)
            probabilities_on_device = torch.softmax(output.logits.float(), dim=1)
            outputs.append((indices, probabilities_on_device, output.transitions if predict else None))
            if progress is not None:
                progress.labelled(len(indices))
    for indices, batch_probabilities, transitions in outputs:
        probabilities[indices] = batch_probabilities.cpu()  # (b, 3)
        if transitions is not None:
            _keep_transitions(transitions.cpu(), indices, len(pairs), examples, ran)
    result.model_seconds = time.perf_counter() - start
    return [
        _output_row(pair, trees[pair["row"]], probabilities[i], ran[i], ran[len(pairs) + i], labeller)
        for i, pair in enumerate(pairs)
    ]


def _keep_transitions(
    transitions: torch.Tensor, indices: list[int], pairs: int, examples: list[Example], ran: list
) -> None:
    """Take each sentence's own 2n-1 steps from the (2b, T) transitions that ran (own steps first)."""
    b = len(indices)
    for position, index in enumerate(indices):
        for offset, sentence in ((0, examples[index].premise), (pairs, examples[index].hypothesis)):
            row = position if offset == 0 else b + position
            ran[offset + index] = tuple(own_steps(transitions, row, len(sentence)))


def _output_row(
    pair: dict, sentences: tuple, probabilities: torch.Tensor, premise_ran, hypothesis_ran, labeller: Labeller
) -> dict:
    trees = [
        sentence.tree or format_binary(transitions_to_tree(sentence.tokens, ran))
        for sentence, ran in zip(sentences, (premise_ran, hypothesis_ran), strict=True)
    ]
    row = {
        "pair_id": pair["pair_id"],
        "row": pair["row"],
        "premise": pair["premise"],
        "hypothesis": pair["hypothesis"],
        "label": LABELS[int(probabilities.argmax())],
        "premise_tree": trees[0],
        "hypothesis_tree": trees[1],
        "gold_label": pair["gold_label"],
        "model": labeller.model_name,
        "parser": labeller.parser_name,
    }
    row.update({name: float(value) for name, value in zip(PROBABILITY_COLUMNS, probabilities.tolist(), strict=True)})
    return row


# ----------------------------------------------------------------------------- merge and the whole stage


def merge_shards(plan: ShardPlan, results: list[ShardResult], model: str, parser: str) -> LabelSummary:
    """Concatenate finished shards in row order into the output and its rejects file, published together,
    checking each shard holds each of its rows exactly once and was labelled by `model`."""
    missing = [index for index in range(plan.shards) if not plan.labels(index).is_file()]
    if missing:
        raise SpinnError(f"{plan.parts}: shards {missing[:10]} are not finished; rerun to complete them")
    output = Path(plan.output)
    rejects_path = rejects_file(output)
    rejects = []
    with atomic_paths(output, rejects_path) as (temporary, rejects_temporary):
        writer = pq.ParquetWriter(temporary, OUTPUT_SCHEMA)
        try:
            for index in range(plan.shards):
                table = pq.read_table(plan.labels(index), schema=OUTPUT_SCHEMA)
                shard_rejects = _lines(plan.input_rejects(index)) + _lines(plan.label_rejects(index))
                shard_rejects = [json.loads(line) for line in shard_rejects]
                _check_shard(plan, index, table, shard_rejects, model)
                writer.write_table(table)
                rejects += shard_rejects
        finally:
            writer.close()
        rejects_temporary.write_text(_jsonl(sorted(rejects, key=lambda reject: reject["row"])), encoding="utf-8")
    reasons = Counter(reject["reason"] for reject in rejects)
    summary = LabelSummary(
        output,
        rejects_path,
        model,
        parser,
        plan.rows,
        sum(r.labelled for r in results),
        len(rejects),
        plan.shards,
        sum(r.reused for r in results),
        dict(reasons),
        sum(r.parse_seconds for r in results),
        sum(r.model_seconds for r in results),
        sum(r.tokens for r in results),
        sum(r.unknown_tokens for r in results),
    )
    warn_if_mostly_unknown(plan.input, summary.oov_share)
    return summary


def shard_rows(plan: ShardPlan, index: int) -> range:
    """The input rows shard `index` covers (1-based, as the readers number them)."""
    size = plan.fingerprint["shard_size"]
    return range(index * size + 1, min((index + 1) * size, plan.rows) + 1)


def _check_shard(plan: ShardPlan, index: int, labelled: pa.Table, rejects: list[dict], model: str) -> None:
    """Every row of the shard once, labelled or rejected, labelled rows in input order, all by `model`.

    Shards that another run wrote into the same folder (before runs took the
    folder's lock) or that a person edited fail here, not in the output."""
    expected = shard_rows(plan, index)
    labelled_rows = labelled.column("row").to_pylist()
    counts = Counter(labelled_rows + [reject["row"] for reject in rejects])
    problems = [
        f"{count} row{'' if count == 1 else 's'} {what}"
        for count, what in (
            (sum(1 for seen in counts.values() if seen > 1), "twice"),
            (sum(1 for row in expected if row not in counts), "missing"),
            (sum(1 for row in counts if row not in expected), "outside the shard"),
        )
        if count
    ]
    if labelled_rows != sorted(labelled_rows):
        problems.append("its labelled rows out of order")
    models = set(labelled.column("model").unique().to_pylist()) - {model}
    if models:
        problems.append(f"rows labelled by {', '.join(sorted(models))}, not {model}")
    if problems:
        raise SpinnError(
            f"{plan.labels(index)}: shard {index} (rows {expected.start}-{expected.stop - 1}) has "
            f"{', '.join(problems)}; delete {plan.parts} and rerun"
        )


def rejects_file(output: Path) -> Path:
    """`labels.parquet` -> `labels.rejects.jsonl`."""
    return Path(output).with_name(Path(output).name.removesuffix(".parquet") + ".rejects.jsonl")


def label(
    input_path: Path,
    model_reference: str | Path,
    output: Path,
    settings: LabelSettings | None = None,
    *,
    progress: bool = False,
) -> LabelSummary:
    """Label every row of `input_path` with the model; resumable (see the module docstring).

    progress: bars on stderr with pairs/s for the parse and model phases."""
    started = time.perf_counter()
    settings = settings or LabelSettings()
    check_output(output, _files_read(input_path, model_reference, settings))
    with hold_output(output):
        labeller = Labeller(model_reference, settings)
        try:
            plan = plan_shards(input_path, output, settings, labeller.fingerprint())
            bars = LabelProgress(plan.rows) if progress else None
            try:
                results = label_shards(plan, labeller, bars)
            finally:
                if bars is not None:
                    bars.close()
            summary = merge_shards(plan, results, labeller.model_name, labeller.parser_name)
            summary.parser_workers = labeller.parser.workers
        finally:
            labeller.close()
    summary.seconds = time.perf_counter() - started
    return summary


def label_shards(plan: ShardPlan, labeller: Labeller, progress: LabelProgress | None = None) -> list[ShardResult]:
    """Every shard in order; with parser workers, the next unfinished shard's parse starts before the model
    labels this one, so the workers parse while the model runs (a sentence in both is parsed once)."""
    ahead = labeller.parser.workers > 1
    todo = [index for index in range(plan.shards) if not plan.labels(index).is_file()]
    started: dict[int, ShardParse] = {}
    results = []
    busy_until = 0.0
    for index in range(plan.shards):
        if ahead and index in todo:
            for upcoming in todo[todo.index(index) : todo.index(index) + 2]:
                if upcoming not in started:
                    started[upcoming] = start_parse(plan, upcoming, labeller, progress)
        parse = started.pop(index, None)
        results.append(label_shard(plan, index, labeller, parse, progress))
        if parse is not None:  # parses run back to back in the workers: count each second once
            results[-1].parse_seconds = parse.pending.seconds_after(busy_until)
            busy_until = parse.pending.finished_at
    return results


def _files_read(input_path: Path, model_reference: str | Path, settings: LabelSettings) -> dict[str, Path]:
    """What the run reads, by what it is to the run (for check_output's message)."""
    from spinn.tracking.store import is_model_uri

    reads = {"the input": Path(input_path)}
    if not is_model_uri(str(model_reference)):
        reads["the model"] = Path(model_reference)
    if settings.parsing.cache_path is not None:
        reads["the parse cache"] = Path(settings.parsing.cache_path)
    return reads


def check_output(output: Path, reads: dict[str, Path]) -> None:
    """Refuse, before any work, an output that is a folder or that would overwrite a file the run reads
    (the input, the model, the parse cache): the predictions, the rejects file and the parts folder."""
    output = Path(output)
    if output.is_dir():
        example = output / "labels.parquet"
        raise SpinnError(f"{output}: names a folder", fix=("output", f"{{}} is the predictions file, e.g. {example}"))
    written, parts = (output, rejects_file(output)), parts_folder(output).resolve()
    for role, path in reads.items():
        if any(_same_file(path, target) for target in written) or parts in path.resolve().parents:
            raise SpinnError(f"{path}: is {role} of this run; writing {output} would destroy it, choose another")


def _same_file(read: Path, written: Path) -> bool:
    """The same path once resolved, or the same file by another name (a hard link)."""
    if read.resolve() == written.resolve():
        return True
    return read.exists() and written.exists() and os.path.samefile(read, written)


@contextmanager
def hold_output(output: Path) -> Iterator[None]:
    """Own `output` and its parts folder for the block: refused at once while another run holds them.

    Taken before the model loads, so a refused run costs nothing. Temporaries
    that killed runs left beside the output or in the parts folder go first.
    When the block fails, the error says what the parts folder keeps for a
    rerun; a folder with nothing in it yet is removed."""
    output = Path(output)
    parts = parts_folder(output)
    with lock_folder(parts):
        for folder in (output.parent, parts):
            tidy_folder(folder)
        try:
            yield
        except BaseException as error:
            left = _left_behind(parts)
            if left is not None and not _advises_on(parts, error):
                error.add_note(left)
            raise


def _advises_on(parts: Path, error: BaseException) -> bool:
    """Whether the error is about the parts folder itself and already says what to do with it."""
    return f"{parts}:" in str(error) or f"delete {parts}" in str(error)


def _left_behind(parts: Path) -> str | None:
    """What a failed run leaves for the next one, in words; None (and the folder gone) when nothing."""
    kept = [path for path in parts.iterdir() if path.name != LOCK_NAME]
    if not kept:
        shutil.rmtree(parts)
        return None
    try:
        plan = _read_plan(parts)
    except SpinnError:
        plan = None
    if plan is None:
        return f"{parts} keeps {len(kept)} files of a plan that was not finished: a rerun starts over"
    done = sum(plan.labels(index).is_file() for index in range(plan.shards))
    return (
        f"{parts} keeps the plan and {done} of {plan.shards} labelled shards: "
        "rerun the same command to go on from there, or delete the folder"
    )
