"""The parts folder of a label run: the shard plan, the shard files, what a resume keeps, the output's lock.

Large inputs are cut once into shards of `shard_size` rows (`plan_shards`),
each written to the parts folder beside the output. The plan records the
run's fingerprint (the input's and the checkpoint's digests, the parser
model, columns, shard size): a rerun with the same arguments reuses the plan
and every finished shard, and one that would mix results of another model or
input is refused instead (or, asked to `replace`, starts over).

A resume trusts nothing it did not check (`kept_shards`): each finished
shard must read back whole and hold each of its rows exactly once, labelled
or rejected, by this model; a damaged one (a truncated file, a deleted input
shard, a record that is not JSON) is labelled again and named in a
SpinnWarning, never a traceback. A damaged plan starts the folder over.

One run at a time works on an output: the run holds a lock file in the parts
folder (`hold_output`), and a second run is refused at once, naming the
first. The folder goes when the run lets go of its lock with nothing in it.

A file is spread over a cluster's workers (`spread_over`): a file shorter than
`shard_size` was one shard, so one worker labelled it while the others sat
idle; its shard size is at most its rows divided by the workers, rounded up.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.data.sentence_pairs import InputPair, read_input_pairs
from spinn.ground.errors import SpinnError, SpinnWarning
from spinn.ground.io import LOCK_NAME, atomic_path, file_digest, lock_folder, tidy_folder
from spinn.labeling.label_settings import (
    INPUT_SCHEMA,
    OUTPUT_SCHEMA,
    TOKENS_KEY,
    UNKNOWN_TOKENS_KEY,
    LabelSettings,
)
from spinn.labeling.summary import ShardResult

PARTS_SUFFIX = ".parts"
PLAN_NAME = "plan.json"
PLAN_VERSION = 1
_UNREADABLE = (OSError, ValueError, TypeError, KeyError, pa.ArrowException)
"""What reading back a damaged shard file raises: a missing or truncated file, Parquet that is not, a JSON
line that is not, a record without its row."""


class PartsFolderError(SpinnError):
    """An error that already says what to do with the parts folder (`hold_output` adds no advice of its own)."""


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


def parts_folder(output: Path) -> Path:
    return Path(output).with_name(Path(output).name + PARTS_SUFFIX)


def run_fingerprint(input_path: Path, settings: LabelSettings, model_fingerprint: dict) -> dict:
    """What makes two runs' results differ: the input's content, how it is read and cut, and the model and
    its parser. Kept in the plan (a resume must match it) and in the published record (a rerun too)."""
    input_path = Path(input_path)
    if not input_path.is_file():
        raise SpinnError(f"{input_path}: no such input file")
    return {
        "version": PLAN_VERSION,
        "input": str(input_path.resolve()),
        "input_sha256": file_digest(input_path, "sha256"),
        "columns": settings.columns.model_dump(exclude={"label_scheme"}),  # scores the labels, changes none
        "format": settings.input_format,
        "shard_size": settings.shard_size,
        **model_fingerprint,
    }


def changed_arguments(recorded: dict, fingerprint: dict) -> list[str]:
    """The fingerprint's keys whose values differ: the arguments that make two runs' results differ."""
    return sorted(key for key in recorded.keys() | fingerprint.keys() if recorded.get(key) != fingerprint.get(key))


def plan_shards(
    input_path: Path, output: Path, settings: LabelSettings, fingerprint: dict, *, replace: bool = False
) -> tuple[ShardPlan, list[str]]:
    """Cut the input into shard files once; a rerun with the same arguments reuses them. Returns the plan and
    what of an earlier run's folder was damaged and made again, in words (each also a SpinnWarning).

    replace: a folder that holds another run's shards is emptied and planned anew instead of refused."""
    input_path, output = Path(input_path), Path(output)
    parts = parts_folder(output)
    repaired: list[str] = []
    existing = _kept_plan(parts, repaired)
    if existing is not None and changed_arguments(existing.fingerprint, fingerprint):
        if not replace:
            raise PartsFolderError(
                f"{parts}: holds shards of another run (different "
                f"{', '.join(changed_arguments(existing.fingerprint, fingerprint))}); "
                "rerun with the same arguments to resume, or delete the folder or choose another output"
            )
        clear_parts(parts)
        existing = None
    if existing is not None:
        _repair_input_shards(existing, input_path, settings, repaired)
        return existing, repaired
    parts.mkdir(parents=True, exist_ok=True)
    shards, rows = _write_input_shards(input_path, parts, settings)
    plan = ShardPlan(str(input_path), str(output), str(parts), shards, rows, fingerprint)
    with atomic_path(parts / PLAN_NAME) as temporary:
        temporary.write_text(json.dumps(asdict(plan), indent=2), encoding="utf-8")
    return plan, repaired


