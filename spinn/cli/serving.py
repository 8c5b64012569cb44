"""`spinn relog-model`: the registered model as an MLflow model."""

from __future__ import annotations

import click


@click.command("relog-model")
@click.argument("model_uri", metavar="MODEL")
def relog_model(model_uri: str) -> None:
    """Re-register a version registered as a folder of files (spinn 0.1.0 and before; e.g. models:/spinn/3) as an
    MLflow logged model, without retraining: its tags and description are copied and its aliases move to
    the new version, which `mlflow.pyfunc.load_model` and `mlflow models serve` can load."""
    from spinn.serving.relog import relog_version

    relogged = relog_version(model_uri)
    moved = f"; {', '.join('@' + alias for alias in relogged.aliases)} moved to it" if relogged.aliases else ""
    click.echo(f"{relogged.old} re-registered as {relogged.new} (logged model {relogged.model_id}){moved}")
