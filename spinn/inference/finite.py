"""A probability that is not finite is never written: a model whose weights went NaN (issue 22, class 3)
labels nothing, instead of calling every row "entailment" with NaN probabilities."""

from __future__ import annotations

from collections.abc import Sequence

import numpy

from spinn.ground.errors import SpinnError


def check_probabilities(probabilities: numpy.ndarray, rows: Sequence[int], model: str) -> None:
    """Refuse (one line naming the first such row and the model) when any of the (N, C) probabilities of
    the N `rows` is NaN or infinite."""
    finite = numpy.isfinite(probabilities).all(axis=1)
    if not finite.all():
        first = int(numpy.flatnonzero(~finite)[0])
        raise SpinnError(
            f"row {rows[first]}: model {model} gives probabilities that are not finite "
            f"({', '.join(map(str, probabilities[first].tolist()))}); its weights are not finite, nothing written"
        )
