"""`SentenceParser`: raw sentences to binary trees with Stanza, each distinct text parsed once, maybe in workers.

New corpora arrive as plain text, so their trees come from Stanza's
constituency parser, then go through `spinn.trees.binarize` like SNLI's own
trees. Parsing is the slow step of the pipeline, and NLI data repeats itself
(each premise has several hypotheses), so the parser:

- parses each distinct text once per call, in batches (Stanza is far faster on
  many sentences at once);
- keeps every parse in the parse cache (spinn.parsing.cache), so reruns,
  overlapping corpora and parallel workers parse nothing twice;
- turns every failure into an `Unparsed` with a reject reason, so one bad
  sentence never stops the others;
- runs Stanza (spinn.parsing.stanza_pipeline) with few torch threads, in this
  process or in `workers` worker processes (spinn.parsing.workers) that parse
  batches of length-sorted sentences in parallel, while the caller goes on
  (`submit`).

Batches are cut from the length-sorted distinct texts before they are handed
out, so which sentences share a batch never depends on the number of workers;
the longest go out first, so no worker is left with a long batch at the end
while the others idle.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from spinn.data.rejects import RejectReason
from spinn.parsing.cache import ParseCache
from spinn.parsing.parser_settings import (
    DEFAULT_SETTINGS,
    TOKENIZER_SPINN,
    ParserSettings,
    check_settings,
    decided_for,
    resolve_gpu,
    tokenization,
)
from spinn.parsing.protocol import BatchClock, Parsed, Progress, Unparsed, told
from spinn.parsing.stanza_pipeline import StanzaRunner
from spinn.parsing.workers import can_fork, parse_in_worker, start_pool
from spinn.trees.tokenize import tokenize

SCRATCH_CACHE = "parses.sqlite"  # the temporary cache's file when no cache path is set


@dataclass
class ParseStats:
    """Running totals over all `parse` calls; counts are of input texts, except `parsed`,
    which counts the (stripped) texts Stanza actually ran."""

    requested: int = 0
    distinct: int = 0
    cache_hits: int = 0
    parsed: int = 0
    rejected: int = 0
    parse_seconds: float = 0.0


class PendingParses(BatchClock):
    """The parses of one `submit` call: `result()` waits for the batches still running in workers."""

    def __init__(self, parser: SentenceParser, texts: list[str], keys: list[str]) -> None:
        super().__init__()
        self._parser, self._texts, self._keys = parser, texts, keys
        self._early: dict[str, Parsed | Unparsed] = {}
        self._keys_by_text: dict[str, list[str]] = {}
        self._outcomes: dict[str, Parsed | Unparsed] = {}
        self._futures: dict[str, Future] = {}  # text -> the future of its batch (this call's or an earlier one's)
        self.to_parse = 0
        """Distinct texts this call gives to Stanza (not cached, not already in flight)."""

    def result(self) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order."""
        return self._parser._finish(self)


