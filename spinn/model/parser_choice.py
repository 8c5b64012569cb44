"""Whose trees a model reads when it labels or is evaluated: a parser's, or its own. The one rule of `auto`.

Labelling (`--parser auto|stanza|model`), the registered model, the logged
model's parser settings, evaluation's `--transitions auto` and the benchmark's
inference all ask the question here, so they cannot answer it differently.
"""

from __future__ import annotations

from typing import Literal

from spinn.ground.errors import SpinnError
from spinn.model.config import SPINNConfig, TransitionSource

PARSER_STANZA = "stanza"
PARSER_MODEL = "model"
PARSER_AUTO = "auto"
ParserChoice = Literal["auto", "stanza", "model"]
"""`--parser`: auto, a parser's trees (Stanza) or the model's own."""


def resolve_parser(parser: str, config: SPINNConfig) -> str:
    """`auto`: a model that predicts its own transitions (spinn, rl) builds its own trees, so no parser loads
    (SPINN's point: its tracker parses); pi and pi-nt were trained on parses and need Stanza's."""
    if parser == PARSER_MODEL and not config.predicts_transitions:
        raise SpinnError(
            f"parser model needs a model that predicts its own transitions (spinn, rl); this one is {config.variant}"
        )
    if parser == PARSER_AUTO:
        return PARSER_MODEL if config.predicts_transitions else PARSER_STANZA
    return parser


def needs_parser(config: SPINNConfig) -> bool:
    """Whether `auto` loads a parser for this model (its logged model then records the parser settings)."""
    return resolve_parser(PARSER_AUTO, config) == PARSER_STANZA


def trees_source(parser: str) -> TransitionSource:
    """The transitions a resolved parser gives the model: its own best ones for `model`, the parse's else."""
    return TransitionSource.GREEDY if parser == PARSER_MODEL else TransitionSource.GOLD


def auto_source(config: SPINNConfig) -> TransitionSource:
    """The transitions `auto` runs the model on."""
    return trees_source(resolve_parser(PARSER_AUTO, config))
