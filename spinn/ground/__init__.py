"""The ground every layer stands on: atomic publishing and locks, errors, the Settings base, workers that end
with their parent, memory, paths, cores and the thread rule, progress lines. It imports nothing above it."""
