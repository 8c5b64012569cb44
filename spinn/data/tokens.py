"""Penn-Treebank-like tokens without a parser, for models that build their own trees (rl, spinn).

SNLI's parses split clitics and punctuation the Penn Treebank way; a model
trained on them meets the same kind of tokens here when no parser runs.
"""

from __future__ import annotations

import re

_CLITIC = r"(?:s|re|ve|ll|d|m)\b"
_TOKEN = re.compile(
    rf"""
      \.\.\. | --                                   # ellipsis, dash
    | (?<!\w)(?:[^\W\d_]\.){{2,}}                   # abbreviations with inner periods: U.S., e.g., a.m.
    | (?<!\w)(?:Mrs|Mr|Ms|Dr|St|Jr|Sr|vs)\.         # a few titles that are not sentence ends
    | \d+(?:[.,:/]\d+)+                             # numbers with separators: 3.5, 1,000, 10:30, 1/2
    | \w+(?=n't\b) | n't\b                          # negation: do|n't, ca|n't
    | '{_CLITIC}                                    # clitics: 's 're 've 'll 'd 'm
    | \w+(?:-\w+|'(?!{_CLITIC})\w+)*                # words, with hyphens or inner apostrophes: o'clock
    | \S                                            # any other character on its own: punctuation, quotes
    """,
    re.VERBOSE | re.IGNORECASE,
)
_TYPOGRAPHIC_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_PTB_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}
_OPEN_DOUBLE, _CLOSE_DOUBLE = "``", "''"
_OPEN_SINGLE = "`"


def simple_tokenize(text: str) -> list[str]:
    """Penn-Treebank-like tokens, as in SNLI's parses, for when no parser runs.

    Splits on whitespace; splits off punctuation, brackets and quotes; splits
    clitics ("don't" -> do n't, "can't" -> ca n't, "dog's" -> dog 's). Kept
    whole: numbers with separators (3.5, 1,000, 10:30), hyphenated words,
    words with an inner apostrophe that is no clitic (o'clock), abbreviations
    with inner periods (U.S., e.g.) and a few titles (Mr., Dr.) - so a
    sentence-final "U.S." keeps its period rather than giving a separate ".".
    Brackets become -LRB- -RRB- -LSB- -RSB- -LCB- -RCB-; double quotes become
    `` and '' alternately; a single quote that starts a word becomes `.
    Curly quotes count as straight ones.
    """
    text = text.translate(_TYPOGRAPHIC_QUOTES)
    tokens: list[str] = []
    double_quote_open = False
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == '"':
            double_quote_open = not double_quote_open
            token = _OPEN_DOUBLE if double_quote_open else _CLOSE_DOUBLE
        elif token == "'" and (match.start() == 0 or text[match.start() - 1].isspace()):
            token = _OPEN_SINGLE
        tokens.append(_PTB_BRACKETS.get(token, token))
    return tokens
