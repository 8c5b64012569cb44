"""Saving a figure: drawn with matplotlib for files only, written as a PNG, always closed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DPI = 120


@contextmanager
def saved_figure(path: Path, size: tuple[float, float]) -> Iterator[Any]:
    """The axes of a new figure of `size` inches; when the block ends the figure is written to `path`
    (its folder made) and closed, also when drawing failed."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=size, dpi=DPI)
    try:
        yield axes
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
    finally:
        plt.close(figure)
