"""The training and evaluation stages: settings, the training loop, metrics."""
