"""Drift: how far a label run's label shares are from the model's own predictions on its dev split.

A scheduled labelling job whose input changes (another source, another
language, a broken upstream step) shows it in the shares of labels the model
gives long before anyone reads the rows. The reference is what the same model
predicted on its dev split when it was trained, read from the dev scores its
checkpoint keeps (`predicted_shares`, written by training); the figure is
the total variation distance, 0 for the same shares, 1 for disjoint ones.
"""

from __future__ import annotations

from spinn.model.checkpoint import DEV_SHARES_KEY, Checkpoint

NO_REFERENCE = (
    "drift not measured: the model's checkpoint keeps no dev label shares (a last.pt, or a model trained "
    "before they were recorded)"
)


def dev_label_shares(saved: Checkpoint) -> dict[str, float] | None:
    """The share of each label in the model's predictions on dev, from its checkpoint; None when it has none."""
    shares = (saved.metrics or {}).get(DEV_SHARES_KEY)
    return None if not shares else {label: float(share) for label, share in shares.items()}


def total_variation(shares: dict[str, float], reference: dict[str, float]) -> float:
    """Half the summed absolute differences of two distributions over the same labels, in [0, 1]."""
    return 0.5 * sum(abs(shares.get(label, 0.0) - reference.get(label, 0.0)) for label in shares.keys() | reference)
