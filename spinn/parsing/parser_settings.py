"""How Stanza runs and where its parses are cached (`ParserSettings`), and the autos decided for this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from spinn.data.limits import TEXT_MAX_TOKENS, MaxTokens
from spinn.ground import cores
from spinn.ground.errors import SpinnError
from spinn.ground.settings import AUTO, Device, Settings, ThreadNumber, count_or_auto, env_default

DEFAULT_CACHE_PATH = Path("data/parse_cache/parses.sqlite")
RESOURCES_FILE = "resources.json"  # what makes a folder a stanza_resources folder
CPU_BATCH_SIZE = 256
"""Parse batch auto on the CPU: the size hardly matters there, and smaller batches balance workers (README's
label section measures both)."""
GPU_BATCH_SIZE = 1024
"""Parse batch auto on the GPU: larger batches keep it busier."""
TOKENIZERS_BESIDE_A_GPU = 2
"""Tokenizer processes auto starts beside a model on a GPU: one tokenizes a shard in about half the time the
model takes to label it (on an H200), the second is margin for a busier host."""

TOKENIZER_SPINN, TOKENIZER_STANZA = "spinn", "stanza"
PRETOKENIZED = "pretokenized"
Tokenizer = Literal["spinn", "stanza"]

WorkerCount = count_or_auto("processes")
SentenceCount = count_or_auto("sentences")


class ParserSettings(Settings):
    """How Stanza runs, and where its parses are cached."""

    stanza_dir: Path | None = Field(
        default_factory=env_default("SPINN_STANZA_DIR"),
        validate_default=True,
        json_schema_extra={"cli": "--stanza-dir"},
    )
    """A local stanza_resources folder, used offline (default: Stanza's own models under
    STANZA_RESOURCES_DIR, downloaded when missing)."""
    language: str = Field("en", json_schema_extra={"cli": "--parser-language"})
    """Stanza's language code."""
    batch_size: SentenceCount = Field(AUTO, json_schema_extra={"cli": "--parse-batch-size"})
    """Sentences per Stanza batch; auto: 256 on the CPU (no size was faster there), 1024 on the GPU."""
    device: Device = Field("auto", json_schema_extra={"cli": "--parser-device"})
    """Where Stanza runs; auto: the GPU when there is one."""
    max_tokens: MaxTokens = Field(TEXT_MAX_TOKENS, json_schema_extra={"cli": "--max-tokens"})
    """Longer sentences are rejected (too_long); memory grows with it (spinn/data/limits.py)."""
    cache_path: Path | None = Field(DEFAULT_CACHE_PATH, json_schema_extra={"cli": "--parse-cache"})
    """Parses cached by sentence and parser model (none: no cache; the CLI's --no-parse-cache)."""
    workers: WorkerCount = Field(AUTO, json_schema_extra={"cli": "--workers"})
    """Parser processes: 1 parses in this process; more start that many worker processes (trees do not depend
    on it); auto: one per core this process may use when Stanza runs on the CPU, 1 on the GPU. Without Stanza
    (a model that builds its own trees) they tokenize; auto: 1 beside a model on the CPU, 2 beside a GPU."""
    threads: ThreadNumber = Field(1, json_schema_extra={"cli": "--parser-threads"})
    """torch threads per parser process: Stanza's small models gain nothing from more, and lose much when
    processes share cores."""
    tokenizer: Tokenizer = Field(TOKENIZER_SPINN, json_schema_extra={"cli": "--tokenizer"})
    """Who cuts raw text into words: spinn (SNLI's conventions, spinn.trees.tokenize, so `t-shirt` stays one
    word the model knows; Stanza gets the tokens pretokenized) or stanza (Stanza's own tokenizer, which splits
    `t - shirt`)."""
    pretokenized: bool = Field(False, json_schema_extra={"cli": "--pretokenized/--raw-text"})
    """The sentences are already tokenized, tokens separated by spaces: they are split on spaces only and no
    tokenizer runs. Leave off for raw text, which the tokenizer cuts."""


DEFAULT_SETTINGS = ParserSettings()


def tokenization(settings: ParserSettings) -> str:
    """How text becomes words: pretokenized (split on spaces), spinn or stanza; part of the parse cache's key,
    since each may cut the same sentence differently."""
    return PRETOKENIZED if settings.pretokenized else settings.tokenizer


def check_settings(settings: ParserSettings) -> None:
    """A Stanza folder given must be one: said before anything loads."""
    folder = settings.stanza_dir
    if folder is not None and not Path(folder).is_dir():
        raise SpinnError(f"Stanza model folder {folder} does not exist")
    if folder is not None and not (Path(folder) / RESOURCES_FILE).is_file():
        raise SpinnError(f"Stanza model folder {folder} has no {RESOURCES_FILE}: not a stanza_resources folder")


def decided(settings: ParserSettings) -> ParserSettings:
    """The settings with every auto decided for this machine: what a parser with them runs."""
    return decided_for(settings, resolve_gpu(settings.device))


def decided_for(settings: ParserSettings, use_gpu: bool) -> ParserSettings:
    """The autos decided for Stanza on the GPU (use_gpu) or on the CPU."""
    batch_size = settings.batch_size
    if batch_size == AUTO:
        batch_size = GPU_BATCH_SIZE if use_gpu else CPU_BATCH_SIZE
    return settings.replace(workers=resolve_workers(settings.workers, use_gpu), batch_size=batch_size)


def resolve_workers(workers: int | str, use_gpu: bool) -> int:
    """auto: one process per core this process may use on the CPU; one on the GPU, which a single Stanza
    process already shares with the model."""
    if workers != AUTO:
        return int(workers)
    if use_gpu:
        return 1
    return cores.process_count(AUTO)


def resolve_tokenizers(workers: int | str, model_on_gpu: bool) -> int:
    """Tokenizer processes for a model that builds its own trees; auto: this process beside a model on the CPU
    (its torch threads take every core, and tokenizing here costs the same CPU without sharing them), else
    TOKENIZERS_BESIDE_A_GPU where the cores allow (a GPU model's host process keeps about one core busy)."""
    if workers != AUTO:
        return int(workers)
    if model_on_gpu and cores.process_count(AUTO) > TOKENIZERS_BESIDE_A_GPU:
        return TOKENIZERS_BESIDE_A_GPU
    return 1


def resolve_gpu(device: str) -> bool:
    """True when Stanza should run on CUDA: asked for, or `auto` with a GPU present."""
    import torch

    if device == "cpu":  # asks nothing of CUDA: a worker forked from a process that uses the GPU must not
        return False
    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise SpinnError("device 'cuda' was requested but torch sees no CUDA GPU; use device 'cpu' or 'auto'")
    return available and device != "cpu"
