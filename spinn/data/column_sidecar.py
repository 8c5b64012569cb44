"""A per-file column mapping: `<file>.columns.json` beside a sentence-pair file names its columns.

Files dropped into the inbox come from many sources, each with its own column
names; no option can be given per file there. A sidecar such as
`sick.csv.columns.json` holding `{"premise": "sentence_A", "label": "gold"}`
says it for that one file; columns named on the command line still win.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from spinn.ground.errors import SpinnError
from spinn.ground.settings import Settings

SIDECAR_SUFFIX = ".columns.json"
S = TypeVar("S", bound=Settings)


def sidecar_path(path: Path) -> Path:
    """`data/inbox/sick.csv` -> `data/inbox/sick.csv.columns.json`."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def sidecar_columns(path: Path) -> dict[str, Any]:
    """The column roles the file's sidecar names (empty without a sidecar)."""
    sidecar = sidecar_path(Path(path))
    if not sidecar.is_file():
        return {}
    try:
        mapping = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SpinnError(f"{sidecar}: not a readable JSON object of role -> column ({error})") from None
    if not isinstance(mapping, dict):
        raise SpinnError(f'{sidecar}: expected a JSON object of role -> column, e.g. {{"label": "gold"}}')
    return mapping


def over_sidecar(path: Path, columns: S) -> S:
    """The columns named for this file: those given, over its sidecar's (the label scheme too)."""
    given = columns.model_dump(exclude_none=True)
    return type(columns).build(sidecar_columns(path), given, where=str(sidecar_path(path)))
