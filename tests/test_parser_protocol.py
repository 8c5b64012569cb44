"""The Parser protocol: the Stanza parser and the token-only one both implement it (no Stanza loads here)."""

from __future__ import annotations

import inspect

import pytest

from spinn.data.rejects import RejectReason
from spinn.parsing.parse import TokenOnly
from spinn.parsing.parser import SentenceParser
from spinn.parsing.protocol import Parsed, Parser


def test_the_stanza_parser_and_the_token_only_one_both_implement_the_parser_protocol() -> None:
    """The labeller and the parse stage take either through `Parser`: every member, with the same parameters."""
    members = {name for name in vars(Parser) if not name.startswith("_")}
    assert members == {"model_id", "workers", "parse", "submit", "close"}
    for implementation in (SentenceParser, TokenOnly):
        for name in members:
            wanted, found = getattr(Parser, name), getattr(implementation, name)
            if callable(wanted):
                assert list(inspect.signature(found).parameters) == list(inspect.signature(wanted).parameters), name
            else:
                assert hasattr(implementation, name), name
    tokens = TokenOnly(max_tokens=4)
    pending = tokens.submit(["A dog runs .", "", "one two three four five"])
    assert pending.to_parse == 3 and tokens.model_id == "none" and tokens.workers == 1
    results = pending.result()
    assert results["A dog runs ."] == Parsed(["A", "dog", "runs", "."], [], "")
    assert [results[text].reason for text in ("", "one two three four five")] == [
        RejectReason.EMPTY_SENTENCE,
        RejectReason.TOO_LONG,
    ]


def test_every_pending_parse_has_what_the_labeller_reads() -> None:
    from spinn.parsing.parse import Tokenized, Tokenizing
    from spinn.parsing.parser import PendingParses
    from spinn.parsing.protocol import PendingParse

    members = {name for name in vars(PendingParse) if not name.startswith("_")} | set(PendingParse.__annotations__)
    assert members == {"to_parse", "result", "seconds", "seconds_after", "finished_at"}
    ready = Tokenized({}, 0.5, 0)
    for name in members - {"to_parse"}:
        assert hasattr(PendingParses, name) and hasattr(ready, name) and hasattr(Tokenizing, name), name
    assert "to_parse" in Tokenized.__annotations__
    assert (ready.seconds_after(0.0), ready.finished_at, ready.result()) == (0.5, 0.0, {})


def test_the_token_only_parser_tokenizes_each_distinct_text_once(monkeypatch) -> None:
    """A premise repeated across pairs is tokenized once, as Stanza parses it once."""
    import spinn.parsing.parse as parse

    seen: list[str] = []
    monkeypatch.setattr(parse, "tokenize", lambda text: seen.append(text) or text.split())
    results = TokenOnly(max_tokens=10).parse(["A dog runs .", "A cat sits .", "A dog runs .", "A dog runs ."])
    assert sorted(seen) == ["A cat sits .", "A dog runs ."]
    assert results["A dog runs ."] == Parsed(["A", "dog", "runs", "."], [], "")


@pytest.mark.parametrize("forked", [True, False])
def test_tokenizer_workers_give_what_this_process_gives_in_input_order(monkeypatch, forked) -> None:
    """Worker processes tokenize (real ones, forked or spawned, batches of 2): the same answers, rejections
    included, one per distinct text in input order, each batch reported once; closing stops them."""
    import spinn.parsing.parse as parse
    import spinn.parsing.workers as workers

    monkeypatch.setattr(workers, "can_fork", lambda use_gpu: forked)

    texts = ["A dog runs .", "", "one two three four five", 'Two dogs aren\'t "playing".', "A dog runs .", "t-shirt"]
    texts += [f"Sentence number {number} ." for number in range(4)]
    here = TokenOnly(max_tokens=4).parse(texts)
    monkeypatch.setattr(parse, "TOKENIZE_BATCH", 2)
    reported: list[int] = []
    tokens = TokenOnly(max_tokens=4, workers=2)
    try:
        pending = tokens.submit(texts, reported.append)
        assert pending.to_parse == len(here)
        results = pending.result()
        pool = tokens.pool()
    finally:
        tokens.close()
    assert list(results) == list(here) and results == here
    assert sorted(reported) == [1, 2, 2, 2, 2]
    assert pending.seconds > 0.0 and pending.seconds_after(pending.finished_at) == 0.0
    with pytest.raises(RuntimeError, match="shutdown"):
        pool.submit(len, "")
