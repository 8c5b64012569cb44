"""Issue 24 item 2: how far Stanza's own tokenizer is from SNLI's tokens, beside spinn's.

Tokenizes the raw sentences of an SNLI-format file with Stanza (tokenize + mwt, its
English models from a local stanza_resources folder, offline) and with
`spinn.trees.tokenize`, and compares both with the leaves of the binary parses, as
`spinn check-tokens` does. Stanza writes `"` and `(` where SNLI has `` `` ``/`''` and
`-LRB-`; the "normalized" line maps those back (a quote before a word opens), so what
is left is where Stanza cuts differently: mostly hyphenated words (`t - shirt`).

    .venv/bin/python scripts/stanza_token_agreement.py ../shared/data/snli/snli_1.0_test.jsonl.gz --limit 2000

With `--stanza-path` it measures instead the leaves of the trees the Stanza path
itself gives (`SentenceParser`, binarized), under each tokenizer setting: `spinn`
(the default: SNLI's tokens handed to Stanza pretokenized) and `stanza`:

    .venv/bin/python scripts/stanza_token_agreement.py ../shared/data/snli/snli_1.0_test.jsonl.gz \
        --limit 2000 --stanza-path

This is a measurement, outside the package: spinn itself reaches Stanza only through
spinn.parsing.parser.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import stanza
import torch

from spinn.data.token_agreement import TokenAgreement, token_agreement
from spinn.parsing.parser import SentenceParser
from spinn.parsing.parser_settings import ParserSettings
from spinn.parsing.protocol import Parsed
from spinn.trees.tokenize import CLOSING_QUOTE, OPENING_QUOTE, tokenize

STANZA_DIR = Path(__file__).resolve().parents[2] / "shared" / "stanza" / "stanza_resources"
PTB_BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}


class StanzaTokens:
    """Stanza's words (after multi-word expansion: do n't) for each text, with the offset where each ends."""

    def __init__(self, folder: Path) -> None:
        self.pipeline = stanza.Pipeline(
            "en",
            dir=str(folder),
            processors="tokenize,mwt",
            download_method=None,
            use_gpu=False,
            logging_level="WARN",
            tokenize_no_ssplit=True,
            tokenize_model_path=str(folder / "en" / "tokenize" / "combined.pt"),
            mwt_model_path=str(folder / "en" / "mwt" / "combined.pt"),
        )
        self.seen: dict[str, list[tuple[str, int]]] = {}

    def words(self, text: str) -> list[tuple[str, int]]:
        if text not in self.seen:
            document = self.pipeline(text)
            self.seen[text] = [(word.text, word.parent.end_char) for line in document.sentences for word in line.words]
        return self.seen[text]

    def raw(self, text: str) -> list[str]:
        return [word for word, _end in self.words(text)]

    def normalized(self, text: str) -> list[str]:
        """Brackets escaped; a `"` right before a letter, digit or `$` opens (``), any other closes ('')."""
        tokens = []
        for word, end in self.words(text):
            following = text[end : end + 1]
            if word == '"':
                tokens.append(OPENING_QUOTE if following.isalnum() or following == "$" else CLOSING_QUOTE)
            else:
                tokens.append(PTB_BRACKETS.get(word, word))
        return tokens


class StanzaPathLeaves:
    """The leaves of the Stanza path's binary trees for the file's first sentences, parsed in one call."""

    def __init__(self, file: Path, limit: int | None, settings: ParserSettings) -> None:
        with SentenceParser(settings) as parser:
            parsed = parser.parse(first_sentences(file, limit))
        self.leaves = {text: result.tokens if isinstance(result, Parsed) else [] for text, result in parsed.items()}

    def __call__(self, text: str) -> list[str]:
        return self.leaves.get(text, [])


def first_sentences(file: Path, limit: int | None) -> list[str]:
    """sentence1 and sentence2 of the first pairs, until there are `limit` sentences (all: no limit)."""
    sentences = []
    with gzip.open(file, "rt", encoding="utf-8") if file.suffix == ".gz" else file.open(encoding="utf-8") as lines:
        for line in lines:
            if limit is not None and len(sentences) >= limit:
                break
            row = json.loads(line)
            sentences += [row["sentence1"], row["sentence2"]]
    return sentences


def stanza_path(arguments: argparse.Namespace) -> None:
    """Agreement of the Stanza path's tree leaves with SNLI's, per tokenizer setting."""
    for tokenizer in ("spinn", "stanza"):
        settings = ParserSettings(
            stanza_dir=arguments.stanza_dir, device="cpu", cache_path=None, workers=1, tokenizer=tokenizer
        )
        started = time.perf_counter()
        leaves = StanzaPathLeaves(arguments.file, arguments.limit, settings)
        seconds = time.perf_counter() - started
        agreement = token_agreement(arguments.file, tokenizer=leaves, limit=arguments.limit)
        print(report(f"path, {tokenizer}", agreement, f"  ({seconds:.0f} s to parse)"))
        for kind, mismatches in agreement.examples_by_kind.items():
            for mismatch in mismatches[: arguments.examples]:
                print(f"  {kind.value} line {mismatch.line}: {mismatch.ours} / corpus {mismatch.theirs}")


def report(name: str, agreement: TokenAgreement, extra: str = "") -> str:
    kinds = ", ".join(f"{kind.value} {count}" for kind, count in agreement.kinds.most_common())
    return f"{name:18} {agreement.summary_line()}{extra}  residue: {kinds or 'none'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="An SNLI-format file with raw sentences and binary parses.")
    parser.add_argument("--limit", type=int, help="Compare only the first LIMIT sentences.")
    parser.add_argument("--stanza-dir", type=Path, default=STANZA_DIR, help="A local stanza_resources folder.")
    parser.add_argument("--examples", type=int, default=3, help="Differing sentences shown per kind.")
    parser.add_argument("--threads", type=int, default=1, help="Torch threads for Stanza (one: a fair rate).")
    parser.add_argument("--stanza-path", action="store_true", help="Compare the Stanza path's tree leaves instead.")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    if arguments.stanza_path:
        stanza_path(arguments)
        return
    tokens = StanzaTokens(arguments.stanza_dir)
    started = time.perf_counter()
    raw = token_agreement(arguments.file, tokenizer=tokens.raw, limit=arguments.limit)
    rate = f"  ({raw.compared / (time.perf_counter() - started):,.0f} sentences/s)"
    normalized = token_agreement(arguments.file, tokenizer=tokens.normalized, limit=arguments.limit)
    ours = token_agreement(arguments.file, tokenizer=tokenize, limit=arguments.limit)
    print(report("stanza", raw, rate))
    print(report("stanza normalized", normalized))
    print(report("spinn tokenize", ours))
    for kind, mismatches in normalized.examples_by_kind.items():
        print(f"stanza normalized, {kind.value}:")
        for mismatch in mismatches[: arguments.examples]:
            print(f"  line {mismatch.line} {mismatch.field}\n    stanza: {mismatch.ours}")
            print(f"    corpus: {mismatch.theirs}")


if __name__ == "__main__":
    main()
