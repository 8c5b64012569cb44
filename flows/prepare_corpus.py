"""prepare-corpus: download -> prepare train/dev/test -> vocabulary -> word vectors.

The flow only orchestrates: every step is a `spinn` stage (flows/tasks.py),
cached on the contents of what it reads, so a rerun skips what is done and
redoes only what changed or went missing.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel

from flows import tasks
from flows.artifacts import PREPARED_CORPUS_KEY, PREPARED_VOCABULARY_KEY, split_counts, vocabulary_facts
from flows.caching import run_stage
from flows.flow_requests import CorpusRequest
from spinn.ground import children


class PreparedCorpus(BaseModel):
    """Where the prepared data is, and what each stage counted."""

    splits: dict[str, Path]
    vocab: Path
    counts: dict[str, dict]
    vocab_entries: int
    embeddings: dict


@flow(name="prepare-corpus", log_prints=True)
def prepare_corpus(corpus: CorpusRequest | None = None) -> PreparedCorpus:
    """Download and verify the corpus, prepare its splits, build the vocabulary and align word vectors.

    Each stage's settings are params.yaml's section under what the request
    overrides, as for `dvc repro`, so the matrix is cached exactly where
    `spinn train` will look for it.
    """
    children.stop_when_orphaned()  # a worker's flow run ends with its worker, as a command with its starter
    corpus = corpus or CorpusRequest()
    stages = corpus.stages()
    run_stage(tasks.download_stage, raw_dir=corpus.raw_dir, settings=stages.download)
    archive = corpus.raw_dir / stages.download.archive_name
    counts = {}
    for split, member in corpus.split_files(stages).items():
        output = run_stage(
            tasks.prepare_stage,
            archive=archive,
            member=member,
            split=split,
            output_dir=corpus.prepared_dir,
            settings=stages.prepare,
        )
        counts[split] = output.summary
    vocab = run_stage(
        tasks.vocab_stage, train=corpus.split_path("train"), output=corpus.vocab_path, settings=stages.vocab
    )
    vectors = run_stage(
        tasks.embeddings_stage, vocab=corpus.vocab_path, settings=stages.embeddings, cache_dir=corpus.embeddings_dir
    )
    create_table_artifact(
        split_counts(counts),
        key=PREPARED_CORPUS_KEY,
        description=f"{stages.download.corpus}: pairs read, written and rejected",
    )
    create_table_artifact(
        vocabulary_facts(vocab.summary, vectors.summary),
        key=PREPARED_VOCABULARY_KEY,
        description=f"{stages.download.corpus}: vocabulary and word vectors",
    )
    return PreparedCorpus(
        splits={split: corpus.split_path(split) for split in corpus.split_files(stages)},
        vocab=corpus.vocab_path,
        counts=counts,
        vocab_entries=vocab.summary["entries"],
        embeddings=vectors.summary,
    )
