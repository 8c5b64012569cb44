"""Tests for spinn.model.batch and spinn.data.pairs: padding layout, length buckets, corpus reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spinn.data.example import Example
from spinn.data.pairs import RawPair, corpus_vocabulary, encode_pairs, read_raw_pairs
from spinn.data.schema import LABELS
from spinn.data.vocab import PAD_ID, UNK_ID
from spinn.ground.errors import SpinnError
from spinn.model.batch import BUCKET_NOISE, bucket_batches, make_batch, padding_fraction
from spinn.trees.transitions import PAD_TRANSITION, Transition, check_transitions, read_binary_parse

S, R = Transition.SHIFT, Transition.REDUCE
RECORDS = [
    {
        "gold_label": "entailment",
        "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
        "sentence2_binary_parse": "( ( An animal ) moves )",
        "pairID": "p1",
    },
    {"gold_label": "-", "sentence1_binary_parse": "( A b )", "sentence2_binary_parse": "c", "pairID": "p2"},
    {
        "gold_label": "contradiction",
        "sentence1_binary_parse": "( Cats ( sleep soundly ) )",
        "sentence2_binary_parse": "( Cats run )",
        "pairID": "p3",
    },
]


def example(premise: str, hypothesis: str, label: int | None = 0) -> Example:
    """Ids are word lengths: enough to tell positions apart."""
    p_tokens, p_transitions = read_binary_parse(premise)
    h_tokens, h_transitions = read_binary_parse(hypothesis)
    return Example(
        tuple(len(t) + 2 for t in p_tokens),
        tuple(p_transitions),
        tuple(len(t) + 2 for t in h_tokens),
        tuple(h_transitions),
        label,
    )


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def test_pad_transition_is_not_a_transition():
    assert PAD_TRANSITION not in {t.value for t in Transition}


def test_make_batch_layout():
    examples = [example("( ( A dog ) ( runs . ) )", "( ( An animal ) moves )", 0), example("( Cats sleep )", "Hi", 2)]
    batch = make_batch(examples)
    assert batch.pairs == 2
    assert batch.tokens.shape == (4, 4)
    assert batch.lengths.tolist() == [4, 2, 3, 1]  # premises first, then hypotheses
    assert batch.transitions.shape == (4, 7)
    assert batch.tokens[1].tolist() == [6, 7, PAD_ID, PAD_ID]  # right-padded
    assert batch.transitions[1].tolist() == [S, S, R] + [PAD_TRANSITION] * 4  # own steps first, then padding
    assert batch.transitions[0].tolist() == [S, S, R, S, S, R, R]
    assert batch.transitions[3].tolist() == [S] + [PAD_TRANSITION] * 6
    assert batch.labels.tolist() == [0, 2]
    assert padding_fraction(batch) == pytest.approx((0 + 4 + 2 + 6) / 28)


def test_make_batch_without_labels():
    assert make_batch([example("( a b )", "c", label=None)]).labels is None


def test_make_batch_refuses_bad_input():
    with pytest.raises(SpinnError, match="zero examples"):
        make_batch([])
    with pytest.raises(SpinnError, match="need 3 transitions"):
        make_batch([Example((3, 4), (S, S), (5,), (S,), 0)])
    with pytest.raises(SpinnError, match="at least one token"):
        make_batch([Example((), (), (5,), (S,), 0)])


def test_batch_to_device_keeps_values():
    batch = make_batch([example("( a b )", "c")])
    moved = batch.to("cpu")
    assert torch.equal(moved.tokens, batch.tokens) and torch.equal(moved.transitions, batch.transitions)


@st.composite
def binary_trees(draw, max_leaves: int = 12) -> str:
    """A random binary parse in SNLI's bracket format."""
    leaves = draw(st.integers(1, max_leaves))

    def build(count: int) -> str:
        if count == 1:
            return draw(st.sampled_from(["a", "dog", "runs", "."]))
        left = draw(st.integers(1, count - 1))
        return f"( {build(left)} {build(count - left)} )"

    return build(leaves)


