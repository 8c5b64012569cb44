"""Raw text -> the tokens SNLI's own trees have, with no parser and no model.

A model trained on SNLI knows SNLI's words: the leaves of `sentence*_binary_parse`,
which Stanford CoreNLP's PTB tokenizer cut from the raw `sentence1` / `sentence2`.
Text labelled later must be cut the same way, or the model meets words it never
saw (`t - shirt` for `t-shirt`, `"` for the ``` `` ``` it learnt). `tokenize`
reproduces those conventions with one compiled regular expression, scanned once:

- Punctuation splits off (`dog .`, `Hello , world`); `...` and `…` are `...`;
  runs of `?` and `!` stay one token; `---`, `–` and `—` are `--`.
- Words joined by hyphens stay whole (`t-shirt`, `middle-aged`, `2-3`, `o'clock`),
  as do numbers (`1,000`, `3.5`, `53:11`), slashed pairs (`he/she`, `1/2`),
  `AT&T`, letters joined by a period (`base.a`), e-mail addresses and URLs.
- Clitics split off: `does n't`, `ca n't`, `man 's`, `they 're`, `I 'm`;
  `cannot`, `gonna`, `gotta`, `wanna`, `lemme`, `gimme`, `dunno` split in two
  (`can not`, `gon na`); names like `O'Neil` stay whole.
- Quotes become LaTeX-style: `"` before a letter, digit or `$` is ``` `` ```, any
  other `"` is `''`; `'` before a word is `` ` ``, any other `'`; curly quotes by shape.
- Brackets are escaped: `-LRB-` `-RRB-` `-LSB-` `-RSB-` `-LCB-` `-RCB-`.
- Abbreviations keep their period: titles (`Dr.`, `St.`, `Mt.`, `ft.`), initials
  and acronyms (`J.`, `U.S.`, `t.v.`). An acronym before a sentence-opening word
  (`U.S. The`) and a sentence-final `etc.` (or month, state, company) also give
  the sentence its own `.`, as the PTB tokenizer does.
- Currency: `£` is `#`, `¢` is `cents`, other currency signs `$`; `½` is `1/2`.

Where several readings are possible the PTB tokenizer takes the longest token; the
alternatives below are ordered so that the first to match is that one. Pure and
deterministic. What it cannot know (a corpus typo the parser saw differently) is the
residue that `spinn check-tokens` counts: none on SNLI dev or test.

A parser that must see the same words gets these tokens, space-joined, as pretokenized
text (Stanza: `tokenize_pretokenized=True`); Stanza's own tokenizer splits `t - shirt`.
"""

from __future__ import annotations

from collections.abc import Callable

import regex as re  # not the standard re: Python 3.11.2's gets these possessive quantifiers wrong (3.11.7's not)

PERIOD = "."
ELLIPSIS = "..."
DASH = "--"
OPENING_QUOTE = "``"
CLOSING_QUOTE = "''"

_ALNUM = r"[^\W_]"  # a letter or digit, any script
_LETTER = r"[^\W\d_]"
_APOS = "['\u2019\u0092\u00b4]"  # apostrophe, right single quote (also as CP1252), acute accent
_APOS_ANY = "['\u2019\u0092\u00b4`\u2018\u0091\u201b]"  # the same, plus left quotes typed inside words
_HYPHEN = "[-_\u058a\u2010\u2011]"
_CLITIC_LETTERS = "(?i:s|re|ve|ll|d|m)"

# ---------------------------------------------------------------------- abbreviations

_SENTENCE_OPENER = re.compile(
    r"\s+(?:A(?i:bout|ccording|dditionally|fter|n|s|t)?|B(?i:ut)|D(?i:id|uring)|E(?i:arlier)"
    r"|H(?i:e|er|ere|ow|owever)|I(?i:f|n|t)|L(?i:ast)|M(?i:any|ore|r\.|s\.)|N(?i:ow)|O(?i:nce|ne|ther|ur)"
    r"|S(?i:he|ince|o|ome|uch)|T(?i:hat|he|heir|hen|here|hese|hey|his)|W(?i:e|hen|hile|hat|ho|hy)|Y(?i:et|ou))"
    r"[\s?!]"
)
"""A word that, after an acronym (`U.S. The`), shows that the acronym's period also ends a sentence."""
_SENTENCE_END = re.compile(r"\s(?:\s|[A-Z])|[\s\S]?\Z")
_BEFORE_NUMBER = re.compile(r"\s?\d")
_LIST_MARK = re.compile("[,;:]")
_ACRONYM = re.compile(r"[A-Za-z](?:\.[A-Za-z])*")  # J U.S t.v p.m, before their period


