"""`Example`: one sentence pair as word ids, the unit a batch is made of.

Its own module, importing nothing, so that the model layer (spinn.model.batch)
can name what it batches without reaching the corpus readers behind
spinn.data.pairs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """One sentence pair as ids: what a batch is made of."""

    premise: tuple[int, ...]
    premise_transitions: tuple[int, ...]
    hypothesis: tuple[int, ...]
    hypothesis_transitions: tuple[int, ...]
    label: int | None = None

    @property
    def length(self) -> int:
        """The longer sentence sets the number of steps the pair needs."""
        return max(len(self.premise), len(self.hypothesis))
