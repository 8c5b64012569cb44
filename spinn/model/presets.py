"""The paper's settings per variant, in one table: the model, and the optimiser's learning rate and L2.

Bowman et al. 2016, appendix hyperparameter table (300D models). Dropout here is
the drop probability (the paper lists keep rates). `cbow` takes the paper's
sequence baseline's optimiser and pi-nt's model shape, the closest it tuned;
`rl` is not in the paper: spinn's shape and optimiser, learning its trees from
the reward alone (no transition supervision).
"""

from __future__ import annotations

from dataclasses import dataclass

from spinn.model.config import SPINNConfig, Variant


@dataclass(frozen=True)
class Preset:
    """A variant's paper settings: its model, and RMSprop's initial learning rate and L2 strength (training's)."""

    model: SPINNConfig
    learning_rate: float
    weight_decay: float


_PI_NT = SPINNConfig(
    variant="pi-nt",
    d_embed=300,
    d_hidden=300,
    d_tracker=0,
    mlp_layers=2,
    mlp_dim=1024,
    embed_dropout=0.17,
    mlp_dropout=0.06,
    use_batch_norm=True,
)
_SPINN = SPINNConfig(
    variant="spinn",
    d_embed=300,
    d_hidden=300,
    d_tracker=79,
    mlp_layers=1,
    mlp_dim=1024,
    embed_dropout=0.14,
    mlp_dropout=0.06,
    use_batch_norm=True,
    transition_loss_weight=3.9,
)

PRESETS: dict[Variant, Preset] = {
    "pi-nt": Preset(_PI_NT, learning_rate=3e-4, weight_decay=3e-6),
    "pi": Preset(
        SPINNConfig(
            variant="pi",
            d_embed=300,
            d_hidden=300,
            d_tracker=61,
            mlp_layers=2,
            mlp_dim=1024,
            embed_dropout=0.08,
            mlp_dropout=0.07,
            use_batch_norm=True,
        ),
        learning_rate=7e-3,
        weight_decay=2e-5,
    ),
    "spinn": Preset(_SPINN, learning_rate=2e-3, weight_decay=3e-5),
    "rl": Preset(_SPINN.replace(variant="rl", transition_loss_weight=0.0), learning_rate=2e-3, weight_decay=3e-5),
    "cbow": Preset(_PI_NT.replace(variant="cbow"), learning_rate=5e-3, weight_decay=4e-6),
}
"""Every variant's paper preset; a training run's unset fields take its variant's (TrainConfig)."""
