"""SPINN itself: config, cells, thin stack, encoder and loss, batches, checkpoints and loading."""
