"""What a label run is told, and what it writes: LabelSettings and the shard and output Parquet schemas.

Everything here that changes the output is part of a run's plan fingerprint
(spinn/labeling/shard_plan.py), so a rerun with other settings never mixes
results into a half-finished output.
"""

from __future__ import annotations

import pyarrow as pa
from pydantic import Field

from spinn.data.schema import LABELS
from spinn.data.sentence_pairs import Columns, Format
from spinn.ground.settings import AUTO, Device, Settings, ThreadCount
from spinn.model.parser_choice import PARSER_AUTO, ParserChoice
from spinn.parsing.parser_settings import ParserSettings

DEFAULT_SHARD_SIZE = 10_000
DEFAULT_BATCH_SIZE = 256
PROBABILITY_COLUMNS = tuple(f"p_{label}" for label in LABELS)
GOLD_COLUMN = "gold_label"
"""The output's column of each row's gold value, as the file gives it (any scheme; None: no gold)."""
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
        pa.field(GOLD_COLUMN, pa.string(), nullable=True),
        pa.field("model", pa.string(), nullable=False),
        pa.field("parser", pa.string(), nullable=False),
    ]
)


class LabelSettings(Settings):
    """How to read, parse and batch; everything that changes the output is in the plan's fingerprint."""

    parser: ParserChoice = PARSER_AUTO
    """stanza: parse first; model: a spinn or rl model builds its own trees from tokens; auto: model for spinn
    and rl (they predict their own transitions, no parser loads), stanza for pi and pi-nt."""
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1)
    """Pairs per model batch (the labels do not depend on it)."""
    shard_size: int = Field(DEFAULT_SHARD_SIZE, ge=1)
    """Rows per shard: the unit of resuming and of parallel work."""
    device: Device = "auto"
    """Where the model runs; auto: the GPU when there is one."""
    int8: bool = False
    """int8 dynamic quantization of the composition (CPU only; the tracker and the classifier stay fp32):
    less arithmetic, and labels that agree with fp32 on most pairs, not all (README's labelling measurements)."""
    threads: ThreadCount = AUTO
    """torch threads for the model on CPU; auto: the cores other work leaves free, within this process's share of
    the cores it may use (split with parser worker processes), followed as they change (spinn/ground/cores.py). The
    labels do not depend on it."""
    max_rejected: float = Field(1.0, ge=0.0, le=1.0)
    """The share of rows that may be rejected before the run fails (its output still written, the reasons in
    its rejects file); 1.0: only a run that labels no row fails. The label-pairs flow's default is 0.1."""
    columns: Columns = Columns()
    """Which columns hold the pair."""
    input_format: Format | None = Field(None, json_schema_extra={"cli": "--format"})
    """Input format (default: from the file name)."""
    parsing: ParserSettings = ParserSettings()
    """How Stanza runs."""
