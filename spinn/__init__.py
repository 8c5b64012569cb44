"""spinn: SPINN tree-structured networks for natural language inference."""

__version__ = "0.1.0"