class SentenceParser:
    """Parses raw sentences into binary trees; Stanza loads on the first text the cache lacks.

    Without a cache (cache_path None) a temporary one lives as long as the parser, so
    a sentence is still parsed once however many shards or calls it appears in."""

    def __init__(self, settings: ParserSettings = DEFAULT_SETTINGS) -> None:
        check_settings(settings)
        self.stats = ParseStats()
        use_gpu = resolve_gpu(settings.device)
        self.settings = decided_for(settings, use_gpu)
        self._stanza = StanzaRunner(self.settings, use_gpu)
        self._cache: ParseCache | None = None
        self._scratch: Path | None = None  # the temporary cache's folder when cache_path is None
        self._pool: ProcessPoolExecutor | None = None
        self._in_flight: dict[str, Future] = {}

    @property
    def workers(self) -> int:
        """Parser processes this parser uses (auto decided)."""
        return int(self.settings.workers)

    @property
    def model_id(self) -> str:
        """sha256 over Stanza's version, the tokenization and the bytes of every model file the pipeline loads."""
        return self._stanza.model_id

    def parse(self, sentences: Iterable[str]) -> dict[str, Parsed | Unparsed]:
        """One result per distinct input text, keyed by that exact text, in input order."""
        return self.submit(sentences).result()

    def submit(self, sentences: Iterable[str], progress: Progress | None = None) -> PendingParses:
        """Start parsing what the cache lacks and return at once when workers parse (else when done).

        A text already in flight for an earlier call waits for that call's batch: never parsed twice."""
        texts = list(sentences)
        pending = PendingParses(self, texts, list(dict.fromkeys(texts)))
        pending._early, pending._keys_by_text = _precheck_all(pending._keys, self.settings)
        wanted = list(pending._keys_by_text)
        pending._outcomes = self._cached(wanted)
        self.stats.cache_hits += sum(len(pending._keys_by_text[text]) for text in pending._outcomes)
        waiting = [text for text in wanted if text not in pending._outcomes]
        pending._futures = {text: self._in_flight[text] for text in waiting if text in self._in_flight}
        missing = [text for text in waiting if text not in pending._futures]
        pending.to_parse = len(missing)
        if missing:
            self._loaded_models()  # before any try: a missing model is an error, not a rejected sentence
        for batch in _batches(missing, int(self.settings.batch_size)):
            if self.workers > 1:
                self._hand_out(batch, pending, progress)
            else:
                outcomes, seconds = self._stanza.parse_batch(batch)
                self.stats.parse_seconds += seconds
                self._keep(outcomes)
                pending._outcomes.update(outcomes)
                if progress is not None:
                    progress(len(batch))
        self.stats.parsed += len(missing)
        pending._done()
        for future in dict.fromkeys(pending._futures.values()):
            future.add_done_callback(pending._done)
        return pending

    def _hand_out(self, batch: list[str], pending: PendingParses, progress: Progress | None) -> None:
        """Give one batch to the workers; its texts are in flight until a `result()` keeps them."""
        future = self._worker_pool().submit(parse_in_worker, batch)
        pending._futures.update(dict.fromkeys(batch, future))
        self._in_flight.update(dict.fromkeys(batch, future))
        if progress is not None:
            future.add_done_callback(told(progress, len(batch)))

    def _finish(self, pending: PendingParses) -> dict[str, Parsed | Unparsed]:
        outcomes = pending._outcomes
        for future in dict.fromkeys(pending._futures.values()):
            parsed, seconds = future.result()
            if any(self._in_flight.get(text) is future for text in parsed):  # not yet kept by an earlier call
                self._keep(parsed)
                self.stats.parse_seconds += seconds
                for text in parsed:
                    self._in_flight.pop(text, None)
            outcomes.update({text: parsed[text] for text in parsed if text in pending._keys_by_text})
        results = dict(pending._early)
        for text, text_keys in pending._keys_by_text.items():
            results.update(dict.fromkeys(text_keys, _within_limit(outcomes[text], self.settings.max_tokens)))
        self.stats.requested += len(pending._texts)
        self.stats.distinct += len(pending._keys)
        self.stats.rejected += sum(isinstance(result, Unparsed) for result in results.values())
        return {key: results[key] for key in pending._keys}

    def close(self) -> None:
        """Stop the workers and close the cache connection (a later `parse` reopens both)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            self._in_flight.clear()
        if self._cache is not None:
            self._cache.close()
            self._cache = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open_cache(self) -> ParseCache:
        if self._cache is None:
            if self.settings.cache_path is not None:
                path = Path(self.settings.cache_path)
            else:
                self._scratch = Path(tempfile.mkdtemp(prefix="spinn-parses-"))
                path = self._scratch / SCRATCH_CACHE
            self._cache = ParseCache(path)
        return self._cache

    def _cached(self, texts: list[str]) -> dict[str, Parsed | Unparsed]:
        """The parses the cache already holds for this model."""
        return dict(self._open_cache().get(self.model_id, texts)) if texts else {}

    def _keep(self, outcomes: dict[str, Parsed | Unparsed]) -> None:
        """Cache a batch's parses in one transaction (failures are not cached: a rerun tries them again)."""
        self._open_cache().put(self.model_id, {text: out for text, out in outcomes.items() if isinstance(out, Parsed)})

    def _loaded_models(self) -> None:
        """Stanza ready to parse: here, or in every worker (started now)."""
        if self.workers > 1:
            self._worker_pool()
        else:
            self._stanza.loaded()

    def _worker_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._stanza.models()  # a missing model is one clear error here, not one per worker (downloads once)
            pipeline = self._stanza.loaded() if can_fork(self._stanza.use_gpu) else None
            self._pool = start_pool(self.settings, pipeline)
        return self._pool


def _precheck_all(
    keys: list[str], settings: ParserSettings
) -> tuple[dict[str, Parsed | Unparsed], dict[str, list[str]]]:
    """(early rejections by input text, input texts to parse by their stripped text)."""
    rejections: dict[str, Parsed | Unparsed] = {}
    keys_by_text: dict[str, list[str]] = {}
    count = _token_counter(settings)
    for key in keys:
        rejection = _precheck(key.strip(), settings.max_tokens, count)
        if rejection is None:
            keys_by_text.setdefault(key.strip(), []).append(key)
        else:
            rejections[key] = rejection
    return rejections, keys_by_text


def _token_counter(settings: ParserSettings) -> Callable[[str], int]:
    """Tokens a text will have, known before Stanza runs: exactly with the spinn tokenizer or pretokenized text;
    with Stanza's tokenizer its words, a lower bound (the limit is applied again to Stanza's tokens)."""
    if tokenization(settings) == TOKENIZER_SPINN:
        return lambda text: len(tokenize(text))
    return lambda text: len(text.split())


def _precheck(text: str, max_tokens: int, count: Callable[[str], int]) -> Unparsed | None:
    """Reject what needs no parser: empty text (or no tokens), or more tokens than the limit."""
    tokens = count(text) if text else 0
    if not tokens:
        return Unparsed(RejectReason.EMPTY_SENTENCE, "empty sentence")
    if tokens > max_tokens:
        return Unparsed(RejectReason.TOO_LONG, f"{tokens} tokens, more than the limit of {max_tokens}")
    return None


def _within_limit(outcome: Parsed | Unparsed, max_tokens: int) -> Parsed | Unparsed:
    """Apply the token limit to the parse's tokens (Stanza's own tokenizer splits punctuation off words)."""
    if isinstance(outcome, Parsed) and len(outcome.tokens) > max_tokens:
        return Unparsed(RejectReason.TOO_LONG, f"{len(outcome.tokens)} tokens, more than the limit of {max_tokens}")
    return outcome


def _batches(texts: list[str], size: int) -> list[list[str]]:
    """Batches of the texts sorted by length (less padding in Stanza), cut the same way for any worker count;
    longest first, so the long batches are not the last ones left while other workers idle."""
    ordered = sorted(texts, key=lambda text: (len(text), text))
    return [ordered[start : start + size] for start in range(0, len(ordered), size)][::-1]
