"""The one exception type the CLI turns into a clean one-line error, and the one warning type.

Every stage raises `SpinnError` (or a subclass) for problems the user can fix:
bad input, a wrong checksum, a missing file. The CLI prints its message on one
line and exits non-zero; anything else is a bug and keeps its traceback. A
`SpinnWarning` is a result the user should doubt (a corpus the model mostly
cannot read): the CLI prints it as one `warning: ...` line and goes on.
"""

import errno
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&#;](?:[^=&#;\s]*?)(?:sig|token|key|secret|pass|pwd|credential|auth|session|policy)[^=&#;\s]*=)"
    r"(?:[^&#;:\s'\"]|:(?!\s|$))*",  # the value, up to the next parameter or the end of the URL
    re.IGNORECASE,
)
"""A query or fragment parameter whose name says it holds a secret (X-Amz-Signature, X-Amz-Credential,
X-Amz-Security-Token, Azure's sig, token, access_token, api_key, password, Policy): its value is redacted;
other parameters (dl=1, version) are shown."""
REDACTED = "***"


DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errnos of a full disk (or quota)."""
SQLITE_FULL = "database or disk is full"
"""What SQLite (the MLflow store) says when its disk is full; MLflow and SQLAlchemy wrap it."""


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
    """`https://user:token@host/x?X-Amz-Signature=abc` -> `https://***@host/x?X-Amz-Signature=***`:
    credentials in any part of any URL of `text` hidden (user info, and the query's or fragment's secret
    parameters), for every line a command prints, logs or records (error lines, lock files, messages)."""
    text = _URL_CREDENTIALS.sub(lambda match: f"{match['scheme']}{REDACTED}@", text)
    return _SECRET_PARAMETER.sub(lambda match: f"{match['name']}{REDACTED}", text)


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


# ----------------------------------------------------------------------------- what a library's failure means

_UNPICKLER_DETAIL = re.compile(r"WeightsUnpickler error:\s*(?P<detail>[^\n]+)")


def refused_checkpoint(path: object, error: BaseException) -> SpinnError:
    """A checkpoint torch.load(weights_only=True) would not read, said so the user can act on it.

    torch's own message advises rerunning with weights_only=False, which runs
    whatever code the file carries: the one thing never to do with a file of
    unknown origin. What is true is that the file holds objects no spinn
    checkpoint holds: it is not one of ours, or it came from a source that
    should not be trusted."""
    text = str(error)
    if "weights_only" in text:
        match = _UNPICKLER_DETAIL.search(text)
        detail = f" ({match['detail'].strip()})" if match else ""
        return SpinnError(
            f"{path}: not a spinn checkpoint, or one from an untrusted source: it holds objects a spinn checkpoint "
            f"never holds{detail}; it was not loaded"
        )
    first_line = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return SpinnError(f"{path}: not a readable spinn checkpoint ({first_line})")


def misfit_weights(path: object, expected: Mapping[str, Any], saved: Mapping[str, Any]) -> SpinnError:
    """Weights that do not fit the model their config builds, naming the first tensor that differs and both
    shapes (`expected`: the built model's state dict; `saved`: the checkpoint's)."""
    for name, tensor in expected.items():
        if name not in saved:
            return SpinnError(f"{path}: weights do not fit the model config: the checkpoint has no {name}")
        if tuple(saved[name].shape) != tuple(tensor.shape):
            return SpinnError(
                f"{path}: weights do not fit the model config: {name} is {tuple(saved[name].shape)} in the "
                f"checkpoint, {tuple(tensor.shape)} in the model its config builds"
            )
    extra = next((name for name in saved if name not in expected), None)
    return SpinnError(f"{path}: weights do not fit the model config: the checkpoint has {extra}, the model has not")


MLFLOW_TIMEOUT_VARIABLE = "MLFLOW_HTTP_REQUEST_TIMEOUT"
"""MLflow's own setting of seconds per request to a tracking server (spinn's tracking door gives it a default)."""


def unanswered(error: BaseException) -> str | None:
    """One line for a tracking server that did not answer (a timeout, a refused or broken connection)
    anywhere in `error`'s chain, its URI's credentials hidden; None for any other error."""
    chain = _chain(error)
    requests = sys.modules.get("requests")
    if requests is None or not any(isinstance(link, requests.RequestException) for link in chain):
        return None
    timeout = os.environ.get(MLFLOW_TIMEOUT_VARIABLE)
    if any(isinstance(link, TimeoutError | requests.Timeout) for link in chain):
        why = f"within {timeout} s"
    else:
        last = chain[-1]
        why = f"({type(last).__name__}: {str(last).splitlines()[0] if str(last) else 'no reason'})"
    uri = os.environ.get("MLFLOW_TRACKING_URI", "the default store")
    return redact(
        f"the MLflow tracking server {uri} did not answer {why}; check MLFLOW_TRACKING_URI, or give it longer "
        f"with {MLFLOW_TIMEOUT_VARIABLE} (seconds, now {timeout})"
    )


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and every exception it was raised from or while handling, outermost first."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def disk_full(error: BaseException) -> str | None:
    """One line for a full disk anywhere in `error`'s chain (a checkpoint writer's OSError, the MLflow store's
    wrapped SQLite error), naming the file and the device it lives on, else None: the CLI's one rule for what
    no stage translated itself."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in DISK_FULL:
            if not link.filename:
                return "no space left on the device (the writer did not name its file)"
            return f"no space left on {device_of(Path(link.filename))} writing {link.filename}"
        if SQLITE_FULL in str(link):
            store = _sqlite_store()
            if store is None:
                return f"no space left on the device of the MLflow store ({SQLITE_FULL})"
            return f"no space left on {device_of(store)} writing the MLflow store {store} ({SQLITE_FULL})"
    return None


def failure_line(error: BaseException, name: Callable[[str], str]) -> str | None:
    """What every front end (each `spinn` command, `spinn-pipeline`) prints for a failure the user can act on,
    as one line without its `error: `: a SpinnError with its fix in the front end's words (`name`), a full
    disk, a tracking server that did not answer. None for anything else: a bug, which keeps its traceback."""
    if isinstance(error, SpinnError):
        fix = advice(error, name)
        return one_line(error) + (f"; {fix}" if fix else "")
    return disk_full(error) or unanswered(error)


def _sqlite_store() -> Path | None:
    """The file of the sqlite MLflow store MLFLOW_TRACKING_URI names (its default, mlflow.db, when unset)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]) if uri.startswith("sqlite:///") else None


def device_of(path: Path) -> str:
    """`/dev/vda1 (mounted at /data)`: the filesystem `path` lives on, for a disk-full message."""
    mount = Path(os.path.abspath(path))
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        mounts = []
    sources = [line.split()[0] for line in mounts if len(line.split()) > 1 and line.split()[1] == str(mount)]
    return f"{sources[-1]} (mounted at {mount})" if sources else f"the device mounted at {mount}"
