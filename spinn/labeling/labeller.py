"""The labeller: a trained model and the parser that feeds it, loaded once per process; and the model source,
which says which model a run labels with before anything loads.

`ModelSource` resolves a registry alias once (the version every output row
names), finds the checkpoint, digests it and reads its configs without its
weights: enough for a run's fingerprint, so a finished job answers before a
model loads. `Labeller` then loads the model and its parser: Stanza for
models that need parses (pi, pi-nt, or when asked), or tokens only for a
model that builds its own trees (spinn, rl; greedy: its tracker's best legal
action). Stanza is imported only when it is the parser. The labeller's
inference step is kept for its life, so the CUDA graphs it captures on a GPU
serve every shard.

A Dask worker labels many shards, of many files: `worker_labeller` keeps one
labeller per model and labeller settings in the worker's process.
"""

from __future__ import annotations

import tempfile
import threading
from functools import cached_property
from pathlib import Path

import torch

from spinn.ground.cores import decide
from spinn.ground.io import file_digest
from spinn.ground.paths import refuse_special_file
from spinn.inference.infer_step import InferStep
from spinn.labeling.label_settings import LabelSettings
from spinn.model.checkpoint import Checkpoint, load_checkpoint
from spinn.model.config import SPINNConfig
from spinn.model.loading import LoadedModel, load_model, resolve_device
from spinn.model.parser_choice import PARSER_STANZA, resolve_parser, trees_source
from spinn.model.precision import check_int8
from spinn.parsing.parse import TREES_NONE, TokenOnly
from spinn.parsing.parser import SentenceParser
from spinn.parsing.parser_settings import resolve_tokenizers
from spinn.parsing.protocol import Parser


class ModelSource:
    """A model reference resolved: a checkpoint path, or a registry URI with its alias resolved to a version.

    Pickled (to a Dask worker) it keeps only the reference: each process fetches its own checkpoint."""

    def __init__(self, model_reference: str | Path) -> None:
        from spinn.tracking import store as tracking

        reference = str(model_reference)
        self.is_registered = tracking.is_model_uri(reference)
        self.reference = tracking.resolve_model_uri(reference) if self.is_registered else reference

    def __getstate__(self) -> dict:
        return {"reference": self.reference, "is_registered": self.is_registered}

    @cached_property
    def checkpoint(self) -> Path:
        """The checkpoint file (a registered model's, downloaded once)."""
        if not self.is_registered:
            return refuse_special_file(Path(self.reference))  # torch would block reading a named pipe
        from spinn.tracking.logged_models import download_checkpoint

        return download_checkpoint(self.reference, Path(tempfile.mkdtemp(prefix="spinn-model-")))

    @cached_property
    def checkpoint_sha256(self) -> str:
        return file_digest(self.checkpoint, "sha256")

    @cached_property
    def saved(self) -> Checkpoint:
        """What the checkpoint holds, its weights left on disk (mapped, not read): configs and dev scores."""
        try:
            contents = torch.load(self.checkpoint, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # a file torch cannot map (an old format): the ordinary load, which names what is wrong
            return load_checkpoint(self.checkpoint)
        return Checkpoint.from_dict(contents, self.checkpoint)

    @cached_property
    def config(self) -> SPINNConfig:
        return SPINNConfig.from_dict(self.saved.model_config)

    @cached_property
    def model_name(self) -> str:
        """`models:/spinn/3` for a registry URI (the alias resolved), else the checkpoint and its digest."""
        return self.reference if self.is_registered else f"{self.reference} (sha256 {self.checkpoint_sha256[:12]})"

    def check(self, settings: LabelSettings) -> None:
        """Refuse what `settings` ask of this model that it cannot run: a parser it has no use for, int8 on a
        loop without int8 GEMMs."""
        self.parser_name(settings)
        if settings.int8:
            check_int8(config=self.config)

    def parser_name(self, settings: LabelSettings) -> str:
        return resolve_parser(settings.parser, self.config)

    def fingerprint(self, settings: LabelSettings) -> dict:
        """What of the model and its parser makes two runs' labels differ (part of a run's fingerprint)."""
        parser = self.parser_name(settings)
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "parser": parser,
            "parser_model": _parser_model(parser, settings),
            "max_tokens": settings.parsing.max_tokens,
            "int8": settings.int8,
        }


def _parser_model(parser: str, settings: LabelSettings) -> str:
    """The Stanza models' digest when Stanza parses (no Stanza loads for it), else TokenOnly's none."""
    if parser != PARSER_STANZA:
        return TREES_NONE
    stanza = SentenceParser(settings.parsing)
    try:
        return stanza.model_id
    finally:
        stanza.close()


class Labeller:
    """A loaded model and its parser: built once per process and shared by the shards it labels."""

    def __init__(self, source: ModelSource, settings: LabelSettings) -> None:
        self.settings = settings
        self.model_source = source
        device = resolve_device(settings.device)
        self.loaded: LoadedModel = load_model(source.checkpoint, device)
        self.parser_name = resolve_parser(settings.parser, self.loaded.model.config)
        self.transitions = trees_source(self.parser_name)
        self.step = InferStep(self.loaded.model, self.transitions, int8=settings.int8)
        self.parser: Parser = (
            SentenceParser(settings.parsing)
            if self.parser_name == PARSER_STANZA
            else TokenOnly(
                settings.parsing.max_tokens,
                resolve_tokenizers(settings.parsing.workers, device.type == "cuda"),
            )
        )
        # Parser worker processes parse the next shard while the model labels this one: they share the cores.
        self.sharing = 1 + (self.parser.workers if self.parser.workers > 1 else 0)
        # the model's torch threads as the run starts (auto follows the free cores as it runs: spinn/ground/cores.py)
        self.threads = decide(settings.threads, self.sharing).threads

    @property
    def model_name(self) -> str:
        return self.model_source.model_name

    def close(self) -> None:
        self.parser.close()


_WORKER_LABELLERS: dict[tuple[str, str], Labeller] = {}
_WORKER_LABELLERS_LOCK = threading.Lock()


def worker_labeller(source: ModelSource, settings: LabelSettings) -> Labeller:
    """This process's labeller for the model and the settings that shape a labeller, loaded on first use and
    kept: a Dask worker labels every shard it is given with it. The worker parses in its own process (a Dask
    worker is daemonic, so it has no children, and is itself the parallelism)."""
    settings = settings.replace(parsing={"workers": 1})
    shaping = settings.model_dump_json(exclude={"shard_size", "columns", "input_format"})
    key = (source.reference, shaping)
    with _WORKER_LABELLERS_LOCK:
        if key not in _WORKER_LABELLERS:
            _WORKER_LABELLERS[key] = Labeller(source, settings)
        return _WORKER_LABELLERS[key]
