"""The one exception type the CLI turns into a clean one-line error.

Every stage raises `SpinnError` (or a subclass) for problems the user can fix:
bad input, a wrong checksum, a missing file. The CLI prints its message on one
line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class SpinnError(Exception):
    """A user-facing failure whose message names the file and what was expected."""
