"""How often a tokenizer cuts a corpus's raw sentences into its parses' own leaves.

SNLI ships each raw sentence (`sentence1`) beside its binary parse, whose leaves are
the tokens a model trained on SNLI knows. So the corpus is the test of
`spinn.trees.tokenize`: tokenize every raw sentence and count the sentences whose
tokens equal the leaves exactly. Each sentence that differs is filed under the kind
of its first difference (a hyphen, a quote, a period, ...), so a report says what
is left and how much of it, not only how much.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from enum import Enum
from itertools import accumulate
from pathlib import Path

from spinn.data.check_binarization import Agreement, Mismatch
from spinn.data.corpus import BINARY_SUFFIX, SENTENCES, iter_records, open_corpus
from spinn.data.rejects import RecordProblem
from spinn.trees.tokenize import tokenize
from spinn.trees.transitions import read_binary_parse
from spinn.trees.tree import TreeError

EXAMPLES_PER_KIND = 20
EQUAL = "equal"  # SequenceMatcher's tag for a run both sides share

Tokenizer = Callable[[str], list[str]]


class Residue(str, Enum):
    """The kind of a sentence's first token difference."""

    HYPHEN = "hyphen"  # t-shirt against t - shirt
    CLITIC = "clitic"  # does n't, man 's
    QUOTE = "quote"  # `` '' ` ' against "
    BRACKET = "bracket"  # -LRB- against (
    PERIOD = "period"  # Dr. against Dr . ; etc. .
    PUNCTUATION = "punctuation"  # dog , against dog,
    SLASH = "slash"  # he/she against he / she
    OTHER_SPLIT = "other split"  # the same characters, cut elsewhere
    TEXT = "text"  # the parse's characters differ from the raw text's


_NEGATION = "n't"
_CLITICS = (_NEGATION, "'s", "'re", "'ve", "'ll", "'d", "'m")
_QUOTES = frozenset("`'\"\u2018\u2019\u201c\u201d")
_PUNCTUATION = frozenset(",;:!?")
_BRACKETS = frozenset({"(", ")", "[", "]", "{", "}", "-LRB-", "-RRB-", "-LSB-", "-RSB-", "-LCB-", "-RCB-"})


@dataclass
class TokenAgreement(Agreement):
    """Agreement over sentences, with the residue counted by kind and a few examples of each."""

    kinds: Counter[Residue] = field(default_factory=Counter)
    examples_by_kind: dict[Residue, list[Mismatch]] = field(default_factory=dict)

    def add_mismatch(self, kind: Residue, mismatch: Mismatch) -> None:
        self.kinds[kind] += 1
        shown = self.examples_by_kind.setdefault(kind, [])
        if len(shown) < EXAMPLES_PER_KIND:
            shown.append(mismatch)


def token_agreement(
    path: Path, member: str | None = None, tokenizer: Tokenizer = tokenize, limit: int | None = None
) -> TokenAgreement:
    """Compare tokenizer(sentence*) with the leaves of sentence*_binary_parse over a file (or its first
    `limit` sentences); a sentence without a readable parse is counted as unreadable, not compared."""
    agreement = TokenAgreement()
    for line, field_name, text, leaves in _sentences(path, member):
        if agreement.compared == limit:
            break
        if leaves is None:
            agreement.unreadable += 1
            continue
        agreement.compared += 1
        ours = tokenizer(text)
        if ours == leaves:
            agreement.matched += 1
        else:
            mismatch = Mismatch(line, field_name, " ".join(ours), " ".join(leaves))
            agreement.add_mismatch(residue_kind(ours, leaves), mismatch)
    return agreement


def residue_kind(ours: list[str], theirs: list[str]) -> Residue:
    """The kind of the first stretch where two tokenizations of one sentence differ: by the characters
    where they cut the same text differently, or by the tokens where their text differs."""
    opcodes = SequenceMatcher(a=ours, b=theirs, autojunk=False).get_opcodes()
    _tag, start, end, their_start, their_end = next(code for code in opcodes if code[0] != EQUAL)
    mine, yours = ours[start:end], theirs[their_start:their_end]
    text = "".join(mine)
    if text != "".join(yours):
        return _kind_of_text(mine + yours)
    cut = min(_cuts(mine) ^ _cuts(yours))
    around = text[cut - 1 : cut + 1]
    if "-" in around:
        return Residue.HYPHEN
    if text[cut:].lower().startswith(_CLITICS) or text[cut - 1 :].lower().startswith(_NEGATION):
        return Residue.CLITIC  # cut before a clitic, or inside n't (n 't)
    if not _QUOTES.isdisjoint(around):
        return Residue.QUOTE
    if "." in around:
        return Residue.PERIOD
    if not _PUNCTUATION.isdisjoint(around):
        return Residue.PUNCTUATION
    return Residue.SLASH if "/" in around else Residue.OTHER_SPLIT


def _kind_of_text(tokens: list[str]) -> Residue:
    """Tokens whose characters differ: quotes or brackets written another way, a period added, or other text."""
    if any(not _QUOTES.isdisjoint(token) for token in tokens):
        return Residue.QUOTE
    if any(token in _BRACKETS for token in tokens):
        return Residue.BRACKET
    return Residue.PERIOD if any("." in token for token in tokens) else Residue.TEXT


def _cuts(tokens: list[str]) -> set[int]:
    """Where, in the tokens' joined text, one token ends and the next begins."""
    return set(accumulate(len(token) for token in tokens[:-1]))


def _sentences(path: Path, member: str | None) -> Iterator[tuple[int, str, str, list[str] | None]]:
    """(line, sentence field, raw text, the binary parse's leaves or None when unreadable)."""
    with open_corpus(Path(path), member) as (stream, name):
        for line, _raw, record in iter_records(stream, name):
            if isinstance(record, RecordProblem):
                yield line, "", "", None
                continue
            for sentence in SENTENCES:
                text, binary = record.get(sentence), record.get(sentence + BINARY_SUFFIX)
                yield line, sentence, text or "", _leaves(binary) if isinstance(text, str) else None


def _leaves(binary: object) -> list[str] | None:
    try:
        return read_binary_parse(binary)[0] if isinstance(binary, str) else None
    except TreeError:
        return None