def _read_plan(parts: Path) -> ShardPlan | None:
    """The folder's plan; None when there is none; PartsFolderError when there is one that does not read."""
    path = parts / PLAN_NAME
    if not path.is_file():
        return None
    try:
        return ShardPlan(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as error:
        raise PartsFolderError(f"{path}: not a label plan ({error})") from None


def _kept_plan(parts: Path, repaired: list[str]) -> ShardPlan | None:
    """The plan to resume; a damaged one is named and the folder started over (its shards cannot be trusted
    without the fingerprint that made them)."""
    try:
        return _read_plan(parts)
    except PartsFolderError as error:
        _repaired(repaired, f"{error}; the input is planned and labelled again from the start")
        clear_parts(parts)
        return None


def _repaired(repaired: list[str], what: str) -> None:
    repaired.append(what)
    warnings.warn(SpinnWarning(what), stacklevel=3)


def _repair_input_shards(plan: ShardPlan, input_path: Path, settings: LabelSettings, repaired: list[str]) -> None:
    """Cut the input again when any input shard does not read back whole: the cut depends on the input and
    the settings alone (both in the fingerprint), so the finished labels shards still line up with it."""
    problems = [problem for index in range(plan.shards) if (problem := _input_shard_problem(plan, index))]
    if not problems:
        return
    shards, rows = _write_input_shards(input_path, Path(plan.parts), settings)
    if (shards, rows) != (plan.shards, plan.rows):
        raise PartsFolderError(f"{plan.parts}: the input no longer cuts as planned; delete the folder and rerun")
    _repaired(repaired, f"{'; '.join(problems)}; the input was cut into its shards again")


def _input_shard_problem(plan: ShardPlan, index: int) -> str | None:
    """What is wrong with shard `index`'s input files, in words; None when they hold exactly its rows."""
    try:
        rows = pq.read_table(plan.input_pairs(index), schema=INPUT_SCHEMA).column("row").to_pylist()
        rows += [reject["row"] for reject in read_records(plan.input_rejects(index))]
    except _UNREADABLE as error:
        return f"{plan.input_pairs(index)}: input shard {index} does not read back ({_why(error)})"
    if sorted(rows) != list(shard_rows(plan, index)):
        return f"{plan.input_pairs(index)}: input shard {index} does not hold its rows"
    return None


def _why(error: BaseException) -> str:
    if isinstance(error, FileNotFoundError) and error.filename:
        return f"{Path(error.filename).name} is missing"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no message'}"


def _write_input_shards(input_path: Path, parts: Path, settings: LabelSettings) -> tuple[int, int]:
    """Stream the input once, writing each shard's pairs and reading rejects; returns (shards, rows)."""
    pairs: list[InputPair] = []
    rejects: list[dict] = []
    shard = rows = 0
    for rows, item in enumerate(
        read_input_pairs(input_path, settings.columns, settings.input_format, max_tokens=settings.parsing.max_tokens),
        start=1,
    ):
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
    write_jsonl(shard_file(parts, "input", index, ".rejects.jsonl"), rejects)
    with atomic_path(shard_file(parts, "input", index, ".parquet")) as temporary:
        pq.write_table(table, temporary)


def write_jsonl(path: Path, records: list[dict]) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(jsonl(records), encoding="utf-8")


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def read_records(path: Path) -> list[dict]:
    """A shard's JSON-lines file (its rejects), every line a record; raises what a damaged one does."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


# ----------------------------------------------------------------------------- what a resume keeps


def kept_shards(plan: ShardPlan, model: str) -> tuple[dict[int, ShardResult], list[str]]:
    """The finished shards that read back whole, each holding its rows exactly once and labelled by `model`
    (shard index -> its result, marked reused), and what was wrong with the others, in words: those are
    deleted (and warned of), so they are labelled again."""
    kept: dict[int, ShardResult] = {}
    repaired: list[str] = []
    for index in range(plan.shards):
        if not plan.labels(index).is_file():
            continue
        found = _kept_shard(plan, index, model)
        if isinstance(found, ShardResult):
            kept[index] = found
        else:
            plan.labels(index).unlink(missing_ok=True)
            plan.label_rejects(index).unlink(missing_ok=True)
            _repaired(repaired, f"{found}; labelled again")
    return kept, repaired


def _kept_shard(plan: ShardPlan, index: int, model: str) -> ShardResult | str:
    """Shard `index`'s result as a reused shard, or what is wrong with its files."""
    path = plan.labels(index)
    try:
        table = pq.read_table(path, schema=OUTPUT_SCHEMA)
        counts = pq.read_schema(path).metadata or {}
        label_rejects = read_records(plan.label_rejects(index))
        rejects = read_records(plan.input_rejects(index)) + label_rejects
        reasons = Counter(reject["reason"] for reject in label_rejects)
    except _UNREADABLE as error:
        return f"{path}: shard {index} does not read back ({_why(error)})"
    problems = shard_problems(plan, index, table, rejects, model)
    if problems:
        return problems
    tokens, unknown = (int(counts.get(key.encode(), 0)) for key in (TOKENS_KEY, UNKNOWN_TOKENS_KEY))
    return ShardResult(
        index, table.num_rows, len(label_rejects), True, reasons=dict(reasons), tokens=tokens, unknown_tokens=unknown
    )


def shard_rows(plan: ShardPlan, index: int) -> range:
    """The input rows shard `index` covers (1-based, as the readers number them)."""
    size = plan.fingerprint["shard_size"]
    return range(index * size + 1, min((index + 1) * size, plan.rows) + 1)


def shard_problems(plan: ShardPlan, index: int, labelled: pa.Table, rejects: list[dict], model: str) -> str | None:
    """What keeps a finished shard from the output, in words (None: nothing): every row of the shard once,
    labelled or rejected, labelled rows in input order, all by `model`."""
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
    if not problems:
        return None
    return f"{plan.labels(index)}: shard {index} (rows {expected.start}-{expected.stop - 1}) has {', '.join(problems)}"


def clear_parts(parts: Path) -> None:
    """Delete the plan and the shards, once the output they made is published; the lock stays with its
    holder (`hold_output` removes the folder as it lets go). A kill part way leaves a record that still
    matches the output, so the rerun does nothing but finish this."""
    if parts.is_dir():
        for path in parts.iterdir():
            if path.name != LOCK_NAME:
                path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- spreading a file over workers


def spread_shard_size(rows: int, workers: int, shard_size: int) -> int:
    """The shard size that makes at least `workers` shards of `rows` rows, capped at `shard_size`."""
    return max(1, min(shard_size, -(-rows // max(1, workers))))


def spread_over(settings: LabelSettings, input_path: Path, workers: int) -> LabelSettings:
    """`settings` with the shard size that spreads `input_path`'s rows over `workers` (one pass over the file,
    cheap beside parsing it); deterministic, so a rerun plans the same shards and reuses finished ones."""
    rows = sum(1 for _ in read_input_pairs(input_path, settings.columns, settings.input_format))
    return settings.replace(shard_size=spread_shard_size(rows, workers, settings.shard_size))


# ----------------------------------------------------------------------------- the output: checks and lock


def check_output(output: Path, reads: dict[str, Path]) -> None:
    """Refuse, before any work, an output that is a folder or whose parts folder holds a file the run reads
    (an output that is a file the run reads is spinn.ground.io.publishing's one rule, applied by `label`)."""
    output = Path(output)
    if output.is_dir():
        example = output / "labels.parquet"
        raise SpinnError(f"{output}: names a folder", fix=("output", f"{{}} is the predictions file, e.g. {example}"))
    parts = parts_folder(output).resolve()
    for role, path in reads.items():
        if parts in path.resolve().parents:
            raise SpinnError(f"{path}: is {role} of this run; writing {output} would destroy it, choose another")


@contextmanager
def hold_output(output: Path) -> Iterator[None]:
    """Own `output` and its parts folder for the block: refused at once while another run holds them.

    Taken before the model loads, so a refused run costs nothing. Temporaries
    that killed runs left beside the output or in the parts folder go first.
    When the block fails, the error says what the parts folder keeps for a
    rerun (unless it is a PartsFolderError, which says so itself); a folder
    with nothing in it (never planned, or emptied by the merge) is removed,
    before the lock is let go."""
    output = Path(output)
    parts = parts_folder(output)
    with lock_folder(parts):
        for folder in (output.parent, parts):
            tidy_folder(folder)
        try:
            yield
        except BaseException as error:
            left = _left_behind(parts)
            if left is not None and not isinstance(error, PartsFolderError):
                error.add_note(left)
            raise
        _remove_if_empty(parts)


def _remove_if_empty(parts: Path) -> bool:
    """Remove the parts folder when it holds nothing but the lock; whether it is gone."""
    if parts.is_dir() and any(path.name != LOCK_NAME for path in parts.iterdir()):
        return False
    shutil.rmtree(parts, ignore_errors=True)
    return True


def _left_behind(parts: Path) -> str | None:
    """What a failed run leaves for the next one, in words; None (and the folder gone) when nothing."""
    if _remove_if_empty(parts):
        return None
    kept = [path for path in parts.iterdir() if path.name != LOCK_NAME]
    try:
        plan = _read_plan(parts)
    except PartsFolderError:
        plan = None
    if plan is None:
        return f"{parts} keeps {len(kept)} files of a plan that was not finished: a rerun starts over"
    done = sum(plan.labels(index).is_file() for index in range(plan.shards))
    return (
        f"{parts} keeps the plan and {done} of {plan.shards} labelled shards: "
        "rerun the same command to go on from there, or delete the folder"
    )