def _spelled(*patterns: str) -> frozenset[str]:
    """Every lowercase word that `patterns` spell, a trailing `?` making the letter before it optional."""
    words: set[str] = set()
    for pattern in patterns:
        for word in pattern.split():
            forms = [""]
            for index, letter in enumerate(word):
                if letter == "?":
                    continue
                optional = word[index + 1 : index + 2] == "?"
                forms = [form + letter for form in forms] + (forms if optional else [])
            words.update(forms)
    return frozenset(words)


_ENDING = _spelled(
    "jan feb mar apr jun jul aug sept? oct nov dec mon tues? wed thu thurs fri",  # months, days
    "ala ariz calif colo conn ct dak fla ga ind kans? ky md mich minn mo mont neb nev okla penn tenn va vt wisc? wyo",
    "inc cos? corp pty ptys ppty pte ptes ltd plc rt bancorp bhd assn univ intl sys",  # companies
    "tel est ext sq jr bros esq etc al seq bldg ed.d ph.d",
)
"""Abbreviations often at a sentence's end (`etc.`, `Inc.`): there their period is also the sentence's."""
_ENDING_CAPITALIZED = frozenset("Az Ark Del Ill La Mass Miss Ore Pa Tex Wash".split())
"""States whose abbreviation is a common word in lower case (`ill.`): abbreviations only when capitalized."""

_TITLES = _spelled(
    "mr mrs ms mx drs? profs? sens? reps? attys? lt col gen messrs govs? adm rev maj sgt cpl pvt capt ste? ave",
    "pres lieut rt hon brig cmdr comdr pfc spc supts? det mt ft adj adv asst assoc ens insp mlle mme msgr sfc sr",
    "vs alex wm jos cie a.k.a cf treas ph invt elec natl mfg mtg dept blvd rd",
)
"""Abbreviations before a name or a number (`Dr.`, `St.`, `Mt.`, `ft.`): their period never ends a sentence."""
_TITLES_CAPITALIZED = frozenset({"Miss", "v"})

_BEFORE_NUMBERS = _spelled("ca figs? prop nos? sects? secs? arts? paras? bldg pp op approx rs") | {"Pt"}
"""Abbreviations that keep their period only before a number (`No. 5`, `ca. 1900`)."""


def _word_period(match: re.Match[str]) -> list[str]:
    """A word and the period after it: one token (`Dr.`), two (`dog .`), or an abbreviation and a
    sentence's period (`etc. .`), as the PTB tokenizer decides from the word and what follows."""
    token, text, after = match.group("word_period"), match.string, match.end()
    word = token[:-1]
    lower, capitalized = word.lower(), word[:1] + word[1:].lower()
    if _ACRONYM.fullmatch(word) and _SENTENCE_OPENER.match(text, after):
        return [word if len(word) == 1 else token, PERIOD]
    if (lower in _BEFORE_NUMBERS or word in _BEFORE_NUMBERS) and _BEFORE_NUMBER.match(text, after):
        return [token]
    if lower in _ENDING or capitalized in _ENDING_CAPITALIZED:
        return [token, PERIOD] if _SENTENCE_END.match(text, after) else [token]
    if lower in _TITLES or capitalized in _TITLES_CAPITALIZED or _ACRONYM.fullmatch(word):
        return [token]
    return [token] if _LIST_MARK.match(text, after) else [word, PERIOD]


# ---------------------------------------------------------------------- words

