"""Spread one file over the workers: a shard size that gives every worker of a cluster some of the file.

The inbox labels a file as shards on a Dask cluster; a file shorter than
`shard_size` was one shard, so one worker parsed it while the others sat
idle. The shard size for a file is therefore at most its rows divided by the
workers, rounded up (and never above the settings' shard_size).
"""

from __future__ import annotations

from pathlib import Path

from spinn.data.sentence_pairs import read_input_pairs
from spinn.labeling.settings import LabelSettings


def spread_shard_size(rows: int, workers: int, shard_size: int) -> int:
    """The shard size that makes at least `workers` shards of `rows` rows, capped at `shard_size`."""
    return max(1, min(shard_size, -(-rows // max(1, workers))))


def spread_over(settings: LabelSettings, input_path: Path, workers: int) -> LabelSettings:
    """`settings` with the shard size that spreads `input_path`'s rows over `workers` (one pass over the file,
    cheap beside parsing it); deterministic, so a rerun plans the same shards and reuses finished ones."""
    rows = sum(1 for _ in read_input_pairs(input_path, settings.columns, settings.input_format))
    return settings.replace(shard_size=spread_shard_size(rows, workers, settings.shard_size))
