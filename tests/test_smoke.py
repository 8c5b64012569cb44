"""The synthetic smoke corpus: deterministic bytes, SNLI's layout, read cleanly by prepare, labels by rule."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from flows.main import SMOKE_OVERRIDES
from spinn.data.check_binarization import binarization_agreement
from spinn.data.embeddings import load_embeddings
from spinn.data.prepare import PrepareSettings, prepare
from spinn.data.schema import LABELS, NO_CONSENSUS_LABEL
from spinn.data.smoke import HYPERNYMS, SMOKE_ARCHIVE_ROOT, SMOKE_SPLITS, smoke_records, write_smoke_corpus
from spinn.data.vector_sources import GLOVE_6B_50D
from spinn.data.vocab import vocabulary_from_counts
from spinn.ground.errors import SpinnError
from spinn.ground.settings import nest
from spinn.trees.tree import CLOSE, OPEN, parse_ptb

FIELDS = {
    "annotator_labels",
    "captionID",
    "gold_label",
    "pairID",
    "sentence1",
    "sentence1_binary_parse",
    "sentence1_parse",
    "sentence2",
    "sentence2_binary_parse",
    "sentence2_parse",
}
FUNCTION_WORDS = frozenset({"a", "an", "the", "."})
MIN_LABEL_SHARE, MAX_LABEL_SHARE = 0.25, 0.42
MAX_DISTINCT_PREMISE_SHARE = 0.6
MIN_GLOVE_COVERAGE = 0.95
CHANCE = 1 / 3


def member(split: str) -> str:
    return f"snli_1.0_{split}.jsonl"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tokens(binary_parse: str) -> list[str]:
    return [token.lower() for token in binary_parse.split() if token not in (OPEN, CLOSE)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_smoke_corpus(tmp_path_factory.mktemp("smoke") / "snli_1.0.zip")


@pytest.fixture(scope="module")
def records(corpus: Path) -> dict[str, list[dict]]:
    with zipfile.ZipFile(corpus) as archive:
        return {
            split: [json.loads(line) for line in archive.read(f"{SMOKE_ARCHIVE_ROOT}/{member(split)}").splitlines()]
            for split in SMOKE_SPLITS
        }


def labelled(records: list[dict]) -> list[dict]:
    return [record for record in records if record["gold_label"] != NO_CONSENSUS_LABEL]


def test_archive_has_the_three_splits_and_the_same_bytes_every_time(corpus: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(corpus) as archive:
        assert sorted(archive.namelist()) == sorted(f"{SMOKE_ARCHIVE_ROOT}/{member(split)}" for split in SMOKE_SPLITS)
    assert sha256(write_smoke_corpus(tmp_path / "again.zip")) == sha256(corpus)
    assert sha256(write_smoke_corpus(tmp_path / "other.zip", seed=1)) != sha256(corpus)


def test_records_have_snli_fields_and_sizes(records: dict[str, list[dict]]) -> None:
    for split, count in SMOKE_SPLITS.items():
        assert len(records[split]) == count
        assert all(set(record) == FIELDS for record in records[split])
    pair_ids = [record["pairID"] for split in records.values() for record in split]
    assert len(set(pair_ids)) == len(pair_ids)


def test_sizes_override_and_records_are_deterministic(tmp_path: Path) -> None:
    corpus = write_smoke_corpus(tmp_path / "small.zip", sizes={"train": 31})
    with zipfile.ZipFile(corpus) as archive:
        assert len(archive.read(f"{SMOKE_ARCHIVE_ROOT}/{member('train')}").splitlines()) == 31
        assert len(archive.read(f"{SMOKE_ARCHIVE_ROOT}/{member('dev')}").splitlines()) == SMOKE_SPLITS["dev"]
    assert smoke_records("dev", 30, 7) == smoke_records("dev", 30, 7) != smoke_records("dev", 30, 8)
    assert smoke_records("dev", 0, 0) == []
    with pytest.raises(SpinnError, match="validation"):
        write_smoke_corpus(tmp_path / "bad.zip", sizes={"validation": 10})
    with pytest.raises(SpinnError, match="-1"):
        smoke_records("dev", -1, 0)


@pytest.mark.parametrize("split", list(SMOKE_SPLITS))
def test_prepare_reads_every_line_and_parses_agree(
    corpus: Path, records: dict[str, list[dict]], tmp_path: Path, split: str
) -> None:
    no_consensus = len(records[split]) - len(labelled(records[split]))
    summary = prepare(corpus, tmp_path, PrepareSettings(workers=1), member=member(split))
    assert summary.rejected_total == 0
    assert summary.written == len(records[split]) - no_consensus
    assert summary.skipped == no_consensus > 0
    agreement = binarization_agreement(corpus, member(split))
    assert (agreement.matched, agreement.unreadable) == (2 * len(records[split]), 0)
    assert agreement.compared == agreement.matched


def test_parses_and_sentences_agree(records: dict[str, list[dict]]) -> None:
    for record in records["dev"]:
        for sentence in ("sentence1", "sentence2"):
            words = parse_ptb(record[f"{sentence}_parse"]).leaves()
            assert record[sentence] == " ".join(words[:-1]) + words[-1]
            assert words[0][0].isupper() and tokens(record[f"{sentence}_binary_parse"]) == [w.lower() for w in words]


def test_annotator_votes_have_a_majority_only_for_gold_labels(records: dict[str, list[dict]]) -> None:
    for record in records["train"]:
        votes = Counter(record["annotator_labels"])
        assert sum(votes.values()) == 5
        label, most = votes.most_common(1)[0]
        if record["gold_label"] == NO_CONSENSUS_LABEL:
            assert most < 3
        else:
            assert (label, most >= 3) == (record["gold_label"], True)
    no_consensus = len(records["train"]) - len(labelled(records["train"]))
    assert 0 < no_consensus <= 0.02 * len(records["train"])


def test_labels_are_balanced_and_premises_repeat(records: dict[str, list[dict]]) -> None:
    train = labelled(records["train"])
    shares = {label: count / len(train) for label, count in Counter(r["gold_label"] for r in train).items()}
    assert set(shares) == set(LABELS)
    assert all(MIN_LABEL_SHARE <= share <= MAX_LABEL_SHARE for share in shares.values()), shares
    distinct = len({record["sentence1"] for record in records["train"]})
    assert distinct < MAX_DISTINCT_PREMISE_SHARE * len(records["train"])


def rule_label(premise: list[str], hypothesis: list[str]) -> str:
    """The label the corpus's rules give: a changed subject or verb contradicts; new words are neutral."""

    def derived(word: str, source: str) -> bool:
        return word == source or HYPERNYMS.get(source) == word

    def subject_and_verb(words: list[str]) -> tuple[str, str]:
        copula = words.index("is")
        return words[copula - 1], words[copula + 1]

    (subject, verb), (new_subject, new_verb) = subject_and_verb(premise), subject_and_verb(hypothesis)
    if not (derived(new_subject, subject) and derived(new_verb, verb)):
        return "contradiction"
    implied = set(premise) | {HYPERNYMS[word] for word in premise if word in HYPERNYMS} | FUNCTION_WORDS
    return "entailment" if set(hypothesis) <= implied else "neutral"


