"""The tokenizer reproduces SNLI's own tokens: one hand-written case per convention, the real test file,
and `spinn check-tokens`, which measures it."""

from __future__ import annotations

import gzip
import json
import random
import re

import pytest

from spinn.data.token_agreement import Residue, residue_kind, token_agreement
from spinn.trees.tokenize import tokenize
from tests.helpers import spinn

GOAL = 0.995  # the tokenizer's target: SNLI test sentences token-identical to SNLI's own parses
SUMMARY = re.compile(r"agreement (\d\.\d{4}) \((\d+)/(\d+)\)")

CONVENTIONS = {
    "punctuation splits off": ("Hello, world; ok: yes!", "Hello , world ; ok : yes !"),
    "a run of ? and ! is one token": ("What?! Really??", "What ?! Really ??"),
    "two periods are two tokens": ("on his way to work..", "on his way to work . ."),
    "an ellipsis is three periods": ("Wait... what\u2026", "Wait ... what ..."),
    "hyphenated words stay whole": ("a middle-aged man in a t-shirt", "a middle-aged man in a t-shirt"),
    "long compounds stay whole": ("salt-and-pepper-haired tug-of-war", "salt-and-pepper-haired tug-of-war"),
    "a hyphen beside a space splits": ("daily routines- selling food", "daily routines - selling food"),
    "dashes become --": ("a -- b --- c \u2014 d", "a -- b -- c -- d"),
    "numbers stay whole": (
        "1,000 runners at 53:11 over 3.5 miles, 2-3 kids",
        "1,000 runners at 53:11 over 3.5 miles , 2-3 kids",
    ),
    "slashed pairs stay whole": ("when he/she grows up", "when he/she grows up"),
    "a trailing slash splits": ("drowning in the pool/", "drowning in the pool /"),
    "n't splits off": ("He doesn't, can't and won't.", "He does n't , ca n't and wo n't ."),
    "clitics split off": ("I'm sure they're at McDonald's", "I 'm sure they 're at McDonald 's"),
    "clitics split off in capitals": ("THEY'RE HERE", "THEY 'RE HERE"),
    "cannot and gonna split": ("he cannot, he's gonna", "he can not , he 's gon na"),
    "names with an apostrophe stay whole": ("O'Neil left at 5 o'clock", "O'Neil left at 5 o'clock"),
    "a possessive apostrophe is a closing quote": ("their parents' basement", "their parents ' basement"),
    "double quotes open and close": ('says, "I\'m a Pepper," and', "says , `` I 'm a Pepper , '' and"),
    "a quote after a period closes": ('a banner reading "Lotos."', "a banner reading `` Lotos . ''"),
    "a quote before a word opens": (
        "sits beneath a'no child left behind' sign",
        "sits beneath a ` no child left behind ' sign",
    ),
    "a backtick stays a backtick": ("the child was happy`", "the child was happy `"),
    "curly quotes by their shape": ("a \u201cfree\u201d hug, it\u2019s mine", "a `` free '' hug , it 's mine"),
    "brackets are escaped": (
        "football (soccer) [live] {x}",
        "football -LRB- soccer -RRB- -LSB- live -RSB- -LCB- x -RCB-",
    ),
    "titles keep their period": (
        "Dr. Pepper on Mt. Washington, 3 ft. deep",
        "Dr. Pepper on Mt. Washington , 3 ft. deep",
    ),
    "acronyms keep their period": ("The girl is watching t.v.", "The girl is watching t.v."),
    "an acronym before a new sentence doubles its period": ("in the U.S. The end", "in the U.S. . The end"),
    "a sentence-final etc. doubles its period": ("milk, bread, etc.", "milk , bread , etc. ."),
    "a word's final period splits": ("A dog runs.", "A dog runs ."),
    "letters joined by a period stay whole": ("on the base.a bench", "on the base.a bench"),
    "ampersands split unless in capitals": ("jeans,& a hat at AT&T", "jeans , & a hat at AT&T"),
    "currency signs": ("\u00a35 and $3 at 50%", "# 5 and $ 3 at 50 %"),
    "spaces of any kind separate": ("  A \u00a0dog\truns  ", "A dog runs"),
}


@pytest.mark.parametrize(("text", "expected"), CONVENTIONS.values(), ids=CONVENTIONS.keys())
def test_convention(text, expected):
    assert tokenize(text) == expected.split()


@pytest.mark.parametrize(
    ("text", "tokens"),
    [  # moved from test_sentence_pairs, where they checked the simple tokenizer this one replaced
        ("A dog runs.", "A dog runs ."),
        ("Don't touch the dog's tail!", "Do n't touch the dog 's tail !"),
        ("They can't, we won't; I'm sure they're here.", "They ca n't , we wo n't ; I 'm sure they 're here ."),
        ("We've said you'd know what he'll do?", "We 've said you 'd know what he 'll do ?"),
        ("A man (in a hat) sits.", "A man -LRB- in a hat -RRB- sits ."),
        ('She says "hi" and "bye".', "She says `` hi '' and `` bye '' ."),
        ("\u201cCurly\u201d quotes", "`` Curly '' quotes"),
        ("It costs $3.50, or 1,000 yen at 10:30.", "It costs $ 3.50 , or 1,000 yen at 10:30 ."),
        ("The U.S. team met Mr. Smith.", "The U.S. team met Mr. Smith ."),
        ("A well-known man at 5 o'clock", "A well-known man at 5 o'clock"),
        ("The kids' toys [new] {old}...", "The kids ' toys -LSB- new -RSB- -LCB- old -RCB- ..."),
        ("He said 'wait' -- then left", "He said ` wait ' -- then left"),
        ("  spaced\tout \n", "spaced out"),
        ("", ""),
    ],
)
def test_sentences(text: str, tokens: str):
    assert tokenize(text) == tokens.split()


