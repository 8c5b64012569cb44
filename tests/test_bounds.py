"""Every bound has a bound. A size no machine here can hold (a token limit, a model's
width) is one `error:` line before any work, from what the machine's memory holds; extracting or reading a
zip archive is bounded (its members' total size and compression ratio); a rejects file keeps a bounded
excerpt of a long raw line, with the line's length.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from spinn.cli import main
from spinn.ground.io import file_digest
from tests.helpers import write_rows

HUGE_TOKENS = "100000000"
"""`--max-tokens 100000000` let a 100 MB line take 22.8 GB, and the kernel killed the run."""
HUGE_WIDTH = "99999999999"
Arguments = Callable[[Path], list[str]]
TOO_BIG: dict[str, tuple[Arguments, str]] = {
    "prepare": (lambda d: ["prepare", str(d / "dev.jsonl"), "--max-tokens", HUGE_TOKENS], "--max-tokens"),
    "prepare-params": (
        lambda d: [
            "prepare",
            str(d / "dev.jsonl"),
            "--config",
            str(params(d, f"prepare:\n  max_tokens: {HUGE_TOKENS}\n")),
        ],
        "prepare: max_tokens",
    ),
    "parse": (lambda d: ["parse", str(d / "pairs.csv"), "--max-tokens", HUGE_TOKENS], "--max-tokens"),
    "label": (
        lambda d: (
            ["label", str(d / "pairs.csv"), "--model", str(d / "m.pt"), "--output", str(d / "o.parquet")]
            + ["--max-tokens", HUGE_TOKENS]
        ),
        "--max-tokens",
    ),
    "trees": (
        lambda d: (
            ["trees", str(d / "pairs.csv"), "--model", str(d / "m.pt"), "--output", str(d / "t.jsonl")]
            + ["--max-tokens", HUGE_TOKENS]
        ),
        "--max-tokens",
    ),
    "bench-label": (
        lambda d: ["bench-label", str(d / "pairs.csv"), "--model", str(d / "m.pt"), "--max-tokens", HUGE_TOKENS],
        "--max-tokens",
    ),
    "train-set": (
        lambda d: [
            "train",
            "--train",
            str(d / "s.parquet"),
            "--dev",
            str(d / "s.parquet"),
            "--set",
            f"model.d_hidden={HUGE_WIDTH}",
        ],
        "--set model.d_hidden",
    ),
    "train-option": (
        lambda d: [
            "train",
            "--train",
            str(d / "s.parquet"),
            "--dev",
            str(d / "s.parquet"),
            "--model-mlp-dim",
            HUGE_WIDTH,
        ],
        "--model-mlp-dim",
    ),
    "spinn-pipeline": (lambda d: ["--set", f"model.d_hidden={HUGE_WIDTH}"], "--set model.d_hidden"),
    "bench": (lambda d: ["bench", "--corpus", str(d / "dev.jsonl"), "--d-hidden", HUGE_WIDTH], "--d-hidden"),
    "bench-tracker": (lambda d: ["bench", "--corpus", str(d / "dev.jsonl"), "--d-tracker", HUGE_WIDTH], "--d-tracker"),
}
"""Each command given a size beyond this machine, and the option (or params key) the error must name."""


def params(folder: Path, text: str) -> Path:
    (folder / "params.yaml").write_text(text)
    return folder / "params.yaml"


@pytest.mark.parametrize("case", TOO_BIG)
def test_a_size_beyond_what_the_machine_holds_is_one_line_before_any_work(case, tmp_path, monkeypatch):
    from flows.main import main as pipeline

    monkeypatch.chdir(tmp_path)
    for name in ("dev.jsonl", "pairs.csv", "m.pt", "s.parquet"):
        (tmp_path / name).write_bytes(b"")
    arguments, option = TOO_BIG[case]
    entry = pipeline if case == "spinn-pipeline" else main
    result = CliRunner().invoke(entry, arguments(tmp_path))
    lines = result.stderr.strip().splitlines()
    assert result.exit_code in (1, 2), (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0], result.stderr
    assert "memory" in lines[0] or "range" in lines[0], lines[0]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["dev.jsonl", "pairs.csv", "m.pt", "s.parquet", *(["params.yaml"] if "params" in case else [])]
    )


# ----------------------------------------------------------------------------- archives

BOMB_MEMBER = "snli_1.0/snli_1.0_dev.jsonl"
BOMB_BYTES = 64 * 2**20
"""64 MiB of one byte: deflate packs it about a thousandfold, as a zip bomb does."""


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "snli_1.0.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(BOMB_MEMBER, b"{" * BOMB_BYTES)
    return path


ARCHIVE_READERS: dict[str, Callable[[Path, Path], list[str]]] = {
    "download": lambda z, d: (
        ["download", "--raw-dir", str(d / "raw"), "--file", str(z)] + ["--checksum", f"sha256:{file_digest(z)}"]
    ),
    "prepare": lambda z, d: ["prepare", str(z), "--member", BOMB_MEMBER, "--output-dir", str(d / "out")],
    "check-binarization": lambda z, d: ["check-binarization", str(z), "--member", BOMB_MEMBER],
}
"""Every command that extracts or reads a zip archive."""


@pytest.mark.parametrize("command", ARCHIVE_READERS)
def test_a_zip_bomb_is_refused_before_it_is_extracted_or_read(command, bomb, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ARCHIVE_READERS[command](bomb, tmp_path))
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"{bomb.name}: member {BOMB_MEMBER!r} expands to {BOMB_BYTES} bytes" in lines[0], lines[0]
    assert not any(path.stat().st_size > 2**20 for path in tmp_path.rglob("*") if path.is_file())


# ----------------------------------------------------------------------------- rejects

LONG_LINE_CHARS = 200_000


def long_junk_line() -> str:
    return "{" + "x" * (LONG_LINE_CHARS - 1)


def snli_record(pair_id: str) -> dict:
    return {
        "gold_label": "entailment",
        "pairID": pair_id,
        "sentence1": "A dog runs.",
        "sentence1_binary_parse": "( ( A dog ) ( runs . ) )",
        "sentence2": "Animals move.",
        "sentence2_binary_parse": "( Animals ( move . ) )",
    }


def prepare_long_line(folder: Path) -> tuple[list[str], Path]:
    lines = [json.dumps(snli_record("a")), long_junk_line(), json.dumps(snli_record("b"))]
    (folder / "dev.jsonl").write_text("\n".join(lines) + "\n")
    arguments = ["prepare", str(folder / "dev.jsonl"), "--output-dir", str(folder / "out"), "--max-reject-ratio", "1"]
    return arguments, folder / "out" / "dev.rejects.jsonl"


def label_long_line(folder: Path, smoke_model) -> tuple[list[str], Path]:
    rows = [{"premise": "A dog runs.", "hypothesis": "Dogs run."}] * 2
    source = write_rows(folder / "pairs.jsonl", rows)
    source.write_text(source.read_text() + long_junk_line() + "\n")
    arguments = ["label", str(source), "--model", str(smoke_model.checkpoint), "--output", str(folder / "o.parquet")]
    return [*arguments, "--parser", "model"], folder / "o.rejects.jsonl"


REJECTING = {"prepare": lambda d, m: prepare_long_line(d), "label": label_long_line}
"""Every command that writes a rejects file (parse reads rows with label's reader; it needs Stanza)."""


@pytest.mark.parametrize("command", REJECTING)
def test_a_rejects_file_keeps_a_bounded_excerpt_of_a_long_raw_line_and_its_length(
    command, smoke_model, tmp_path, monkeypatch
):
    from spinn.data.rejects import RAW_EXCERPT_CHARS

    monkeypatch.chdir(tmp_path)
    arguments, rejects = REJECTING[command](tmp_path, smoke_model)
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 0, (result.output, result.exception)
    (reject,) = [json.loads(line) for line in rejects.read_text().splitlines()]
    assert reject["raw"] == long_junk_line()[:RAW_EXCERPT_CHARS] and reject["raw_chars"] == LONG_LINE_CHARS
    assert rejects.stat().st_size < 2 * RAW_EXCERPT_CHARS


# ----------------------------------------------------------------------------- lines and gzip streams

HUGE_LINE_CHARS = 50 * 2**20
"""A single line of 50 MB: every reader had read it whole into memory before any length check."""
READ_PEAK_BYTES = 8 * 2**20
"""What reading it may take (traced Python allocations): blocks, one line's bound, no copy of the line."""
GOOD = {"id": "g1", "premise": "A dog runs.", "hypothesis": "An animal moves."}


def pairs_lines(fmt: str, huge: str) -> list[str]:
    """A pairs file's lines: a good row, a row whose premise is `huge`, another good row."""
    rows = [GOOD, {**GOOD, "id": "h", "premise": huge}, {**GOOD, "id": "g2"}]
    if fmt == "jsonl":
        return [json.dumps(row) for row in rows]
    separator = "," if fmt == "csv" else "\t"
    return [separator.join(GOOD), *(separator.join(row.values()) for row in rows)]


def corpus_lines(fmt: str, huge: str) -> list[str]:
    """An SNLI-format file's lines (.jsonl, or .txt with its header): the middle pair's premise is `huge`."""
    records = [snli_record("a"), {**snli_record("h"), "sentence1": huge}, snli_record("b")]
    if fmt == "jsonl":
        return [json.dumps(record) for record in records]
    return ["\t".join(records[0]), *("\t".join(record.values()) for record in records)]


VECTOR_WORDS = ("dog", "runs")


def vector_lines(huge: str) -> list[str]:
    """GloVe text lines, 3-d: a line of `huge` between two good ones."""
    return [f"{VECTOR_WORDS[0]} 0.1 0.2 0.3", huge, f"{VECTOR_WORDS[1]} 0.4 0.5 0.6"]


def read_pairs(path: Path, _model) -> tuple[list[int | None], int]:
    """The pairs reader of label, parse, trees and bench-label: too_long rejects' lengths, and pairs kept."""
    from spinn.data.rejects import Reject
    from spinn.data.sentence_pairs import read_input_pairs

    found = list(read_input_pairs(path))
    rejects = [row for row in found if isinstance(row, Reject)]
    return [reject.raw_chars for reject in rejects if reject.reason.value == "too_long"], len(found) - len(rejects)


def read_corpus(path: Path, _model) -> tuple[list[int | None], int]:
    """prepare's corpus reader (check-binarization and check-tokens read through it too)."""
    from spinn.data.prepare import PrepareSettings, prepare

    summary = prepare(path, path.parent / "out", PrepareSettings(workers=1, max_reject_ratio=1.0))
    rejects = [json.loads(line) for line in summary.rejects.read_text(encoding="utf-8").splitlines()]
    return [reject.get("raw_chars") for reject in rejects if reject["reason"] == "too_long"], summary.written


def read_vectors(path: Path, _model) -> tuple[list[int | None], int]:
    """The embeddings stage's reader of GloVe text: an over-long line is skipped (no rejects file there)."""
    from spinn.data.glove import align_text_file
    from spinn.data.vocab import SPECIALS, Vocabulary

    tokens = SPECIALS + VECTOR_WORDS
    aligned = align_text_file(path, Vocabulary(tokens, (0,) * len(tokens), True, 1), progress=False)
    return [None] * aligned.skipped_lines, int(aligned.found.sum())


def read_sentences(path: Path, model) -> tuple[list[int | None], int]:
    """`spinn trees`' reader of a .txt file of sentences: an over-long line draws no tree (a warning counts it)."""
    import warnings

    from spinn.labeling.induced_trees import TreesSettings, induce_trees

    output = path.with_name(f"{path.stem}.trees.txt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drawn = induce_trees(model.checkpoint, path, output, TreesSettings(device="cpu"))
    refused = [str(warning.message) for warning in caught if "draw no tree" in str(warning.message)]
    trees = output.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(trees) == 3 and len(refused) == (trees[1] == ""), (trees, refused)
    return [None] * len(refused), drawn


LINE_READERS: dict[str, tuple[str, Callable[[str], list[str]], Callable[[Path, object], tuple[list, int]]]] = {
    "pairs-jsonl": ("pairs.jsonl", lambda huge: pairs_lines("jsonl", huge), read_pairs),
    "pairs-csv": ("pairs.csv", lambda huge: pairs_lines("csv", huge), read_pairs),
    "pairs-tsv": ("pairs.tsv", lambda huge: pairs_lines("tsv", huge), read_pairs),
    "corpus-jsonl": ("snli_1.0_dev.jsonl", lambda huge: corpus_lines("jsonl", huge), read_corpus),
    "corpus-txt": ("snli_1.0_dev.txt", lambda huge: corpus_lines("txt", huge), read_corpus),
    "vectors": ("vectors.txt", vector_lines, read_vectors),
    "sentences": ("sentences.txt", lambda huge: ["A dog runs.", huge, "An animal moves."], read_sentences),
}
"""Every reader of text lines: file name, its lines around a given huge value, and the read."""


@pytest.mark.parametrize("reader", LINE_READERS)
def test_a_huge_single_line_is_rejected_with_its_length_without_being_read_whole(reader, smoke_model, tmp_path):
    import tracemalloc

    name, lines, read = LINE_READERS[reader]
    (tmp_path / "warm").mkdir()
    read(write_lines(tmp_path / "warm" / name, lines("short")), smoke_model)  # imports, before the count starts
    huge = "x" * HUGE_LINE_CHARS
    path = write_lines(tmp_path / name, lines(huge))
    line_chars = len(lines(huge)[2 if reader in ("pairs-csv", "pairs-tsv", "corpus-txt") else 1])
    del huge
    tracemalloc.start()
    try:
        too_long, kept = read(path, smoke_model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < READ_PEAK_BYTES, f"{reader}: {peak} bytes at the peak, reading a line of {line_chars}"
    assert kept == 2
    assert too_long == [None if reader in ("vectors", "sentences") else line_chars]


def write_lines(path: Path, lines: list[str]) -> Path:
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for line in lines:
            handle.write(line + "\n")
    return path


GZIP_BOMB_BYTES = 64 * 2**20
"""A few good lines, then 64 MiB of one byte: gzip packs it about a thousandfold, into some 64 KB."""


def gzip_bomb(path: Path, *lines: str) -> Path:
    import gzip

    block = b"x" * 2**20
    with gzip.open(path, "wb") as stream:
        stream.write("".join(line + "\n" for line in lines).encode())
        for _ in range(GZIP_BOMB_BYTES // len(block)):
            stream.write(block)
    return path


GZIP_READERS: dict[str, Callable[[Path, Path, object], list[str]]] = {
    "prepare": lambda d, b, m: (
        ["prepare", str(gzip_bomb(b.with_suffix(".jsonl.gz"), json.dumps(snli_record("a"))))]
        + ["--output-dir", str(d / "out")]
    ),
    "check-binarization": lambda d, b, m: [
        "check-binarization",
        str(gzip_bomb(b.with_suffix(".jsonl.gz"), json.dumps(snli_record("a")))),
    ],
    "label": lambda d, b, m: [
        "label",
        str(gzip_bomb(b.with_suffix(".csv.gz"), "premise,hypothesis", "A dog runs.,An animal moves.")),
        *["--model", str(m.checkpoint), "--output", str(d / "o.parquet"), "--parser", "model"],
    ],
    "embeddings": lambda d, b, m: (
        ["embeddings", "--vocab", str(m.prepared / "vocab.json")]
        + ["--source", str(gzip_bomb(b.with_suffix(".txt.gz"), "dog 0.1 0.2 0.3")), "--cache-dir", str(d / "e")]
    ),
}
"""Every command that reads a gzip stream (the pairs reader's files are gzip by content, whatever the name)."""


@pytest.mark.parametrize("command", GZIP_READERS)
def test_a_gzip_bomb_is_refused_once_it_expands_past_the_bound(command, smoke_model, tmp_path, monkeypatch):
    from spinn.data.limits import MAX_EXPANSION

    monkeypatch.chdir(tmp_path)
    arguments = GZIP_READERS[command](tmp_path, tmp_path / "bomb", smoke_model)
    result = CliRunner().invoke(main, arguments)
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and f"unpacks to more than {MAX_EXPANSION} times" in lines[-1], lines
    assert "a gzip bomb" in lines[-1] and "Traceback" not in result.stderr
