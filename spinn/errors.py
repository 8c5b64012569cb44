"""The one exception type the CLI turns into a clean one-line error, and the one warning type.

Every stage raises `SpinnError` (or a subclass) for problems the user can fix:
bad input, a wrong checksum, a missing file. The CLI prints its message on one
line and exits non-zero; anything else is a bug and keeps its traceback. A
`SpinnWarning` is a result the user should doubt (a corpus the model mostly
cannot read): the CLI prints it as one `warning: ...` line and goes on.
"""


class SpinnError(Exception):
    """A user-facing failure whose message names the file and what was expected."""


class SpinnWarning(UserWarning):
    """A user-facing doubt about a result, whose message names the file."""


def one_line(error: BaseException) -> str:
    """The error's message with its notes (what a failed run left behind, say) joined on: one line."""
    return "; ".join([str(error), *getattr(error, "__notes__", [])])
