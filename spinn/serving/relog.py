"""Re-register a version registered before logged models (a folder of files) as an MLflow model.

Release 0.1.0 registered a run's `model/` folder: checkpoint, vocabulary and
config, readable by spinn only. `relog_version` logs those same files as a
logged pyfunc model of the same run (no retraining: the weights are the
version's own), registers it as a new version with the old version's tags and
description, and moves every alias the old version held onto it, so
`models:/spinn@champion` becomes loadable by `mlflow.pyfunc.load_model` and
servable. The old version stays, and keeps loading in `spinn label`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from spinn.data.vocab import VOCAB_FILENAME
from spinn.ground.errors import SpinnError
from spinn.model.checkpoint import load_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.parser_choice import needs_parser
from spinn.tracking import logged_models
from spinn.tracking import store as tracking
from spinn.tracking.register import log_model

FOLDER_FILES = (tracking.CHECKPOINT_NAME, VOCAB_FILENAME, "config.json")
"""What a version registered as a folder holds: the checkpoint, its vocabulary, the run's TrainConfig."""
RELOGGED_FROM_TAG = "relogged_from"
"""The new version's tag naming the version whose files it carries."""


@dataclass(frozen=True)
class Relogged:
    old: str
    new: str
    """models:/name/version of both."""
    model_id: str
    aliases: list[str]
    """Aliases moved from the old version to the new one."""


def relog_version(uri: str) -> Relogged:
    """`models:/spinn/3` (or an alias) registered as a folder -> a new version that is a logged model."""
    name, version = _name_and_version(tracking.resolve_model_uri(uri))
    old = logged_models.version_info(name, version)
    if old.is_logged_model:
        raise SpinnError(f"{uri}: models:/{name}/{version} is a logged model already ({old.source})")
    if old.run_id is None or not tracking.run_exists(old.run_id):
        raise SpinnError(f"{uri}: its run is not in {tracking.tracking_uri()}; a logged model needs its run")
    with tempfile.TemporaryDirectory(prefix="spinn-relog-") as folder:
        files = logged_models.download_model(f"models:/{name}/{version}", Path(folder))
        checkpoint, vocabulary, config = (files / file for file in FOLDER_FILES)
        missing = [path.name for path in (checkpoint, vocabulary, config) if not path.is_file()]
        if missing:
            raise SpinnError(f"{uri}: the version's folder lacks {', '.join(missing)}")
        loaded = load_checkpoint(checkpoint)
        parser_needed = needs_parser(SPINNConfig.from_dict(loaded.model_config))
        model_id = log_model(
            old.run_id,
            checkpoint,
            vocabulary,
            config,
            loaded.metrics or {},
            needs_parser=parser_needed,
            step=loaded.step,
        )
    tags = {**old.tags, RELOGGED_FROM_TAG: f"models:/{name}/{version}"}
    with tracking.store_lock():
        new = tracking.register(name, old.run_id, tags, description=old.description, model_id=model_id)
        for alias in old.aliases:
            tracking.set_alias(name, alias, new)
    return Relogged(f"models:/{name}/{version}", f"models:/{name}/{new}", model_id, old.aliases)


def _name_and_version(uri: str) -> tuple[str, str]:
    """`models:/spinn/3` -> ('spinn', '3'); anything else is refused."""
    name, _, version = uri.removeprefix("models:/").rpartition("/")
    if not uri.startswith("models:/") or not name or not version.isdigit():
        raise SpinnError(f"{uri}: name a registered version, e.g. models:/spinn/3 or models:/spinn@champion")
    return name, version
