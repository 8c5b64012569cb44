"""Corpora and their preparation: download, reading and validating, Parquet schema, vocabulary, word vectors."""
