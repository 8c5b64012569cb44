"""`spinn bench` and `spinn bench-label`: speed measurements, and the seed article's algorithm they compare with.

timing.py times training and inference steps (and the label stage); reference.py is the seed article's
per-example-stack SPINN, kept only as the yardstick `--impl reference` runs.
"""

from spinn.bench.timing import BenchSettings, load_examples, run_bench, run_label_bench, take_batches

__all__ = ["BenchSettings", "load_examples", "run_bench", "run_label_bench", "take_batches"]
