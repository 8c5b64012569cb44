"""The vocabulary: specials first, deterministic order, options honoured, file round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spinn.data.prepare import prepare
from spinn.data.vocab import PAD, PAD_ID, UNK, UNK_ID, VocabSettings, Vocabulary, build_vocabulary, vocab_stage
from spinn.ground.errors import SpinnError


def pair(pair_id: str, premise: str, hypothesis: str) -> str:
    """A line whose binary parses are right-branching over the given words."""

    def parse(words: list[str]) -> str:
        text = words[-1]
        for word in reversed(words[:-1]):
            text = f"( {word} {text} )"
        return text

    return json.dumps(
        {
            "gold_label": "neutral",
            "pairID": pair_id,
            "sentence1": premise,
            "sentence2": hypothesis,
            "sentence1_binary_parse": parse(premise.split()),
            "sentence2_binary_parse": parse(hypothesis.split()),
        }
    )


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    lines = [pair("1", "The dog runs", "A dog sleeps"), pair("2", "the Cat runs", "Zebras run")]
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    return prepare(tmp_path / "train.jsonl", tmp_path / "prepared").output


def test_specials_come_first_then_frequency_then_alphabet(prepared):
    vocabulary = build_vocabulary(prepared)
    assert vocabulary.tokens[:2] == (PAD, UNK) and (PAD_ID, UNK_ID) == (0, 1)
    assert vocabulary.tokens[2:] == ("dog", "runs", "the", "a", "cat", "run", "sleeps", "zebras")
    assert vocabulary.counts[2:5] == (2, 2, 2)


def test_case_and_min_freq_options(prepared):
    cased = build_vocabulary(prepared, lowercase=False)
    assert {"The", "the"} <= set(cased.tokens)
    frequent = build_vocabulary(prepared, min_freq=2)
    assert frequent.tokens == (PAD, UNK, "dog", "runs", "the")
    assert frequent.encode(["The", "zebras"]) == [frequent.index["the"], UNK_ID]
    assert len(build_vocabulary(prepared, max_size=4)) == 4
    with pytest.raises(SpinnError, match="min_freq"):
        build_vocabulary(prepared, min_freq=0)


def test_saved_beside_the_parquet_and_loaded_back(prepared):
    vocabulary, path = vocab_stage(prepared, settings=VocabSettings(min_freq=1))
    assert path == prepared.parent / "vocab.json"
    assert Vocabulary.load(path) == vocabulary


def test_bad_vocabulary_files_are_refused(tmp_path):
    (tmp_path / "v.json").write_text('{"format": "other"}')
    with pytest.raises(SpinnError, match="not a spinn.vocab"):
        Vocabulary.load(tmp_path / "v.json")
    (tmp_path / "w.json").write_text("{")
    with pytest.raises(SpinnError, match="not JSON"):
        Vocabulary.load(tmp_path / "w.json")


def test_real_snli_vocabulary(snli_dev, tmp_path):
    vocabulary = build_vocabulary(prepare(snli_dev, tmp_path).output)
    assert 5000 < len(vocabulary) < 10000
    assert vocabulary.tokens[2] == "a"  # the most frequent word in SNLI
