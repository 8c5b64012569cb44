"""Head-driven binarization on tricky hand-written trees and on the real SNLI files."""

from __future__ import annotations

from spinn.data.check_binarization import binarization_agreement
from spinn.trees.binarize import basic_category, binarize, find_head
from spinn.trees.transitions import parse_binary
from spinn.trees.tree import format_binary, parse_ptb


def binary(ptb: str) -> str:
    return format_binary(binarize(parse_ptb(ptb)))


def test_head_absorbs_right_siblings_first_then_left():
    # S -> NP VP . : the VP is the head; it takes '.' first, then the subject.
    assert binary("(ROOT (S (NP (DT A) (NN dog)) (VP (VBZ runs)) (. .)))") == "( ( A dog ) ( runs . ) )"


def test_noun_phrase_head_is_rightmost_noun():
    assert binary("(NP (DT a) (JJ broken) (JJ down) (NN airplane))") == "( a ( broken ( down airplane ) ) )"


def test_verb_head_takes_objects_left_to_right():
    tree = "(VP (VBG hugging) (NP (UH goodbye)) (PP (IN while) (NP (NN lunch))))"
    assert binary(tree) == "( ( hugging goodbye ) ( while lunch ) )"


def test_unary_chains_and_preterminals_collapse():
    assert binary("(ROOT (S (VP (VB Run))))") == "Run"
    assert binary("(ROOT (FRAG (NP (NP (NN dog)) (PP (IN in) (NP (NN snow))))))") == "( dog ( in snow ) )"


def test_single_word_sentence():
    assert binary("(ROOT (NP (NN Dogs)))") == "Dogs"


def test_coordination_moves_head_before_the_conjunction():
    # NP rule picks the rightmost noun 'cat'; CC before it moves the head to 'dog'.
    assert find_head("NP", ["NN", "CC", "NN"]) == 0
    assert binary("(NP (NN dog) (CC and) (NN cat))") == "( ( dog and ) cat )"


def test_serial_comma_keeps_the_head_as_snli_does():
    # With punctuation before the CC the head stays on the last conjunct (SNLI's trees agree).
    assert find_head("ADJP", ["JJ", ",", "JJ", ",", "CC", "JJ"]) == 5
    tree = "(ADJP (JJ green) (, ,) (JJ white) (, ,) (CC and) (JJ red))"
    assert binary(tree) == "( green ( , ( white ( , ( and red ) ) ) ) )"


def test_unknown_category_takes_leftmost_non_punctuation():
    assert find_head("WEIRD", [",", "NN", "VB"]) == 1


def test_function_tags_are_ignored():
    assert basic_category("NP-SBJ-1") == "NP"
    assert basic_category("-LRB-") == "-LRB-"
    assert find_head("NP-SBJ", ["DT", "NN"]) == 1


def test_binarized_tree_keeps_the_words():
    tree = parse_ptb("(ROOT (S (NP (NP (DT A) (NN man)) (PP (IN in) (NP (DT a) (NN hat)))) (VP (VBZ sits)) (. .)))")
    result = binarize(tree)
    assert result.is_binary() and result.leaves() == tree.leaves()
    assert result == parse_binary("( ( ( A man ) ( in ( a hat ) ) ) ( sits . ) )")


def test_agreement_with_snli_binary_parses(snli_test):
    """SNLI test here; dev through the command (test_cli's check-binarization: 1.0 of its 20,000)."""
    agreement = binarization_agreement(snli_test)
    assert agreement.compared == 20000 and agreement.unreadable == 0
    assert agreement.fraction >= 0.98, agreement.examples[:3]
