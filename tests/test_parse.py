"""spinn.parsing.parser with a real Stanza pipeline: the small offline SNLI model set in ../shared/stanza.

The pipeline loads once per module (a few seconds); every test parses only a
handful of sentences, each test its own, so the shared disk cache never
answers for another test.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spinn.data.rejects import RejectReason
from spinn.ground.children import WATCHER
from spinn.ground.errors import SpinnError
from spinn.parsing.parser import SentenceParser
from spinn.parsing.parser_settings import ParserSettings
from spinn.parsing.protocol import Parsed, Unparsed
from spinn.parsing.stanza_pipeline import stanza_text
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import Transition, check_transitions, read_binary_parse
from tests.helpers import STANZA_DIR, stanza_dir

pytestmark = pytest.mark.stanza

AGREEMENT_SENTENCES = 30
MIN_BRACKET_F1 = 0.75
MIN_TOKEN_AGREEMENT = 0.9


def _settings(cache: Path | None, **changes) -> ParserSettings:
    return ParserSettings(stanza_dir=stanza_dir(), device="cpu", cache_path=cache, **{"workers": 1, **changes})


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parse-cache") / "nested" / "parses.sqlite"


@pytest.fixture(scope="module")
def parser(cache_path: Path, one_torch_thread: None) -> Iterator[SentenceParser]:
    """One loaded pipeline for the module, caching into a temporary SQLite file."""
    with SentenceParser(_settings(cache_path)) as loaded:
        loaded.parse(["A dog runs."])  # load the pipeline now, so that timings and patches below find it
        yield loaded


def _sharing_pipeline(parser: SentenceParser, settings: ParserSettings) -> SentenceParser:
    """A new parser (own settings, stats and cache) reusing the loaded Stanza models: loading costs seconds."""
    fresh = SentenceParser(settings)
    fresh._stanza.pipeline = parser._stanza.pipeline
    return fresh


def _parsed(result: Parsed | Unparsed) -> Parsed:
    assert isinstance(result, Parsed), result
    return result


def _spans(transitions: list[int]) -> set[tuple[int, int]]:
    """Word spans of a binary tree's constituents of two or more words, the whole sentence excluded."""
    stack: list[tuple[int, int]] = []
    spans = set()
    for transition in transitions:
        if transition == Transition.SHIFT:
            position = stack[-1][1] if stack else 0
            stack.append((position, position + 1))
        else:
            right, left = stack.pop(), stack.pop()
            stack.append((left[0], right[1]))
            spans.add(stack[-1])
    return spans - set(stack)


