"""Stanza's trees as the project's: PTB-normalised leaves, one ROOT per text, binarized, as transitions.

The conversion walks Stanza's nodes, never its string form, in which a `(` leaf
would read as a bracket; the binarizer is the one SNLI's trees go through, so a
model trained on SNLI's binary parses meets the same kind of tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from spinn.data.rejects import RejectReason
from spinn.parsing.protocol import Parsed, Unparsed
from spinn.trees.binarize import binarize
from spinn.trees.transitions import tree_to_transitions
from spinn.trees.tree import Tree, format_binary

OUTPUT_VERSION = "spinn-parse-1"
"""Part of the parse cache's key: bump when conversion, leaf normalisation or binarization changes a tree."""
ROOT_LABEL = "ROOT"

# Penn Treebank spellings of brackets and quotes, as in SNLI's parses.
PTB_FORMS = {
    "(": "-LRB-",
    ")": "-RRB-",
    "[": "-LSB-",
    "]": "-RSB-",
    "{": "-LCB-",
    "}": "-RCB-",
    "\u201c": "``",
    "\u201d": "''",
}
STRAIGHT_QUOTE = '"'
OPENING_QUOTE, CLOSING_QUOTE = "``", "''"


def outcome(sentences: Sequence[Any]) -> Parsed | Unparsed:
    """The Parsed form of one document's Stanza sentences (normally exactly one)."""
    if not sentences:
        return Unparsed(RejectReason.PARSE_FAILED, "Stanza found no words")
    binary = binarize(document_tree([sentence.constituency for sentence in sentences]))
    transitions = [int(transition) for transition in tree_to_transitions(binary)]
    return Parsed(tokens=binary.leaves(), transitions=transitions, binary_parse=format_binary(binary))


def document_tree(roots: Sequence[Any]) -> Tree:
    """One ROOT over the children of every sentence's ROOT, with PTB-normalised leaves."""
    words = iter(ptb_words([word for root in roots for word in root.leaf_labels()]))
    return Tree(ROOT_LABEL, tuple(_convert(child, words) for root in roots for child in root.children))


def _convert(node: Any, words: Iterator[str]) -> Tree:
    if not node.children:
        return Tree(next(words))
    return Tree(node.label, tuple(_convert(child, words) for child in node.children))


def ptb_words(words: Sequence[str]) -> list[str]:
    """Brackets -> -LRB- etc.; straight double quotes alternate `` (opening) and '' (closing)."""
    normalised = []
    quote_open = False
    for word in words:
        if word == STRAIGHT_QUOTE:
            word = CLOSING_QUOTE if quote_open else OPENING_QUOTE
            quote_open = not quote_open
        normalised.append(PTB_FORMS.get(word, word))
    return normalised
