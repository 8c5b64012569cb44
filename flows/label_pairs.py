"""label-pairs: label every new file in an inbox folder, once, with shards spread over a Dask cluster.

Each run lists the inbox, skips files the index says are done (same name and
same content digest), and labels the rest one file at a time. A file is cut
into shards (spinn.label), the shards run as Prefect tasks on a Dask cluster
(a local one by default, or an existing cluster by address) and are merged.
A file that fails is recorded as failed, reported, and tried again on the next
run; finished shards of a killed run are reused. Counts go to the Prefect
run's artifacts and to an MLflow run per labelled file.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field

from spinn.atomic import atomic_path
from spinn.download import file_digest

INDEX_NAME = "index.json"
INPUT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet", ".csv.gz", ".tsv.gz", ".jsonl.gz")
DONE, FAILED = "done", "failed"
LABELING_EXPERIMENT = "spinn-labeling"
LOOPBACK = "127.0.0.1"


class LabelRequest(BaseModel):
    """What to label, with what, and where the work runs."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    inbox: Path = Field(Path("data/inbox"), description="New sentence-pair files land here.")
    outbox: Path = Field(Path("data/labelled"), description="Predictions, rejects and index.json go here.")
    model: str = Field("models:/spinn@champion", description="Checkpoint path or MLflow model URI.")
    parser: str = Field("auto", pattern="^(auto|stanza|model)$")
    stanza_dir: Path | None = Field(None, description="A local stanza_resources folder (offline).")
    premise_column: str | None = None
    hypothesis_column: str | None = None
    id_column: str | None = None
    label_column: str | None = None
    batch_size: int = Field(256, ge=1)
    shard_size: int = Field(10_000, ge=1)
    max_tokens: int = Field(100, ge=1)
    device: str = Field("auto", pattern="^(auto|cpu|cuda)$")
    dask_address: str | None = Field(None, description="An existing Dask scheduler, e.g. tcp://10.0.0.5:8786.")
    dask_workers: int = Field(2, ge=1, description="Workers of the local cluster when no address is given.")

    def settings(self):
        from spinn.label import LabelSettings
        from spinn.parse import ParserSettings
        from spinn.sentence_pairs import Columns

        columns = Columns(premise=self.premise_column, hypothesis=self.hypothesis_column, id=self.id_column,
                          label=self.label_column)
        parsing = ParserSettings(stanza_dir=self.stanza_dir, device=self.device, max_tokens=self.max_tokens,
                                 cache_path=self.outbox / "parse_cache.sqlite")
        return LabelSettings(parser=self.parser, batch_size=self.batch_size, shard_size=self.shard_size,
                             device=self.device, columns=columns, parsing=parsing)


@contextmanager
def dask_cluster(request: LabelRequest) -> Iterator[str]:
    """The scheduler address: the given cluster, or a local one (127.0.0.1) that lives for this run only.

    One cluster serves every file of a run, so workers load the model and the
    parser once, not once per file.
    """
    if request.dask_address:
        yield request.dask_address
        return
    from distributed import LocalCluster

    with LocalCluster(n_workers=request.dask_workers, threads_per_worker=1, processes=True,
                      host=LOOPBACK, dashboard_address=None) as cluster:
        yield cluster.scheduler_address


# ----------------------------------------------------------------------------- tasks (run on Dask workers)

_LABELLERS: dict[tuple, Any] = {}
"""One loaded model and parser per worker process, shared by the shards that worker labels."""


def _labeller(model: str, settings) -> Any:
    from spinn.label import Labeller

    key = (model, repr(settings))
    if key not in _LABELLERS:
        _LABELLERS[key] = Labeller(model, settings)
    return _LABELLERS[key]


@task(name="plan-shards", task_run_name="plan-{input_path.name}")
def plan_task(input_path: Path, output: Path, model: str, settings) -> tuple[Any, str, str]:
    """Cut the file into shards; returns the plan and the resolved model (an alias resolved once, here)."""
    from spinn.label import plan_shards

    labeller = _labeller(model, settings)
    return plan_shards(input_path, output, settings, labeller.fingerprint()), labeller.reference, \
        labeller.model_name


@task(name="label-shard", task_run_name="label-shard-{index}")
def shard_task(plan, index: int, model: str, settings):
    from spinn.errors import SpinnError
    from spinn.label import label_shard

    labeller = _labeller(model, settings)
    if labeller.checkpoint_sha256 != plan.fingerprint["checkpoint_sha256"]:
        raise SpinnError(f"{model}: this worker loaded another checkpoint than the plan's")
    return label_shard(plan, index, labeller)


@task(name="merge-shards", task_run_name="merge-{plan.shards}-shards")
def merge_task(plan, results: list, model_name: str, parser: str):
    from spinn.label import merge_shards

    return merge_shards(plan, results, model_name, parser)


# ----------------------------------------------------------------------------- flows


