"""Shift/reduce transitions: invariants and exact round trips with trees."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spinn.trees.transitions import (
    Transition,
    TransitionError,
    check_transitions,
    format_transitions,
    parse_binary,
    read_binary_parse,
    right_branching,
    transition_count,
    transitions_to_tree,
    tree_to_transitions,
)
from spinn.trees.tree import Tree, TreeError, TreeProblem, format_binary, leaf, node

S, R = Transition.SHIFT, Transition.REDUCE


def binary_trees(max_leaves: int = 30) -> st.SearchStrategy[Tree]:
    words = st.text(alphabet="abcdefgh.,'-", min_size=1, max_size=5).map(leaf)
    return st.recursive(words, lambda children: st.builds(node, children, children), max_leaves=max_leaves)


def test_names_and_codes_are_fixed():
    assert {t.name: t.value for t in Transition} == {"SHIFT": 0, "REDUCE": 1}


def test_legality():
    assert S.is_legal(stack_size=0, buffer_size=1)
    assert not S.is_legal(stack_size=3, buffer_size=0)
    assert R.is_legal(stack_size=2, buffer_size=0)
    assert not R.is_legal(stack_size=1, buffer_size=5)


def test_known_tree():
    tree = parse_binary("( ( A dog ) ( runs . ) )")
    assert tree_to_transitions(tree) == [S, S, R, S, S, R, R]


@given(binary_trees())
def test_tree_transitions_tree_round_trip(tree):
    transitions = tree_to_transitions(tree)
    tokens = tree.leaves()
    assert len(transitions) == transition_count(len(tokens))
    assert transitions.count(S) == len(tokens)
    check_transitions(transitions, len(tokens))
    assert transitions_to_tree(tokens, transitions) == tree


@given(binary_trees())
def test_string_scan_equals_tree_walk(tree):
    text = format_binary(tree)
    tokens, transitions = read_binary_parse(text)
    assert tokens == tree.leaves()
    assert transitions == [int(t) for t in tree_to_transitions(tree)]
    assert format_binary(parse_binary(text)) == text


@given(binary_trees())
def test_bracketing_straight_from_transitions_equals_formatting_the_tree(tree):
    transitions = tree_to_transitions(tree)
    assert format_transitions(tree.leaves(), [int(t) for t in transitions]) == format_binary(tree)


@pytest.mark.parametrize(
    ("transitions", "n_tokens", "message"),
    [
        ([R], 1, "illegal REDUCE"),
        ([S, R], 1, "illegal REDUCE"),
        ([S, S], 2, "2 phrases"),
        ([S], 2, "1 words unread"),
        ([S, S, S, R], 2, "illegal SHIFT"),
        ([S, 7], 2, "not a transition"),
        ([], 0, "at least one token"),
    ],
)
def test_illegal_sequences_are_refused(transitions, n_tokens, message):
    with pytest.raises(TransitionError, match=message):
        check_transitions(transitions, n_tokens)


def right_branching_parse(words: list[str]) -> str:
    """w1 (w2 (w3 ...)) in SNLI's bracket format."""
    return words[0] if len(words) == 1 else f"( {words[0]} {right_branching_parse(words[1:])} )"


@pytest.mark.parametrize("n_tokens", range(1, 7))
def test_right_branching_is_a_legal_sequence_over_every_word(n_tokens):
    transitions = right_branching(n_tokens)
    check_transitions(transitions, n_tokens)
    assert len(transitions) == transition_count(n_tokens) == 2 * n_tokens - 1
    words = [f"w{i}" for i in range(n_tokens)]
    assert format_binary(transitions_to_tree(words, transitions)) == right_branching_parse(words)


def test_non_binary_tree_has_no_transitions():
    with pytest.raises(TransitionError, match="binarize first"):
        tree_to_transitions(Tree("", (leaf("a"), leaf("b"), leaf("c"))))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", TreeProblem.EMPTY),
        ("( )", TreeProblem.EMPTY),
        ("( a b", TreeProblem.UNBALANCED),
        ("a b )", TreeProblem.UNBALANCED),
        ("( a b c )", TreeProblem.MALFORMED),
        ("( a b ) c", TreeProblem.MALFORMED),
    ],
)
def test_binary_parse_errors(text, problem):
    with pytest.raises(TreeError) as error:
        read_binary_parse(text)
    assert error.value.problem is problem


def test_unary_brackets_collapse():
    assert read_binary_parse("( ( ( a b ) ) )") == (["a", "b"], [S, S, R])


def test_real_snli_parses_round_trip(snli_dev):
    with gzip.open(snli_dev, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines):
            record = json.loads(line)
            for field in ("sentence1_binary_parse", "sentence2_binary_parse"):
                tokens, transitions = read_binary_parse(record[field])
                assert len(transitions) == transition_count(len(tokens))
                tree = transitions_to_tree(tokens, transitions)
                assert format_binary(tree) == " ".join(record[field].split())
            if number == 2000:
                break
