"""Pure tree code: trees, binarization, shift/reduce transitions and drawings. Imports nothing above it."""
