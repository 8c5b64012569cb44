"""Stanza in one process: which model files load, their hash, the pipeline, and batches parsed with it.

The one module that imports Stanza. Stanza (and torch behind it) is slow to
import, so it is imported only inside the functions that need it. A pipeline
loads exactly the files that were hashed into the parser's model id, never
goes online (`download_method=None`), and keeps each text one sentence.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spinn.data.rejects import RejectReason
from spinn.ground.collector import gc_frozen
from spinn.ground.cores import torch_threads
from spinn.ground.errors import SpinnError
from spinn.ground.io import file_digest
from spinn.parsing.convert import OUTPUT_VERSION, outcome
from spinn.parsing.parser_settings import (
    RESOURCES_FILE,
    TOKENIZER_SPINN,
    TOKENIZER_STANZA,
    ParserSettings,
    tokenization,
)
from spinn.parsing.protocol import Parsed, Unparsed
from spinn.trees.tokenize import tokenize

STANZA_PROCESSORS = "tokenize,pos,constituency"
MODEL_PATH_SUFFIX = "_path"  # Stanza config keys naming model files: pos_model_path, pos_pretrain_path, ...
STANZA_LOG_LEVEL = "ERROR"  # Stanza logs every model it loads at INFO


@dataclass(frozen=True)
class Models:
    folder: Path  # a stanza_resources folder
    files: dict[str, Path]  # Stanza config key (pos_model_path, pos_pretrain_path, ...) -> model file


class StanzaRunner:
    """One process's Stanza: resolves the models and loads the pipeline on first use, parses batches, and turns
    any failure into an `Unparsed` for the sentence that caused it."""

    def __init__(self, settings: ParserSettings, use_gpu: bool, pipeline: Any = None) -> None:
        self.settings, self.use_gpu = settings, use_gpu
        self.pipeline = pipeline  # loaded on first use, or given loaded (a forked worker's, a test's)
        self._models: Models | None = None
        self._model_id: str | None = None

    def models(self) -> Models:
        """The model files the pipeline loads (downloaded first when no local folder was given)."""
        if self._models is None:
            self._models = resolve_models(self.settings)
        return self._models

    @property
    def model_id(self) -> str:
        """sha256 over Stanza's version, the tokenization and the bytes of every model file the pipeline loads."""
        if self._model_id is None:
            self._model_id = model_id(self.models().files, tokenization(self.settings))
        return self._model_id

    def loaded(self) -> Any:
        """The pipeline, loaded now if it was not."""
        if self.pipeline is None:
            # the parser's threads while loading: no larger thread pool for forked workers to inherit
            with torch_threads(self.settings.threads, where="parse"):
                self.pipeline = build_pipeline(self.settings, self.models(), self.use_gpu)
        return self.pipeline

    def parse_batch(self, texts: list[str]) -> tuple[dict[str, Parsed | Unparsed], float]:
        """(outcome by text, seconds Stanza ran). Texts are parsed together; if Stanza fails on the batch, one
        by one, to isolate the culprit."""
        started = time.perf_counter()
        try:
            documents = self._run(texts)
        except Exception:  # noqa: BLE001 - any Stanza failure: find out which sentence caused it
            outcomes = {text: self._parse_one(text) for text in texts}
        else:
            outcomes = {text: outcome(document.sentences) for text, document in zip(texts, documents, strict=True)}
        return outcomes, time.perf_counter() - started

    def _parse_one(self, text: str) -> Parsed | Unparsed:
        try:
            (document,) = self._run([text])
        except Exception as error:  # noqa: BLE001 - a sentence Stanza cannot parse is rejected, not fatal
            return Unparsed(RejectReason.PARSE_FAILED, f"Stanza failed: {describe(error)}")
        return outcome(document.sentences)

    def _run(self, texts: list[str]) -> list[Any]:
        """Stanza's documents for the texts; in inference mode, which spares torch's autograd bookkeeping on each
        of the parser's many small ops (Stanza's own no_grad keeps some), with the same numbers."""
        import torch

        pipeline = self.loaded()
        words = [stanza_text(text, self.settings) for text in texts]
        with torch_threads(self.settings.threads, where="parse"), torch.inference_mode(), gc_frozen():
            return pipeline.bulk_process(words)  # pretokenized: each text's tokens split on spaces


def stanza_text(text: str, settings: ParserSettings) -> str:
    """What Stanza is given for a text: with the spinn tokenizer, SNLI's tokens space-joined (one token, one word:
    no token holds a space), so Stanza's trees have the leaves a model trained on SNLI knows."""
    return " ".join(tokenize(text)) if tokenization(settings) == TOKENIZER_SPINN else text


