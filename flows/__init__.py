"""Prefect flows: they orchestrate the spinn stages and hold no NLP logic."""
