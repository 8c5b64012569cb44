"""Running a trained model without gradients: one predict() and the CUDA graphs it shares with training."""