@given(st.lists(st.tuples(binary_trees(), binary_trees()), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_every_row_is_its_transitions_then_padding(pairs):
    examples = [example(p, h) for p, h in pairs]
    batch = make_batch(examples)
    sentences = [e.premise_transitions for e in examples] + [e.hypothesis_transitions for e in examples]
    for row, original in enumerate(sentences):
        values = batch.transitions[row].tolist()
        count = len(original)
        assert values[count:] == [PAD_TRANSITION] * (len(values) - count)
        assert tuple(values[:count]) == tuple(original)
        check_transitions(values[:count], int(batch.lengths[row]))


def test_bucket_batches_cover_every_example_once():
    examples = [example("( a b )" if i % 3 else "( ( a b ) ( c ( d e ) ) )", "c") for i in range(50)]
    batches = bucket_batches(examples, 8, seed=1)
    assert sorted(i for batch in batches for i in batch) == list(range(50))
    assert sorted(len(batch) for batch in batches) == [2] + [8] * 6
    assert batches == bucket_batches(examples, 8, seed=1)
    assert bucket_batches(examples, 8, seed=2) != batches


def test_bucket_batches_group_similar_lengths():
    lengths = [1 + (i * 7) % 20 for i in range(200)]
    examples = [Example((5,) * n, (S,) + (S, R) * (n - 1), (5,), (S,), 0) for n in lengths]
    for batch in bucket_batches(examples, 10, seed=0):
        spread = max(lengths[i] for i in batch) - min(lengths[i] for i in batch)
        assert spread <= 1 + 2 * BUCKET_NOISE
    ordered = bucket_batches(examples, 10, shuffle=False)
    assert [lengths[i] for batch in ordered for i in batch] == sorted(lengths)


def test_bucket_batches_refuse_zero_size():
    with pytest.raises(SpinnError, match="batch size"):
        bucket_batches([], 0)


def test_read_jsonl_skips_no_consensus_and_keeps_labels(tmp_path):
    pairs = read_raw_pairs(write_jsonl(tmp_path / "snli_1.0_dev.jsonl", RECORDS))
    assert len(pairs) == 2
    assert pairs[0].premise == ("A", "dog", "runs", ".")
    assert pairs[0].premise_transitions == (S, S, R, S, S, R, R)
    assert pairs[0].hypothesis == ("An", "animal", "moves")
    assert [pair.label for pair in pairs] == [LABELS.index("entailment"), LABELS.index("contradiction")]


def test_read_refuses_bad_files(tmp_path):
    with pytest.raises(SpinnError, match="no such file"):
        read_raw_pairs(tmp_path / "missing.jsonl")
    with pytest.raises(SpinnError, match="expected an SNLI"):
        read_raw_pairs(write_jsonl(tmp_path / "pairs.csv", RECORDS))
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"gold_label": "neutral", "sentence1_binary_parse": "( a"}])
    with pytest.raises(SpinnError, match="broken.jsonl:1"):
        read_raw_pairs(broken)


def test_read_prepared_parquet_matches_jsonl(tmp_path):
    from spinn.data.prepare import prepare

    source = write_jsonl(
        tmp_path / "snli_1.0_dev.jsonl",
        [
            {
                **record,
                "sentence1": " ".join(read_binary_parse(record["sentence1_binary_parse"])[0]),
                "sentence2": " ".join(read_binary_parse(record["sentence2_binary_parse"])[0]),
            }
            for record in RECORDS
        ],
    )
    summary = prepare(source, tmp_path / "prepared")
    assert read_raw_pairs(summary.output) == read_raw_pairs(source)


def test_vocabulary_and_encoding():
    pairs = [RawPair(("A", "dog"), (S, S, R), ("a", "cat"), (S, S, R), 0)]
    vocabulary = corpus_vocabulary(pairs)
    assert vocabulary.tokens[2] == "a"  # the most frequent word first, lowercased
    (encoded,) = encode_pairs(pairs, vocabulary)
    assert encoded.premise[0] == encoded.hypothesis[0] == vocabulary.index["a"]
    assert UNK_ID not in encoded.premise + encoded.hypothesis
    assert encoded.premise_transitions == (S, S, R) and encoded.label == 0


def test_real_dev_split_reads_and_batches(snli_dev):
    pairs = read_raw_pairs(snli_dev)
    assert len(pairs) == 10_000 - 158
    examples = encode_pairs(pairs, corpus_vocabulary(pairs))
    batch = make_batch([examples[i] for i in bucket_batches(examples, 64, seed=0)[0]])
    assert batch.tokens.shape[0] == 128
    assert padding_fraction(batch) < 0.5
