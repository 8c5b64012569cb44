"""The training stage: settings, the run, the loop, the sync-free step, resume and publishing."""
