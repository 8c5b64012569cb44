"""The one exception type the CLI turns into a clean one-line error, and the one warning type.

Every stage raises `SpinnError` (or a subclass) for problems the user can fix:
bad input, a wrong checksum, a missing file. The CLI prints its message on one
line and exits non-zero; anything else is a bug and keeps its traceback. A
`SpinnWarning` is a result the user should doubt (a corpus the model mostly
cannot read): the CLI prints it as one `warning: ...` line and goes on.
"""

import re
from collections.abc import Callable

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
REDACTED = "***"


class SpinnError(Exception):
    """A user-facing failure whose message names the file and what was expected.

    `fix`, when set, is (setting, advice): the setting that would mend it and what to do, with `{}` where
    each front end names that setting in its own words (`--checksum` on the command line,
    `corpus.download.checksum` in a flow), so neither speaks the other's language. The setting may be a
    tuple of settings, named in the order of the advice's `{}`s."""

    fix: tuple[str | tuple[str, ...], str] | None = None

    def __init__(self, message: str, *, fix: tuple[str | tuple[str, ...], str] | None = None) -> None:
        super().__init__(message)
        if fix is not None:
            self.fix = fix


class SpinnWarning(UserWarning):
    """A user-facing doubt about a result, whose message names the file."""


def one_line(error: BaseException) -> str:
    """The error's message with its notes (what a failed run left behind, say) joined on: one line, with any
    credentials in a URL redacted, since every front end prints or stores this line."""
    return redact("; ".join([str(error), *getattr(error, "__notes__", [])]))


def redact(text: str) -> str:
    """`https://user:token@host/x` -> `https://***@host/x`: credentials in any URL of `text` hidden, for
    every line a command prints, logs or records (error lines, lock files, download messages)."""
    return _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{REDACTED}@", text)


def advice(error: BaseException, name: Callable[[str], str]) -> str | None:
    """The error's fix in a front end's words (`name` turns a setting into an option or a parameter)."""
    fix = getattr(error, "fix", None)
    if fix is None:
        return None
    settings, words = fix
    return words.format(*map(name, (settings,) if isinstance(settings, str) else settings))


def option_name(setting: str) -> str:
    """`checksum` -> `--checksum`: a setting as the command line spells it."""
    return "--" + setting.replace("_", "-")
