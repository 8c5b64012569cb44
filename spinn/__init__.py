"""spinn: SPINN tree-structured networks for natural language inference."""

from spinn.ground import cores  # noqa: F401  (first: it sets OpenMP's wait before anything here loads torch)

__version__ = "0.1.0"
