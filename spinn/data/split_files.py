"""The files of a prepared split: `<split>.parquet` and `<split>.rejects.jsonl`, named in one place.

Every stage that reads a prepared split must also leave its rejects file alone
(the rejects are part of what the Parquet file means), so the pairing lives
here, below every reader and writer of splits, importing nothing of spinn.
"""

from __future__ import annotations

from pathlib import Path

PARQUET_SUFFIX, REJECTS_SUFFIX = ".parquet", ".rejects.jsonl"


def prepared_files(folder: Path, split: str) -> tuple[Path, Path]:
    """The two files of a prepared split: its Parquet file and its rejects file."""
    return Path(folder) / f"{split}{PARQUET_SUFFIX}", Path(folder) / f"{split}{REJECTS_SUFFIX}"


def with_partner(path: Path) -> tuple[Path, ...]:
    """An input and, when it is one file of a prepared split, the other: a stage reading one must not replace
    either (the rejects file of a split is part of what its Parquet file means)."""
    path = Path(path)
    for suffix in (REJECTS_SUFFIX, PARQUET_SUFFIX):
        if path.name.endswith(suffix):
            return (path, *prepared_files(path.parent, path.name.removesuffix(suffix)))
    return (path,)