def _snli_premises(snli_test: Path, count: int) -> dict[str, str]:
    """The first `count` distinct premises of SNLI test, with SNLI's binary parses."""
    premises: dict[str, str] = {}
    with gzip.open(snli_test, "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            premises.setdefault(record["sentence1"], record["sentence1_binary_parse"])
            if len(premises) == count:
                break
    return premises


# ---------------------------------------------------------------------- trees


def test_sentences_become_binary_trees_over_their_words(parser: SentenceParser) -> None:
    sentences = {
        "Two dogs are running through a field.": ["Two", "dogs", "are", "running", "through", "a", "field", "."],
        "A woman in a red coat reads a newspaper on the bus.": [
            "A",
            "woman",
            "in",
            "a",
            "red",
            "coat",
            "reads",
            "a",
            "newspaper",
            "on",
            "the",
            "bus",
            ".",
        ],
        "Children play soccer": ["Children", "play", "soccer"],
    }
    results = parser.parse(sentences)
    assert list(results) == list(sentences)
    for text, words in sentences.items():
        parsed = _parsed(results[text])
        assert parsed.tokens == words
        assert len(parsed.transitions) == 2 * len(words) - 1
        check_transitions(parsed.transitions, len(parsed.tokens))
        assert read_binary_parse(parsed.binary_parse) == (parsed.tokens, parsed.transitions)


def test_brackets_and_quotes_take_penn_treebank_forms(parser: SentenceParser) -> None:
    text = 'A man (in a hat) holds a sign that says "hello" [sic].'
    parsed = _parsed(parser.parse([text])[text])
    assert parsed.tokens == [
        "A",
        "man",
        "-LRB-",
        "in",
        "a",
        "hat",
        "-RRB-",
        "holds",
        "a",
        "sign",
        "that",
        "says",
        "``",
        "hello",
        "''",
        "-LSB-",
        "sic",
        "-RSB-",
        ".",
    ]
    assert "-LRB- in a hat -RRB-" in " ".join(token for token in parsed.binary_parse.split() if token not in "()")


def test_two_sentences_in_one_text_make_one_tree(parser: SentenceParser) -> None:
    text = "A dog barks. The cat sleeps on the mat."
    parsed = _parsed(parser.parse([text])[text])
    assert parsed.tokens == ["A", "dog", "barks", ".", "The", "cat", "sleeps", "on", "the", "mat", "."]
    check_transitions(parsed.transitions, len(parsed.tokens))


def test_trees_agree_with_snli_binary_parses(snli_test, parser: SentenceParser) -> None:
    """The tiny model scores ~91 labelled F1 on n-ary trees; binarized, its trees must look like SNLI's."""
    premises = _snli_premises(snli_test, AGREEMENT_SENTENCES)
    results = parser.parse(premises)
    scores, same_tokens = [], 0
    for text, binary_parse in premises.items():
        ours = _parsed(results[text])
        tokens, transitions = read_binary_parse(binary_parse)
        same_tokens += ours.tokens == tokens
        theirs, mine = _spans(transitions), _spans(ours.transitions)
        if theirs or mine:
            scores.append(2 * len(theirs & mine) / (len(theirs) + len(mine)))
    assert same_tokens / len(premises) >= MIN_TOKEN_AGREEMENT
    assert sum(scores) / len(scores) > MIN_BRACKET_F1


# ---------------------------------------------------------------------- deduplication and cache


def test_repeated_sentences_are_parsed_once(parser: SentenceParser) -> None:
    before = parser.stats.parsed
    results = parser.parse(["A dog runs .", "A dog runs .", "A cat sleeps .", " A cat sleeps . "])
    assert list(results) == ["A dog runs .", "A cat sleeps .", " A cat sleeps . "]
    assert results["A cat sleeps ."] == results[" A cat sleeps . "]
    assert parser.stats.parsed - before == 2


def test_duplicate_counts_in_a_fresh_parser(parser: SentenceParser) -> None:
    fresh = _sharing_pipeline(parser, _settings(None))
    fresh.parse(["A dog runs .", "A dog runs .", "A cat sleeps ."])
    assert (fresh.stats.requested, fresh.stats.distinct, fresh.stats.parsed) == (3, 2, 2)


def test_cache_serves_a_second_parser_and_is_keyed_by_model(parser: SentenceParser, cache_path: Path) -> None:
    texts = ["A boy jumps into a lake.", "Three women sit on a bench.", "A man plays the guitar."]
    first = parser.parse(texts)

    with SentenceParser(_settings(cache_path)) as second:
        again = second.parse(texts)
        assert (second.stats.parsed, second.stats.cache_hits) == (0, len(texts))
        assert second.stats.parse_seconds == 0.0
    assert again == first

    class OtherModel(SentenceParser):
        model_id = "another-parser-model"

    with OtherModel(_settings(cache_path)) as other:
        other._stanza.pipeline = parser._stanza.pipeline  # the same Stanza under another model id: only the key differs
        other.parse(texts)
        assert (other.stats.parsed, other.stats.cache_hits) == (len(texts), 0)


def test_model_id_is_stable_across_processes(parser: SentenceParser) -> None:
    code = (
        "from pathlib import Path; from spinn.parsing.parser import SentenceParser; "
        "from spinn.parsing.parser_settings import ParserSettings; "
        f"print(SentenceParser(ParserSettings(stanza_dir=Path({str(STANZA_DIR)!r}), cache_path=None)).model_id)"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == parser.model_id
    assert len(parser.model_id) == 64


def test_default_models_are_stanzas_resources_dir(parser: SentenceParser) -> None:
    from stanza.resources.common import DEFAULT_MODEL_DIR

    if Path(DEFAULT_MODEL_DIR).resolve() != STANZA_DIR.resolve():
        pytest.skip("STANZA_RESOURCES_DIR does not point at the offline models (tests/conftest.py sets it)")
    assert SentenceParser(ParserSettings(device="cpu", cache_path=None)).model_id == parser.model_id


# ---------------------------------------------------------------------- rejects


def test_empty_and_blank_sentences_are_rejected(parser: SentenceParser) -> None:
    results = parser.parse(["", "   \t"])
    assert {result.reason for result in results.values()} == {RejectReason.EMPTY_SENTENCE}


def test_long_sentences_are_rejected_before_stanza_runs(parser: SentenceParser) -> None:
    limit = parser.settings.max_tokens
    text = " ".join(["dog"] * (limit + 50))
    before = parser.stats.parsed
    result = parser.parse([text, "A long sentence is fine."])[text]
    assert isinstance(result, Unparsed) and result.reason is RejectReason.TOO_LONG
    assert str(limit + 50) in result.message and str(limit) in result.message
    assert parser.stats.parsed - before == 1


def test_stanza_parses_snli_tokens_so_hyphenated_words_stay_whole(parser: SentenceParser, cache_path: Path) -> None:
    text = "A man in a t-shirt (red) isn't sleeping."
    result = _parsed(parser.parse([text])[text])
    assert result.tokens == tokenize(text)  # SNLI's conventions: t-shirt, -LRB-, is n't
    assert "t-shirt" in result.tokens
    assert "mwt_model_path" not in parser._stanza.models().files  # one token, one word: no multi-word tokens
    with SentenceParser(_settings(cache_path, tokenizer="stanza")) as own_tokens:
        assert own_tokens.model_id != parser.model_id  # parses under Stanza's tokens are never reused


def test_token_limit_also_applies_to_stanza_tokens(parser: SentenceParser, cache_path: Path) -> None:
    text = "A dog, a cat."  # 4 words, 6 tokens
    with _sharing_pipeline(parser, _settings(cache_path, max_tokens=5)) as strict:
        result = strict.parse([text])[text]
    assert isinstance(result, Unparsed) and result.reason is RejectReason.TOO_LONG
    assert result.message.startswith("6 tokens")


def test_a_sentence_stanza_fails_on_is_rejected_alone(parser: SentenceParser, monkeypatch: pytest.MonkeyPatch) -> None:
    poison = "The parser chokes on this one."
    pipeline = parser._stanza.pipeline
    original = pipeline.process

    def failing_process(documents, *args, **kwargs):
        if any(document.text == stanza_text(poison, parser.settings) for document in documents):
            raise RuntimeError("CUDA out of memory\nmore detail")
        return original(documents, *args, **kwargs)

    texts = ["A girl rides a horse.", poison, "A chef cooks pasta."]
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "process", failing_process)
        results = parser.parse(texts)
    failed = results[poison]
    assert isinstance(failed, Unparsed) and failed.reason is RejectReason.PARSE_FAILED
    assert failed.message == "Stanza failed: RuntimeError: CUDA out of memory"
    assert all(isinstance(results[text], Parsed) for text in texts if text != poison)
    assert isinstance(parser.parse([poison])[poison], Parsed)  # a failure was not cached


# ---------------------------------------------------------------------- settings


def test_missing_stanza_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-stanza"
    with pytest.raises(SpinnError, match=str(missing)):
        SentenceParser(ParserSettings(stanza_dir=missing, cache_path=None))


def test_missing_model_files_are_named(tmp_path: Path) -> None:
    shutil.copy(stanza_dir() / "resources.json", tmp_path / "resources.json")
    parser = SentenceParser(ParserSettings(stanza_dir=tmp_path, device="cpu", cache_path=None))
    with pytest.raises(SpinnError, match=rf"{tmp_path} lacks .*en/constituency/snli_tiny\.pt"):
        parser.parse(["A dog runs."])


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(SpinnError, match="cuda"):
        SentenceParser(ParserSettings(stanza_dir=STANZA_DIR, device="cuda", cache_path=None))


# ---------------------------------------------------------------------- throughput: threads, batches, workers


def test_without_a_cache_each_sentence_is_parsed_once_per_parser(parser: SentenceParser) -> None:
    """No disk cache: a temporary one lives with the parser, so shards that share sentences parse them once."""
    with _sharing_pipeline(parser, _settings(None)) as fresh:
        fresh.parse(["A horse jumps a fence.", "A bird sings."])
        again = fresh.parse(["A bird sings.", "A fish swims."])
        assert (fresh.stats.parsed, fresh.stats.cache_hits) == (3, 1)
        assert isinstance(again["A bird sings."], Parsed)
    assert fresh._scratch is None  # the temporary cache went with the parser


def test_stanza_runs_on_the_settings_threads_and_the_caller_keeps_its_own(
    parser: SentenceParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    seen = []
    pipeline = parser._stanza.pipeline
    original = pipeline.bulk_process

    def counting(documents, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(documents, *args, **kwargs)

    with _sharing_pipeline(parser, _settings(None, threads=2)) as two, monkeypatch.context() as patch:
        patch.setattr(pipeline, "bulk_process", counting)
        torch.set_num_threads(1)
        two.parse(["A child draws a house."])
        assert seen == [2] and torch.get_num_threads() == 1


def test_batches_are_length_sorted_and_cut_the_same_for_any_worker_count() -> None:
    from spinn.parsing.parser import _batches

    texts = ["a b c d", "a", "a b", "b", "a b c"]
    assert _batches(texts, 2) == [["a b c d"], ["a b", "a b c"], ["a", "b"]]  # the longest go out first
    assert _batches(list(reversed(texts)), 2) == _batches(texts, 2)


def test_pretokenized_text_is_split_on_spaces_only_and_cached_apart(parser: SentenceParser, cache_path: Path) -> None:
    text = "A dog 's ball rolls down-hill ."
    with SentenceParser(_settings(cache_path, pretokenized=True)) as pretokenized:
        result = _parsed(pretokenized.parse([text])[text])
        assert result.tokens == text.split()
        assert pretokenized.model_id != parser.model_id
        assert "mwt_model_path" not in pretokenized._stanza.models().files  # no multi-word tokens to expand


@pytest.mark.slow
def test_spawned_workers_give_the_same_trees_and_parse_each_sentence_once(
    snli_test, parser: SentenceParser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers, batches of two, spawned (as in a Prefect or Dask process, which runs other threads):
    the trees one process gives, and a sentence still in flight for an earlier submit is taken from that
    submit, not parsed again."""
    from spinn.parsing import parser as parser_module

    monkeypatch.setattr(parser_module, "can_fork", lambda use_gpu: False)
    texts = list(_snli_premises(snli_test, 12))
    alone = parser.parse(texts)
    with SentenceParser(_settings(None, workers=2, batch_size=2)) as pool:
        first = pool.submit(texts[:8])
        second = pool.submit(texts[4:])
        together = {**first.result(), **second.result()}
        assert pool.stats.parsed == len(texts) and pool.stats.cache_hits == 0
        assert pool.parse(texts[:3]) == {text: alone[text] for text in texts[:3]}  # now from its cache
        assert pool.stats.parsed == len(texts)
        assert pool._pool is not None and pool._pool._mp_context.get_start_method() == "spawn"
    assert together == alone


FORKED_PARSE = """
import json, os, sys
from spinn.parsing import stanza_pipeline
from spinn.parsing.parser import SentenceParser
from spinn.parsing.parser_settings import ParserSettings
from spinn.parsing.stanza_pipeline import stanza_text

build = stanza_pipeline.build_pipeline
def build_and_log(*args):
    with open(sys.argv[2], "a") as log:
        log.write(f"{os.getpid()}\\n")
    return build(*args)
stanza_pipeline.build_pipeline = build_and_log
settings = ParserSettings(stanza_dir=sys.argv[1], device="cpu", cache_path=None, workers=2, batch_size=2)
with SentenceParser(settings) as parser:
    results = parser.parse(json.loads(sys.stdin.read()))
    method = parser._pool._mp_context.get_start_method()
print(json.dumps({"pid": os.getpid(), "method": method, "trees": {t: r.binary_parse for t, r in results.items()}}))
"""


@pytest.mark.slow
def test_workers_fork_from_a_single_threaded_caller_that_loaded_stanza_once(
    snli_test, parser: SentenceParser, tmp_path: Path
) -> None:
    """What `spinn label --workers 2` does on the CPU: Stanza loads in the caller only, the workers are forked
    from it with the models loaded, and give the trees one process gives."""
    texts = list(_snli_premises(snli_test, 12))
    alone = parser.parse(texts)
    loads = tmp_path / "loads.txt"
    done = subprocess.run(
        [sys.executable, "-c", FORKED_PARSE, str(STANZA_DIR), str(loads)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["method"] == "fork"
    assert loads.read_text().split() == [str(result["pid"])]  # loaded once, by the caller
    assert result["trees"] == {text: alone[text].binary_parse for text in texts}


def test_workers_are_a_count_or_auto() -> None:
    assert ParserSettings().workers == "auto"
    assert ParserSettings(workers="3").workers == 3
    for bad in (0, -1, "many", True, 1.5):
        with pytest.raises(ValueError, match="number of processes|at least 1|must be a number"):
            ParserSettings(workers=bad)


def test_auto_is_one_worker_per_usable_core_on_the_cpu_and_one_with_a_larger_batch_on_the_gpu() -> None:
    from spinn.parsing.parser_settings import CPU_BATCH_SIZE, GPU_BATCH_SIZE, decided, decided_for

    cores = len(os.sched_getaffinity(0))
    on_cpu = decided(ParserSettings(device="cpu"))
    assert (on_cpu.workers, on_cpu.batch_size) == (cores, CPU_BATCH_SIZE)
    on_gpu = decided_for(ParserSettings(), use_gpu=True)
    assert (on_gpu.workers, on_gpu.batch_size) == (1, GPU_BATCH_SIZE)
    given = decided_for(ParserSettings(workers=3, batch_size=7), use_gpu=True)
    assert (given.workers, given.batch_size) == (3, 7)
    assert SentenceParser(ParserSettings(device="cpu", cache_path=None)).workers == cores


WATCHED_FORK = """
import json, threading
from spinn.ground.children import stop_when_orphaned
from spinn.parsing.workers import can_fork
stop_when_orphaned()
named = [thread.name for thread in threading.enumerate()]
other = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
before = can_fork(use_gpu=False)
other.start()
print(json.dumps({"threads": named, "alone": before, "beside_another": can_fork(use_gpu=False)}))
"""


def test_workers_are_forked_beside_the_commands_own_watcher() -> None:
    """Every command watches its starter from a thread (spinn/ground/children.py) that holds no lock a child
    could need: `spinn label --workers 2` on the CPU forks its workers beside it (it used to spawn them, each
    loading Stanza again), and still spawns beside any other thread."""
    done = subprocess.run(
        [sys.executable, "-c", WATCHED_FORK], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"threads": ["MainThread", WATCHER], "alone": True, "beside_another": False}


def test_workers_are_not_forked_beside_another_thread_or_for_the_gpu() -> None:
    from spinn.parsing.workers import can_fork

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not can_fork(use_gpu=False)
    finally:
        stop.set()
        other.join()
    assert not can_fork(use_gpu=True)
