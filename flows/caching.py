"""Prefect caching for the pipeline's stages: keyed on what a stage reads, checked against what it wrote.

Prefect's INPUTS policy hashes parameter values, so a path whose file changed
would still hit. `cache_on(...)` instead hashes the *contents* of the named
input files, the other parameters by value, and the source of the `spinn`
package (new code recomputes, as DVC's code deps do). A hit is then only
used when the files the stage wrote are still there with the same digests
(`run_stage`): a deleted or edited output makes the stage run again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from prefect import Task
from prefect.context import TaskRunContext
from pydantic import BaseModel

import spinn
from spinn.ground.io import file_digest

CACHED_STATE = "Cached"


class StageOutput(BaseModel):
    """What a cached stage returns: its summary, plus its output files and their digests."""

    summary: dict[str, Any] = {}
    files: dict[str, str] = {}
    """Output path -> sha256 at the end of the run."""

    @classmethod
    def of(cls, summary: dict[str, Any], *paths: Path) -> StageOutput:
        return cls(summary=summary, files={str(path): file_digest(Path(path), "sha256") for path in paths})

    def intact(self) -> bool:
        """Every output file still exists with the digest it had when the stage wrote it."""
        return all(
            Path(path).is_file() and file_digest(Path(path), "sha256") == digest for path, digest in self.files.items()
        )


@cache
def code_digest() -> str:
    """sha256 over the `spinn` package's Python sources: any code change invalidates every cached stage."""
    root = Path(spinn.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_on(*input_files: str) -> Callable[[TaskRunContext, dict[str, Any]], str | None]:
    """A cache_key_fn hashing the named input files' contents and every parameter's value.

    An input is a parameter's name, or a dotted path into a settings parameter
    (`settings.file`). A named input that is given but is not a local file (an
    MLflow model URI, whose target can move) makes the key None: Prefect does
    not cache that call.
    """

    def key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
        described: dict[str, Any] = {"task": context.task.name, "code": code_digest()}
        described.update({name: _plain(value) for name, value in sorted(parameters.items())})
        for name in input_files:
            value = _lookup(parameters, name)
            if value is None:
                continue
            if not Path(str(value)).is_file():
                return None
            described[f"{name}:contents"] = {"path": str(Path(value).resolve()), "sha256": file_digest(Path(value))}
        return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()

    return key


def _lookup(parameters: dict[str, Any], dotted: str) -> Any:
    head, *rest = dotted.split(".")
    value = parameters.get(head)
    for name in rest:
        value = getattr(value, name, None)
    return value


def _plain(value: Any) -> Any:
    """A JSON-able form of a parameter; paths are made absolute so two project folders never share a key."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Path):
        return str(value.resolve())
    return value


def run_stage(stage: Task, **parameters: Any) -> StageOutput:
    """Run a cached stage task; when its cached outputs are gone or changed, run it again for real."""
    state = stage(**parameters, return_state=True)
    output: StageOutput = state.result()
    if state.name == CACHED_STATE and not output.intact():
        output = stage.with_options(refresh_cache=True)(**parameters)
    return output
