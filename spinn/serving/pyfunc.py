"""SpinnModel: the MLflow pyfunc that `mlflow.pyfunc.load_model("models:/spinn@champion")` returns.

It is MLflow's plugin, so it imports MLflow (the one place outside
spinn/tracking/ that does): MLflow builds it from spinn/serving/model_code.py
and hands it the files it was logged with (checkpoint, vocabulary, config).
It predicts through the labeller and `label_texts`, the same step as
`spinn label`, so a served row equals a labelled one. A model that builds its
own trees (spinn, rl) needs no parser; the others parse with Stanza, set as
logged with the model (`parsing` in its model_config).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.pyfunc import PythonModel

from spinn.data.rejects import RejectReason
from spinn.labeling.label_settings import LabelSettings
from spinn.labeling.labelled_rows import PREDICTION_COLUMNS, REJECTED_COLUMN, label_texts
from spinn.labeling.labeller import Labeller, ModelSource
from spinn.model.checkpoint import load_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.parser_choice import PARSER_AUTO, resolve_parser
from spinn.parsing.parse import SENTENCES
from spinn.tracking.register import CHECKPOINT_ARTIFACT, PARSING_CONFIG

INVALID_FIELD = RejectReason.INVALID_FIELD.value
SERVING_PARSING = {"cache_path": None, "workers": 1}
"""A served model parses in its own process, with no cache file: requests come one frame at a time."""
OUTPUT_COLUMNS = (*PREDICTION_COLUMNS, REJECTED_COLUMN)


class SpinnModel(PythonModel):
    """Raw premise/hypothesis text in, label, class probabilities and trees out, one row per input row."""

    def load_context(self, context) -> None:
        checkpoint = Path(context.artifacts[CHECKPOINT_ARTIFACT])
        self.labeller = Labeller(ModelSource(checkpoint), serving_settings(checkpoint, context.model_config or {}))
        self.busy = threading.Lock()
        """One request at a time through the labeller: the server may call predict from several threads,
        and the parser and the model's inference step keep state between batches."""

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """A missing sentence counts as empty (refused: `empty_sentence`); one that is not text (a number,
        JSON's Infinity, true) is refused as `invalid_field`, as every pairs reader refuses it, never labelled
        as the text "inf". Object columns: a refused pair's missing values stay None, which the server writes
        as JSON null (pandas would make them NaN, which JSON has no word for)."""
        sentences = [[_text(value) for value in model_input[name].tolist()] for name in SENTENCES]
        texts = [index for index, pair in enumerate(zip(*sentences, strict=True)) if None not in pair]
        with self.busy:
            labelled = label_texts(self.labeller, *([side[index] for index in texts] for side in sentences))
        rows = [{**dict.fromkeys(OUTPUT_COLUMNS), REJECTED_COLUMN: INVALID_FIELD} for _ in range(len(model_input))]
        for index, row in zip(texts, labelled, strict=True):
            rows[index] = row
        return pd.DataFrame(rows, columns=list(OUTPUT_COLUMNS), dtype=object)


def _text(value: Any) -> str | None:
    """A sentence as the labeller takes it: text as it is, a missing value as empty, anything else None."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return None


def serving_settings(checkpoint: Path, model_config: dict[str, Any]) -> LabelSettings:
    """The model's own trees when it can build them, else Stanza with the parser settings logged with it."""
    config = SPINNConfig.from_dict(load_checkpoint(checkpoint).model_config)
    parser = resolve_parser(PARSER_AUTO, config)
    parsing = {**model_config.get(PARSING_CONFIG, {}), **SERVING_PARSING}
    return LabelSettings.model_validate({"parser": parser, "parsing": parsing})
