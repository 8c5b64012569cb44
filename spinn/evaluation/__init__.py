"""The evaluate stage and the scores it shares with training's dev evaluation: metrics, calibration, scheme scores."""
