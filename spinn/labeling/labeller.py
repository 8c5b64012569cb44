"""The labeller: a trained model and the parser that feeds it, loaded once per process.

The parser is Stanza for models that need parses (pi, pi-nt, or when asked), or
tokens only for a model that builds its own trees (spinn, rl; greedy: its
tracker's best legal action). Stanza is imported only when it is the parser. The
labeller's inference step is kept for the whole run, so the CUDA graphs it
captures on a GPU serve every shard.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from spinn.cores import decide
from spinn.errors import SpinnError
from spinn.inference.step import InferStep
from spinn.io import file_digest
from spinn.labeling.settings import PARSER_AUTO, PARSER_MODEL, PARSER_STANZA, LabelSettings
from spinn.model.config import TransitionSource
from spinn.model.loading import LoadedModel, load_model, resolve_device
from spinn.parsing.parse import TokenOnly
from spinn.parsing.parser import SentenceParser
from spinn.parsing.protocol import Parser


class Labeller:
    """A loaded model and its parser: built once per process and shared by the shards it labels."""

    def __init__(self, model_reference: str | Path, settings: LabelSettings) -> None:
        from spinn.tracking import store as tracking

        self.settings = settings
        self.is_registered = tracking.is_model_uri(str(model_reference))
        # An alias is resolved once, first: the version loaded is the version every output row names.
        reference = str(model_reference)
        self.reference = tracking.resolve_model_uri(reference) if self.is_registered else reference
        self.loaded: LoadedModel = load_model(self.reference, resolve_device(settings.device))
        self.parser_name = resolve_parser(settings.parser, self.loaded)
        self.source = TransitionSource.GREEDY if self.parser_name == PARSER_MODEL else TransitionSource.GOLD
        self.step = InferStep(self.loaded.model, self.source, int8=settings.int8)
        self.parser: Parser = (
            SentenceParser(settings.parsing)
            if self.parser_name == PARSER_STANZA
            else TokenOnly(settings.parsing.max_tokens)
        )
        # Parser worker processes parse the next shard while the model labels this one: they share the cores.
        self.sharing = 1 + (self.parser.workers if self.parser.workers > 1 else 0)
        # the model's torch threads as the run starts (auto follows the free cores as it runs: spinn/cores.py)
        self.threads = decide(settings.threads, self.sharing).threads

    @cached_property
    def checkpoint_sha256(self) -> str:
        return file_digest(self.loaded.checkpoint, "sha256")

    @cached_property
    def model_name(self) -> str:
        """`models:/spinn/3` for a registry URI (the alias resolved), else the checkpoint and its digest."""
        return self.reference if self.is_registered else f"{self.reference} (sha256 {self.checkpoint_sha256[:12]})"

    def fingerprint(self) -> dict:
        return {
            "checkpoint_sha256": self.checkpoint_sha256,
            "parser": self.parser_name,
            "parser_model": self.parser.model_id,
            "max_tokens": self.settings.parsing.max_tokens,
            "int8": self.settings.int8,
        }

    def close(self) -> None:
        self.parser.close()


def resolve_parser(parser: str, loaded: LoadedModel) -> str:
    """`auto`: a model that predicts its own transitions (spinn, rl) builds its own trees, so no parser loads
    (SPINN's point: its tracker parses); pi and pi-nt were trained on parses and need Stanza's."""
    config = loaded.model.config
    if parser == PARSER_MODEL and not config.predicts_transitions:
        raise SpinnError(
            f"parser model needs a model that predicts its own transitions (spinn, rl); this one is {config.variant}"
        )
    if parser == PARSER_AUTO:
        return PARSER_MODEL if config.predicts_transitions else PARSER_STANZA
    return parser