def test_empty_text_has_no_tokens():
    assert tokenize("") == [] and tokenize(" \n ") == []


def test_tokens_are_never_empty_nor_hold_a_space():
    """Random strings of the characters the conventions turn on: every token is a non-empty word."""
    alphabet = "aAnt'\"`.-,/&$()1 :!?\u2019\u201c@_\u00a0"
    chooser = random.Random(21)
    for _ in range(2_000):
        text = "".join(chooser.choice(alphabet) for _ in range(chooser.randint(0, 30)))
        tokens = tokenize(text)
        assert all(token and not any(char.isspace() for char in token) for token in tokens), (text, tokens)


RESIDUES = {
    Residue.HYPHEN: (["a", "t", "-", "shirt"], ["a", "t-shirt"]),
    Residue.CLITIC: (["doesn't"], ["does", "n't"]),
    Residue.QUOTE: (['"', "hi", '"'], ["``", "hi", "''"]),
    Residue.BRACKET: (["(", "x", ")"], ["-LRB-", "x", "-RRB-"]),
    Residue.PERIOD: (["etc.", "."], ["etc."]),
    Residue.PUNCTUATION: (["dog,", "cat"], ["dog", ",", "cat"]),
    Residue.SLASH: (["he", "/", "she"], ["he/she"]),
    Residue.OTHER_SPLIT: (["ab", "c"], ["a", "bc"]),
    Residue.TEXT: (["colour"], ["color"]),
}


@pytest.mark.parametrize("kind", RESIDUES, ids=lambda kind: kind.value)
def test_residue_kind(kind):
    ours, theirs = RESIDUES[kind]
    assert residue_kind(ours, theirs) == kind


def test_a_cut_inside_nt_is_a_clitic():
    assert residue_kind(["does", "n", "'t"], ["does", "n't"]) == Residue.CLITIC


def test_residue_kind_looks_at_the_first_difference():
    assert residue_kind(["a", "t", "-", "shirt", "Dr", "."], ["a", "t-shirt", "Dr."]) == Residue.HYPHEN


def _record(first: str, first_parse: str, second: str, second_parse: str) -> dict[str, str]:
    return {
        "sentence1": first,
        "sentence1_binary_parse": first_parse,
        "sentence2": second,
        "sentence2_binary_parse": second_parse,
    }


@pytest.fixture
def small_corpus(tmp_path):
    """Five readable sentences, one of which the corpus cut differently (t - shirt), and one broken parse."""
    records = [
        _record("A dog runs.", "( ( A dog ) ( runs . ) )", "Two cats sleep.", "( ( Two cats ) ( sleep . ) )"),
        _record(
            "A man in a t-shirt.",
            "( ( A man ) ( ( in ( a ( t ( - shirt ) ) ) ) . ) )",
            "He isn't here.",
            "( He ( ( is ( n't here ) ) . ) )",
        ),
        _record("Broken.", "( ( Broken", "Fine.", "( Fine . )"),
    ]
    path = tmp_path / "snli_1.0_dev.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as stream:
        stream.writelines(json.dumps(record) + "\n" for record in records)
    return path


def test_agreement_counts_sentences_and_files_the_residue(small_corpus):
    agreement = token_agreement(small_corpus)
    assert (agreement.matched, agreement.compared, agreement.unreadable) == (4, 5, 1)
    assert agreement.kinds == {Residue.HYPHEN: 1}
    (mismatch,) = agreement.examples_by_kind[Residue.HYPHEN]
    assert (mismatch.line, mismatch.field, mismatch.ours) == (2, "sentence1", "A man in a t-shirt .")


def test_agreement_stops_at_the_limit(small_corpus):
    assert token_agreement(small_corpus, limit=3).compared == 3


def test_snli_test_reaches_the_goal(snli_test):
    agreement = token_agreement(snli_test)
    assert agreement.compared == 20_000
    assert agreement.fraction >= GOAL, agreement.kinds


def test_the_measure_can_fail(snli_test):
    """Splitting on spaces keeps `dog.` and `man's` whole: far from SNLI's tokens."""
    assert token_agreement(snli_test, tokenizer=str.split, limit=2_000).fraction < GOAL / 2


def test_check_tokens_prints_the_agreement_last(snli_test):
    result = spinn("check-tokens", str(snli_test))
    assert result.returncode == 0, result.stderr
    fraction, matched, compared = SUMMARY.fullmatch(result.stdout.strip().splitlines()[-1]).groups()
    assert float(fraction) >= GOAL and int(compared) == 20_000 and int(matched) >= GOAL * 20_000


def test_check_tokens_shows_the_residue_by_kind(small_corpus):
    result = spinn("check-tokens", str(small_corpus), "--residue")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "residue hyphen: 1",
        "  line 2 sentence1",
        "    ours:   A man in a t-shirt .",
        "    corpus: A man in a t - shirt .",
        "unreadable sentences skipped: 1",
        "agreement 0.8000 (4/5)",
    ]