_NUMBER = r"\d++(?:[.:,]\d++)*+|\d*+(?:[.,]\d++)++"  # 1,000 3.5 53:11 .5
_PART = rf"(?:{_ALNUM}+|{_NUMBER})"
_ELIDED = rf"[dDoOlL]{_APOS_ANY}{_ALNUM}"  # o'clock, d'Avignon, l'Oreal
_COMPOUND = (
    rf"(?=[^\W_.,:]*+(?:[.,:]\d++)*+{_HYPHEN}|{_ELIDED})"  # only where a hyphen or elision follows
    rf"(?:(?:{_ELIDED})?{_PART}(?:{_HYPHEN}(?:{_ELIDED})?{_PART})+"  # t-shirt, 2-3, 3.5-inch, o'clock
    rf"(?:/{_ALNUM}++(?:-{_LETTER}++){{0,2}}){{0,2}}|{_ELIDED}{_ALNUM}*+)"  # t-shirt/jeans
)
_SLASHED = rf"{_ALNUM}++(?:-{_LETTER}++){{0,2}}+(?:/{_ALNUM}++(?:-{_LETTER}++){{0,2}}+){{1,2}}"  # he/she 1/2
_NOT_A_CLITIC = rf"(?!{_CLITIC_LETTERS}(?!{_LETTER}))"  # THEY'RE is THEY 'RE, not a name
_CLITIC = rf"{_APOS}{_CLITIC_LETTERS}"  # 's 're 've 'll 'd 'm
_NEGATION = rf"(?i:n{_APOS_ANY}t)"  # n't
_WITH_APOSTROPHE = (
    rf"(?={_LETTER}*+{_APOS_ANY})(?:"  # only where an apostrophe follows the letters
    rf"[A-HJ-XZn]{_APOS_ANY}{_NOT_A_CLITIC}{_LETTER}{{2,}}"  # O'Neil, D'Angelo
    rf"|{_LETTER}+[aeiouyAEIOUY]{_APOS_ANY}{_NOT_A_CLITIC}[aeiouA-Z]{_LETTER}*+"  # Hawai'i
    rf"|(?i:dunkin|somethin|ol){_APOS}|(?i:c'mon|e'er|s'mores|ev'ry|li'l|nat'l|nor'easter|cont'd)"
    rf"|{_LETTER}{_ALNUM}*+(?={_CLITIC})|{_LETTER}*[^\W\dnN_](?={_NEGATION})"  # man|'s does|n't
    rf"|{_NEGATION}(?!{_LETTER})|[lLdDjJ]{_APOS}(?!{_ALNUM})|[yY]{_APOS}(?={_LETTER}))"  # n't, l' d' j', y'all
)
_DOTTED_WORD = rf"{_LETTER}{_ALNUM}*+(?:[.!?]{_LETTER}{_ALNUM}*+)*+"  # dog, base.a, tenni.s
_BEFORE_LIST_MARK = r"(?:\.(?=[,;:]))?"  # `dog.,` keeps its period before a comma
_WORD_END = rf"(?!{_ALNUM}|{_HYPHEN}{_ALNUM}|[.!?]{_LETTER})"
"""Nothing follows that would make a longer word."""
_ASSIMILATIONS = (
    ("can", "not"),
    ("gon", "na"),
    ("got", "ta"),
    ("wan", "na"),
    ("lem", "me"),
    ("gim", "me"),
    ("dun", "no"),
)
"""Words the PTB splits in two (`cannot` -> `can not`): the first half is matched alone, the second is a word."""
_ASSIMILATION = "(?i:" + "|".join(f"{first}(?={second}{_WORD_END})" for first, second in _ASSIMILATIONS) + ")"

# ---------------------------------------------------------------------- quotes and symbols

_QUOTE_CHARS = "[`\u2018-\u201f\u0082\u0084\u0091-\u0094\u2039\u203a\u00ab\u00bb]"
_DOUBLE_QUOTE = "\"|[`'\u0091\u0092\u2018\u2019]'"
_SINGLE_QUOTE = rf"{_APOS}|{_QUOTE_CHARS}{{1,2}}"
_SHAPES = {
    "\u2018": "`", "\u0091": "`", "\u201a": "`", "\u201b": "`", "\u2039": "`", "\u0082": "`",
    "\u2019": "'", "\u0092": "'", "\u203a": "'", "\u00b4": "'",
    "\u201c": "``", "\u0093": "``", "\u201e": "``", "\u0084": "``", "\u00ab": "``",
    "\u201d": "''", "\u0094": "''", "\u00bb": "''",
}  # fmt: skip
"""Curly and angled quotes become PTB quotes by their shape, wherever they stand."""
_CLOSING = str.maketrans(_SHAPES)
_OPENING = str.maketrans({**_SHAPES, "'": "`"})
_SYMBOLS = {
    "(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-",
    "\u00a2": "cents", "\u00a3": "#", "\u00a4": "$", "\u00a5": "$", "\u20a0": "$", "\u20ac": "$", "\u0080": "$",
    "\u00bc": "1/4", "\u00bd": "1/2", "\u00be": "3/4", "\u2153": "1/3", "\u2154": "2/3",
}  # fmt: skip
"""PTB escapes for brackets, and ASCII for currency signs and fractions."""

# ---------------------------------------------------------------------- the scanner