@flow(name="label-file")
def label_file(input_path: Path, request: LabelRequest) -> dict[str, Any]:
    """One file: plan, then every shard as a task on the Dask cluster, then merge."""
    settings = request.settings()
    output = request.outbox / f"{_stem(input_path)}.labels.parquet"
    plan, model, model_name = plan_task(input_path, output, request.model, settings)
    futures = [shard_task.submit(plan, index, model, settings) for index in range(plan.shards)]
    results = [future.result() for future in futures]
    parser = "model" if settings.parser == "model" else "stanza"
    summary = merge_task(plan, results, model_name, parser)
    return {"output": str(summary.output), "rejects": str(summary.rejects), "rows": summary.rows,
            "labelled": summary.labelled, "rejected": summary.rejected, "reasons": summary.reasons,
            "shards": summary.shards, "shards_reused": summary.shards_reused, "model": summary.model,
            "parser": summary.parser, "parse_pairs_per_second": summary.parse_pairs_per_second,
            "model_pairs_per_second": summary.model_pairs_per_second}


@flow(name="label-pairs", log_prints=True)
def label_pairs(request: LabelRequest | None = None) -> dict[str, dict[str, Any]]:
    """Label the inbox's new and previously failed files; returns this run's entries of the index."""
    request = request or LabelRequest()
    request.outbox.mkdir(parents=True, exist_ok=True)
    index = read_index(request.outbox)
    entries = {}
    pending = pending_files(request.inbox, index)
    if pending:
        with dask_cluster(request) as address:
            for path in pending:
                entries[path.name] = _label_one(path, request, address)
                index[path.name] = entries[path.name]
                write_index(request.outbox, index)
    create_markdown_artifact(_markdown(entries), key="spinn-labeling-run",
                             description=f"{len(entries)} inbox files labelled or retried")
    failed = [name for name, entry in entries.items() if entry["status"] == FAILED]
    if failed:
        print(f"failed (retried on the next run): {', '.join(failed)}")
    return entries


def _label_one(path: Path, request: LabelRequest, address: str) -> dict[str, Any]:
    """Label one file under its own Dask-backed subflow; a failure is recorded, not raised."""
    entry = {"sha256": file_digest(path, "sha256"), "started_at": _now()}
    start = time.perf_counter()
    runner = DaskTaskRunner(address=address)
    state = label_file.with_options(task_runner=runner, flow_run_name=f"label-{path.name}")(
        path, request, return_state=True)
    entry["seconds"] = round(time.perf_counter() - start, 3)
    if state.is_completed():
        entry.update(status=DONE, **state.result())
        _log_to_mlflow(path, entry)
    else:
        error = state.result(raise_on_failure=False)
        entry.update(status=FAILED, error=f"{type(error).__name__}: {error}")
    return entry


def pending_files(inbox: Path, index: dict[str, dict]) -> list[Path]:
    """Input files not yet done with this content (new, changed, or failed last time), by name."""
    if not inbox.is_dir():
        return []
    files = sorted(path for path in inbox.iterdir() if path.is_file() and path.name.endswith(INPUT_SUFFIXES))
    return [path for path in files if not _done(index.get(path.name), path)]


def _done(entry: dict | None, path: Path) -> bool:
    return entry is not None and entry.get("status") == DONE and entry.get("sha256") == file_digest(path, "sha256")


def read_index(outbox: Path) -> dict[str, dict]:
    path = outbox / INDEX_NAME
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_index(outbox: Path, index: dict[str, dict]) -> None:
    with atomic_path(outbox / INDEX_NAME) as temporary:
        temporary.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _stem(path: Path) -> str:
    name = path.name
    for suffix in sorted(INPUT_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _log_to_mlflow(path: Path, entry: dict[str, Any]) -> None:
    """One MLflow run per labelled file: what was labelled with which model, and the counts."""
    from spinn import tracking

    with tracking.run(LABELING_EXPERIMENT, run_name=f"label {path.name}"):
        tracking.log_params({"input": str(path), "input_sha256": entry["sha256"], "model": entry["model"],
                             "parser": entry["parser"], "output": entry["output"]})
        metrics = {"rows": entry["rows"], "labelled": entry["labelled"], "rejected": entry["rejected"],
                   "seconds": entry["seconds"]}
        metrics.update({f"rejected_{reason}": count for reason, count in entry["reasons"].items()})
        tracking.log_metrics(metrics, step=0)


def _markdown(entries: dict[str, dict[str, Any]]) -> str:
    lines = ["# Labelling run", "", "| file | status | rows | labelled | rejected | output |",
             "|---|---|---|---|---|---|"]
    for name, entry in entries.items():
        if entry["status"] == DONE:
            lines.append(f"| {name} | done | {entry['rows']} | {entry['labelled']} | {entry['rejected']} "
                         f"| {entry['output']} |")
        else:
            lines.append(f"| {name} | **failed**: {entry['error'].replace('|', '/')} | | | | |")
    if not entries:
        lines.append("| (no new files) | | | | | |")
    return "\n".join(lines)