def test_every_gold_label_follows_from_the_words(records: dict[str, list[dict]]) -> None:
    for split in SMOKE_SPLITS:
        for record in labelled(records[split]):
            premise, hypothesis = (tokens(record[f"{s}_binary_parse"]) for s in ("sentence1", "sentence2"))
            assert premise != hypothesis
            assert rule_label(premise, hypothesis) == record["gold_label"], record


def test_words_are_english(records: dict[str, list[dict]]) -> None:
    counts = Counter(
        word
        for split in records.values()
        for record in split
        for sentence in ("sentence1", "sentence2")
        for word in tokens(record[f"{sentence}_binary_parse"])
    )
    _, report = load_embeddings(
        GLOVE_6B_50D, vocabulary_from_counts(counts.items(), lowercase=True), cache_dir=None, progress=False
    )
    assert report.coverage >= MIN_GLOVE_COVERAGE, report


@pytest.mark.slow
def test_the_smoke_settings_beat_chance(smoke_model, smoke_store, tmp_path):
    """What `spinn-pipeline --smoke` promises (README): its settings learn the corpus's rules, clearly above
    chance on test. The front-door tests run the same settings for two steps only: they check the wiring."""
    from spinn.evaluation.evaluate import evaluate
    from spinn.training.train import train
    from spinn.training.train_config import TrainConfig

    prepared = smoke_model.prepared
    config = TrainConfig.build({**nest(SMOKE_OVERRIDES.items()), "device": "cpu", "threads": 1})
    result = train(
        prepared / "train.parquet",
        prepared / "dev.parquet",
        config,
        output_dir=tmp_path / "models",
        embeddings_dir=prepared.parent / "embeddings",
        register=False,
        progress=False,
    )
    metrics = evaluate(result.best_checkpoint, prepared / "test.parquet", tmp_path / "test.json")
    assert metrics.accuracy > CHANCE, metrics
