"""The resumable shard machinery of a label run: the plan, the shard files, the merge, the output's lock.

Large inputs are cut once into shards of `shard_size` rows (`plan_shards`),
each written to the parts folder beside the output; finished shards are
merged at the end (`merge_shards`). The plan records a fingerprint of the
arguments (the input's and the checkpoint's digests, the parser model,
columns, shard size): a rerun with the same arguments reuses the plan and
every finished shard, and one that would mix results of another model or
input is refused instead. The merge checks that every input row is in its
shard exactly once, labelled or rejected, before it publishes anything; it
publishes the run's record with the output (spinn/labeling/published.py) and
then empties the parts folder, whose shards would otherwise double the disk
the output takes. The folder itself goes when the run lets go of its lock.

One run at a time works on an output: the run holds a lock file in the parts
folder (`hold_output`), and a second run is refused at once, naming the
first. The Prefect flow (flows/label_pairs.py) drives these same steps with
the shards as tasks on a Dask cluster.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spinn.data.sentence_pairs import InputPair, read_input_pairs
from spinn.data.vocab import warn_if_mostly_unknown
from spinn.errors import SpinnError
from spinn.io import LOCK_NAME, atomic_path, atomic_paths, file_digest, lock_folder, tidy_folder
from spinn.labeling.published import changed_arguments, record_file, record_text
from spinn.labeling.settings import INPUT_SCHEMA, OUTPUT_SCHEMA, LabelSettings
from spinn.labeling.summary import LabelSummary, PredictionCounts, ShardResult

PARTS_SUFFIX = ".parts"
PLAN_NAME = "plan.json"
PLAN_VERSION = 1


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


def run_fingerprint(input_path: Path, settings: LabelSettings, labeller_fingerprint: dict) -> dict:
    """What makes two runs' results differ: the input's content, how it is read and cut, and the labeller's
    model and parser. Kept in the plan (a resume must match it) and in the published record (a rerun too)."""
    input_path = Path(input_path)
    if not input_path.is_file():
        raise SpinnError(f"{input_path}: no such input file")
    return {
        "version": PLAN_VERSION,
        "input": str(input_path.resolve()),
        "input_sha256": file_digest(input_path, "sha256"),
        "columns": settings.columns.model_dump(),
        "format": settings.input_format,
        "shard_size": settings.shard_size,
        **labeller_fingerprint,
    }


def plan_shards(input_path: Path, output: Path, settings: LabelSettings, labeller_fingerprint: dict) -> ShardPlan:
    """Cut the input into shard files once; a rerun with the same arguments reuses them."""
    input_path, output = Path(input_path), Path(output)
    fingerprint = run_fingerprint(input_path, settings, labeller_fingerprint)
    parts = parts_folder(output)
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
    changed = changed_arguments(plan.fingerprint, fingerprint)
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
        temporary.write_text(_jsonl(records), encoding="utf-8")


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line] if path.is_file() else []


def merge_shards(plan: ShardPlan, results: list[ShardResult], model: str, parser: str) -> LabelSummary:
    """Concatenate finished shards in row order into the output and its rejects file, published together with
    the run's record, checking each shard holds each of its rows exactly once and was labelled by `model`;
    then empty the parts folder (the output and the record now say all its shards did)."""
    missing = [index for index in range(plan.shards) if not plan.labels(index).is_file()]
    if missing:
        raise SpinnError(f"{plan.parts}: shards {missing[:10]} are not finished; rerun to complete them")
    output = Path(plan.output)
    rejects_path = rejects_file(output)
    rejects = []
    predicted = PredictionCounts()
    with atomic_paths(output, rejects_path, record_file(output)) as (temporary, rejects_temporary, record_temporary):
        writer = pq.ParquetWriter(temporary, OUTPUT_SCHEMA)
        try:
            for index in range(plan.shards):
                table = pq.read_table(plan.labels(index), schema=OUTPUT_SCHEMA)
                shard_rejects = read_lines(plan.input_rejects(index)) + read_lines(plan.label_rejects(index))
                shard_rejects = [json.loads(line) for line in shard_rejects]
                _check_shard(plan, index, table, shard_rejects, model)
                writer.write_table(table)
                predicted.add(table)
                rejects += shard_rejects
        finally:
            writer.close()
        rejects_temporary.write_text(_jsonl(sorted(rejects, key=lambda reject: reject["row"])), encoding="utf-8")
        summary = _merged_summary(plan, results, model, parser, rejects, predicted)
        record_temporary.write_text(
            record_text(summary, plan.fingerprint, temporary, rejects_temporary), encoding="utf-8"
        )
    clear_parts(Path(plan.parts))
    warn_if_mostly_unknown(plan.input, summary.oov_share)
    return summary


def _merged_summary(
    plan: ShardPlan,
    results: list[ShardResult],
    model: str,
    parser: str,
    rejects: list[dict],
    predicted: PredictionCounts,
) -> LabelSummary:
    output = Path(plan.output)
    reasons = Counter(reject["reason"] for reject in rejects)
    return LabelSummary(
        output,
        rejects_file(output),
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
        input=Path(plan.input),
        input_sha256=plan.fingerprint["input_sha256"],
        predicted=predicted,
    )


def clear_parts(parts: Path) -> None:
    """Delete the plan and the shards, once the output they made is published; the lock stays with its
    holder (`hold_output` removes the folder as it lets go). A kill part way leaves a record that still
    matches the output, so the rerun does nothing but finish this."""
    if parts.is_dir():
        for path in parts.iterdir():
            if path.name != LOCK_NAME:
                path.unlink(missing_ok=True)


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


def check_output(output: Path, reads: dict[str, Path]) -> None:
    """Refuse, before any work, an output that is a folder or whose parts folder holds a file the run reads
    (an output that is a file the run reads is spinn.io.publishing's one rule, applied by `label`)."""
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
    rerun; a folder with nothing in it (never planned, or emptied by the
    merge) is removed, before the lock is let go, as `_held(remove=True)` does."""
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
        _remove_if_empty(parts)


def _advises_on(parts: Path, error: BaseException) -> bool:
    """Whether the error is about the parts folder itself and already says what to do with it."""
    return f"{parts}:" in str(error) or f"delete {parts}" in str(error)


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
    except SpinnError:
        plan = None
    if plan is None:
        return f"{parts} keeps {len(kept)} files of a plan that was not finished: a rerun starts over"
    done = sum(plan.labels(index).is_file() for index in range(plan.shards))
    return (
        f"{parts} keeps the plan and {done} of {plan.shards} labelled shards: "
        "rerun the same command to go on from there, or delete the folder"
    )
