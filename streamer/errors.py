"""One root exception, with subclasses that name what went wrong and where.

Bad input data never raises past a batch: readers and stages turn it into a
`Skipped` (with its `Skip` reason) for that read. These exceptions are for conditions that stop a
command (a missing reference, a malformed model, a bad config).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class StreamerError(Exception):
    """Root of every error streamer raises on purpose."""


class InputError(StreamerError):
    """An input file is missing, unreadable or malformed.

    The message names the file, and the read or line where it applies.
    """

    def __init__(self, path, reason: str, read_id: str | None = None, line: int | None = None):
        self.path = str(path)
        self.reason = reason
        self.read_id = read_id
        self.line = line
        where = self.path
        if line is not None:
            where += f":{line}"
        if read_id is not None:
            where += f" (read {read_id})"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        """Pickled as its parts, so that one raised in a reader process arrives whole."""
        return type(self), (self.path, self.reason, self.read_id, self.line)


def os_failure(exc: OSError, kind: str) -> str:
    """Why a file of `kind` ("POD5", "signal", ...) could not be read, in the words a user needs."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return f"is a directory, not a {kind} file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return f"cannot read ({exc.strerror or exc})"


@contextmanager
def reading(path, kind: str) -> Iterator[None]:
    """Turn an `OSError` met while reading `path` into the `InputError` that names it."""
    try:
        yield
    except OSError as exc:
        raise InputError(path, os_failure(exc, kind)) from exc


class ModelError(InputError):
    """A pore model file is malformed."""


class UsageError(StreamerError):
    """The command line itself is wrong: a value out of range, flags that do not go together (exit 2)."""


class ConfigError(StreamerError):
    """The configuration is invalid; the message carries the key path."""


def one_line(exc: BaseException) -> str:
    """An unexpected exception as one line for a log or a table: its type and first message line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is Ctrl-C, or an error it caused: a KeyboardInterrupt raised inside a compiled
    kernel comes out as numba's `SystemError` ("returned a result with an exception set")."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False