def stanza_tokenizes(settings: ParserSettings) -> bool:
    """True when Stanza's own tokenizer cuts the text (it may then split words into multi-word tokens)."""
    return tokenization(settings) == TOKENIZER_STANZA


def resolve_models(settings: ParserSettings) -> Models:
    """The model files the pipeline will load, as Stanza itself resolves them.

    Offline (stanza_dir given), a missing file is a SpinnError; otherwise Stanza
    downloads what is missing into its default folder first.
    """
    from stanza.resources.common import DEFAULT_MODEL_DIR

    folder = Path(settings.stanza_dir or DEFAULT_MODEL_DIR)
    files = (
        _stanza_model_files(folder, settings.language, not stanza_tokenizes(settings))
        if (folder / RESOURCES_FILE).is_file()
        else {}
    )
    missing = sorted({str(path.relative_to(folder)) for path in files.values() if not path.is_file()})
    if files and not missing:
        return Models(folder, files)
    if settings.stanza_dir is not None:
        raise SpinnError(f"Stanza model folder {folder} lacks {', '.join(missing) or STANZA_PROCESSORS + ' models'}")
    _download_models(folder, settings.language)
    return Models(folder, _stanza_model_files(folder, settings.language, not stanza_tokenizes(settings)))


def _stanza_model_files(folder: Path, language: str, pretokenized: bool) -> dict[str, Path]:
    """Ask Stanza's own resolver which files a tokenize,pos,constituency pipeline loads from folder
    (pretokenized text needs no multi-word token model, so Stanza loads none)."""
    from stanza.pipeline.core import build_default_config
    from stanza.resources.common import (
        add_dependencies,
        load_resources_json,
        logging_level_context,
        maintain_processor_list,
        process_pipeline_parameters,
    )

    resources = load_resources_json(str(folder))
    if language not in resources:
        raise SpinnError(f"Stanza model folder {folder} has no models for language {language!r}")
    with logging_level_context(STANZA_LOG_LEVEL, None):
        lang, _, package, processors = process_pipeline_parameters(language, str(folder), "default", STANZA_PROCESSORS)
        processor_list = maintain_processor_list(resources, lang, package, processors, maybe_add_mwt=not pretokenized)
        load_list = add_dependencies(resources, lang, processor_list)
    config = build_default_config(resources, lang, str(folder), load_list)
    return {key: Path(value) for key, value in config.items() if key.endswith(MODEL_PATH_SUFFIX)}


def _download_models(folder: Path, language: str) -> None:
    import stanza

    try:
        stanza.download(
            language,
            model_dir=str(folder),
            processors=STANZA_PROCESSORS,
            logging_level=STANZA_LOG_LEVEL,
            download_json=not (folder / RESOURCES_FILE).is_file(),
        )
    except Exception as error:
        raise SpinnError(
            f"could not download Stanza's {language!r} models into {folder} ({describe(error)}); "
            "give a local stanza_resources folder (stanza_dir) to run offline"
        ) from error


def model_id(files: dict[str, Path], tokenized_by: str) -> str:
    """Each tokenization (stanza, spinn, pretokenized) may cut a sentence differently: their parses never mix."""
    import stanza

    digest = hashlib.sha256(f"stanza {stanza.__version__}\0{OUTPUT_VERSION}".encode())
    if tokenized_by != TOKENIZER_STANZA:  # Stanza's own tokens keep the key they always had
        digest.update(f"\0{tokenized_by}".encode())
    for key, path in sorted(files.items()):
        digest.update(f"\0{key}\0{file_digest(path)}".encode())
    return digest.hexdigest()


def build_pipeline(settings: ParserSettings, models: Models, use_gpu: bool) -> Any:
    """A pipeline that loads exactly the hashed files, never goes online, and keeps each text one sentence."""
    import stanza

    model_paths = {key: str(path) for key, path in models.files.items()}
    return stanza.Pipeline(
        settings.language,
        dir=str(models.folder),
        processors=STANZA_PROCESSORS,
        download_method=None,
        use_gpu=use_gpu,
        logging_level=STANZA_LOG_LEVEL,
        tokenize_no_ssplit=True,
        tokenize_pretokenized=not stanza_tokenizes(settings),
        tokenize_batch_size=settings.batch_size,
        pos_batch_size=settings.batch_size,
        constituency_batch_size=settings.batch_size,
        **model_paths,
    )


def describe(error: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
