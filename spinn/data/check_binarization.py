"""`spinn check-binarization`: how often our binarizer reproduces a corpus's own binary parses.

SNLI ships both the n-ary parse and the binary parse made from it, so the
corpus itself is the test of `spinn.trees.binarize`: binarize every n-ary parse and
count exact matches. The same check tells a user whether trees from Stanza,
binarized here, will look like the trees a model was trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from spinn.data.corpus import BINARY_SUFFIX, NARY_SUFFIX, SENTENCES, iter_records, open_corpus
from spinn.data.rejects import RecordProblem
from spinn.trees.binarize import binarize
from spinn.trees.transitions import parse_binary
from spinn.trees.tree import Tree, TreeError, format_binary, parse_ptb

MAX_EXAMPLES = 20


@dataclass(frozen=True)
class Mismatch:
    line: int
    field: str
    ours: str
    theirs: str


@dataclass
class Agreement:
    matched: int = 0
    compared: int = 0
    unreadable: int = 0
    examples: list[Mismatch] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.matched / self.compared if self.compared else 0.0

    def summary_line(self) -> str:
        return f"agreement {self.fraction:.4f} ({self.matched}/{self.compared})"


def binarization_agreement(path: Path, member: str | None = None) -> Agreement:
    """Compare binarize(sentence*_parse) with sentence*_binary_parse over a whole file."""
    agreement = Agreement()
    with open_corpus(Path(path), member) as (stream, name):
        for line, field_name, trees in _tree_pairs(stream, name):
            if trees is None:
                agreement.unreadable += 1
                continue
            ours, theirs = trees
            agreement.compared += 1
            if ours == theirs:
                agreement.matched += 1
            elif len(agreement.examples) < MAX_EXAMPLES:
                agreement.examples.append(Mismatch(line, field_name, format_binary(ours), format_binary(theirs)))
    return agreement


def _tree_pairs(stream, name: str) -> Iterator[tuple[int, str, tuple[Tree, Tree] | None]]:
    """(line, sentence field, (binarized n-ary tree, corpus binary tree) or None if unreadable)."""
    for line, _raw, record in iter_records(stream, name):
        if isinstance(record, RecordProblem):
            yield line, "", None
            continue
        for sentence in SENTENCES:
            nary, binary = record.get(sentence + NARY_SUFFIX), record.get(sentence + BINARY_SUFFIX)
            try:
                yield line, sentence, (binarize(parse_ptb(nary)), parse_binary(binary))
            except (TreeError, TypeError):
                yield line, sentence, None
