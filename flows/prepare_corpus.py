"""prepare-corpus: download -> prepare train/dev/test -> vocabulary -> word vectors.

The flow only orchestrates: every step is a `spinn` stage (flows/tasks.py),
cached on the contents of what it reads, so a rerun skips what is done and
redoes only what changed or went missing.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel

from flows import tasks
from flows.artifacts import corpus_markdown
from flows.caching import run_stage
from flows.settings import CorpusSettings, TrainSettings


class PreparedCorpus(BaseModel):
    """Where the prepared data is, and what each stage counted."""

    splits: dict[str, Path]
    vocab: Path
    counts: dict[str, dict]
    vocab_entries: int
    embeddings: dict


@flow(name="prepare-corpus", log_prints=True)
def prepare_corpus(corpus: CorpusSettings | None = None, training: TrainSettings | None = None) -> PreparedCorpus:
    """Download and verify the corpus, prepare its splits, build the vocabulary and align word vectors.

    `training` names the params file whose `vocab` and `embeddings` sections
    set the vocabulary and word vectors, as they do for `dvc repro`, so the
    matrix is cached exactly where `spinn train` will look for it.
    """
    corpus, training = corpus or CorpusSettings(), training or TrainSettings()
    run_stage(tasks.download_stage, corpus=corpus.corpus, raw_dir=corpus.raw_dir, url=corpus.url, file=corpus.file,
              checksum=corpus.checksum)
    counts = {}
    for split, member in corpus.split_files.items():
        output = run_stage(tasks.prepare_stage, archive=corpus.archive, member=member, split=split,
                           output_dir=corpus.prepared_dir, max_reject_ratio=corpus.max_reject_ratio,
                           workers=corpus.workers)
        counts[split] = output.summary
    vocab = run_stage(tasks.vocab_stage, train=corpus.split_path("train"), output=corpus.vocab_path,
                      settings=training.vocab_settings())
    config = training.train_config()
    vectors = run_stage(tasks.embeddings_stage, vocab=corpus.vocab_path, source=config.embeddings, oov=config.oov,
                        seed=config.embeddings_seed, cache_dir=corpus.embeddings_dir)
    create_markdown_artifact(corpus_markdown(corpus.corpus, counts, vocab.summary, vectors.summary),
                             key="spinn-prepared-corpus", description="Pairs read, written and rejected per split")
    return PreparedCorpus(splits={split: corpus.split_path(split) for split in corpus.split_files},
                          vocab=corpus.vocab_path, counts=counts, vocab_entries=vocab.summary["entries"],
                          embeddings=vectors.summary)
