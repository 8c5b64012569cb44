"""Reading and writing bracketings: PTB n-ary trees and SNLI binary parses."""

from __future__ import annotations

import pytest

from spinn.trees.transitions import parse_binary
from spinn.trees.tree import Tree, TreeError, TreeProblem, format_binary, format_ptb, leaf, node, parse_ptb

DOG = "(ROOT (S (NP (DT A) (NN dog)) (VP (VBZ runs)) (. .)))"


def test_ptb_reads_labels_and_leaves():
    tree = parse_ptb(DOG)
    assert tree.label == "ROOT"
    assert tree.leaves() == ["A", "dog", "runs", "."]
    subject = tree.children[0].children[0]
    assert subject.label == "NP" and [c.label for c in subject.children] == ["DT", "NN"]
    assert subject.children[0].is_preterminal


def test_ptb_round_trip():
    assert format_ptb(parse_ptb(DOG)) == DOG


def test_ptb_unlabelled_root():
    tree = parse_ptb("( (S (NP (NN Dogs)) (VP (VBP bark))))")
    assert tree.label == "" and tree.leaves() == ["Dogs", "bark"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", TreeProblem.EMPTY),
        ("   ", TreeProblem.EMPTY),
        ("(NP )", TreeProblem.EMPTY),
        ("( )", TreeProblem.EMPTY),
        ("(S (NP (NN dog))", TreeProblem.UNBALANCED),
        ("(S (NP (NN dog))))", TreeProblem.UNBALANCED),
        ("dog", TreeProblem.MALFORMED),
        ("(S (NN a)) (S (NN b))", TreeProblem.MALFORMED),
        ("(S (NP (NN dog)) ) (", TreeProblem.UNBALANCED),
    ],
)
def test_ptb_errors_name_their_problem(text, problem):
    with pytest.raises(TreeError) as error:
        parse_ptb(text)
    assert error.value.problem is problem


def test_binary_format_matches_snli():
    text = "( ( A dog ) ( runs . ) )"
    tree = parse_binary(text)
    assert tree == node(node(leaf("A"), leaf("dog")), node(leaf("runs"), leaf(".")))
    assert format_binary(tree) == text


def test_single_word_binary_tree_is_a_bare_word():
    assert format_binary(leaf("Hello")) == "Hello"
    assert parse_binary("Hello") == leaf("Hello")
    assert parse_binary("( Hello )") == leaf("Hello")


def test_leaves_and_is_binary_on_deep_trees():
    tree = leaf("w0")
    for i in range(1, 5000):  # deeper than Python's recursion limit
        tree = node(tree, leaf(f"w{i}"))
    assert tree.leaves() == [f"w{i}" for i in range(5000)]
    assert Tree("X", (leaf("a"), leaf("b"), leaf("c"))).is_binary() is False