_STARTING_WITH_A_LETTER = (
    _ASSIMILATION,
    rf"{_LETTER}++(?=[\s,;:)\]}}\"]|[!?](?!{_LETTER})|\Z)",  # the common case: a plain word
    rf"(?P<word_period>{_LETTER}++(?:\.{_LETTER}++)*+\.)(?!\.)",
    r"(?i:https?|ftp)://[^\s\"<>|(){}\[\]]*[^\s\"'<>|.!?(){},;:&\[\]-]",
    r"[\w.%+-]++@[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]",
    r"[A-Z]++\$",  # US$
    _WITH_APOSTROPHE,
    rf"{_COMPOUND}{_BEFORE_LIST_MARK}",
    _SLASHED,
    r"[A-Z]++(?:[&+][A-Z]++)++",  # AT&T
    rf"{_DOTTED_WORD}{_BEFORE_LIST_MARK}",
)
_STARTING_WITH_A_DIGIT = (
    rf"{_COMPOUND}{_BEFORE_LIST_MARK}",
    _SLASHED,
    r"\d++(?:[.:,]\d++)++",
    rf"{_ALNUM}++",
)
_STARTING_WITH_A_QUOTE = (
    rf"(?i:'t)(?=(?i:is|was){_WORD_END})",  # 'tis -> 't is
    rf"{_CLITIC}(?!{_LETTER})",
    rf"(?i:{_APOS}(?:n{_APOS}?|em|till?|cause|[2-9]0s))(?!{_LETTER})",  # 'n' 'em 'til '90s
    rf"(?P<opening_double>{_DOUBLE_QUOTE})(?=[^\W_]|\$)|(?P<closing_double>{_DOUBLE_QUOTE})",
    rf"(?P<opening_single>{_SINGLE_QUOTE})(?={_LETTER}\S|[AaIiUu]\s)|(?P<closing_single>{_SINGLE_QUOTE})",
)
_STARTING_OTHERWISE = (
    "(?P<invisible>[\u200b\u200e\u200f\ufeff\x7f]++)",  # zero-width characters: the PTB tokenizer drops them
    r"[,;:](?!\d)|\.(?![.\d]| \. \.)|[?!]++",
    r"[-+]?(?:\d++(?:[.:,]\d++)*+|\d*+(?:[.,]\d++)++)",  # -5, .5
    rf"(?P<ellipsis>\.{{3,}}(?=\.\s+{_LETTER})|\.{{3,}}|\u2026|\u0085|\.(?: \.)+)",
    r"(?P<dash>-{3,4}(?!-)|[\u2013\u2014\u2015\u0096\u0097])",
    r"-(?:RRB|LRB|RCB|LCB|RSB|LSB)-|-++|=++|\*++|@++|#++|_++|\$",
    r"\S",
)


def _either(alternatives: tuple[str, ...]) -> str:
    return "|".join(f"(?:{alternative})" for alternative in alternatives)


_TOKEN = re.compile(
    r"\s*+(?:"
    rf"(?P<symbol>[{re.escape(''.join(_SYMBOLS))}])|"  # first: Python counts ½ as a letter
    rf"(?={_LETTER})(?:{_either(_STARTING_WITH_A_LETTER)})"
    rf"|(?=\d)(?:{_either(_STARTING_WITH_A_DIGIT)})"
    rf"|(?=\"|{_APOS}|{_QUOTE_CHARS})(?:{_either(_STARTING_WITH_A_QUOTE)})"
    rf"|{_either(_STARTING_OTHERWISE)})"
)
"""One token, after any spaces. Each alternative is tried only where the token's first character allows it
(`(?=...)`), and possessive repeats (`++`) never retry a shorter run: so a plain word costs one short match."""

_RENDER: dict[str, Callable[[re.Match[str]], list[str]]] = {
    "word_period": _word_period,
    "opening_double": lambda _match: [OPENING_QUOTE],
    "closing_double": lambda _match: [CLOSING_QUOTE],
    "opening_single": lambda match: [match.group("opening_single").translate(_OPENING)],
    "closing_single": lambda match: [match.group("closing_single").translate(_CLOSING)],
    "ellipsis": lambda _match: [ELLIPSIS],
    "dash": lambda _match: [DASH],
    "symbol": lambda match: [_SYMBOLS[match.group("symbol")]],
    "invisible": lambda _match: [],
}
"""How a named alternative becomes tokens; an unnamed one is its own text."""

_CURLY_APOSTROPHES = frozenset("\u2019\u0092\u00b4\u2018\u0091\u201b")
_STRAIGHTENED = str.maketrans({curly: _SHAPES[curly] for curly in _CURLY_APOSTROPHES})


def tokenize(text: str) -> list[str]:
    """SNLI's tokens for one raw sentence (`Two dogs aren't "playing".` -> Two dogs are n't `` playing '' .)."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind is None:
            tokens.append(match.group().lstrip())
        else:
            tokens.extend(_RENDER[kind](match))
    if _CURLY_APOSTROPHES.isdisjoint(text):
        return tokens
    return [token.translate(_STRAIGHTENED) for token in tokens]  # o’clock, n’t: words take a straight apostrophe
