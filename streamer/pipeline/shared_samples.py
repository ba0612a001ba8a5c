"""Samples, and other large results, handed from a reader process to its owner through a file under
/dev/shm, not a pipe.

The reader writes a task's int16 samples (or a parsed file, pickled) to a new file and sends its
name (`write`); the owner maps the file and unlinks it at once (`mapped`, `unpickled`), so the pages
are freed when the array is. Sent through the pipe, every byte would be read and unpickled on the
owner's result thread, holding the GIL, a pipe-full at a time, waiting for it again before each
(seconds for a BAM's reads beside busy stages). No resource tracker is involved, and nothing is left behind: a pool's files are named
`streamer-<owner pid>-<pool>-<reader pid>-<n>`; a reader whose owner is gone removes the files it
made that were not taken (`remove_untaken`), a pool's shutdown those of its readers that died
mid-task (`SharedFiles.left`), and a new pool those of owners that died (`place`).
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import pickle
import secrets
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
MIN_BYTES = 1 << 16  # samples below this go through the pipe: a file costs more system calls than the copy
# Linux: the pages mapped in one call, not one fault each; from Python 3.12, which lets the GIL go around
# mmap(2) (before, the owner's result thread would hold it while the kernel maps the pages in)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0) if sys.version_info >= (3, 12) else 0


@dataclass(frozen=True)
class SharedFiles:
    """Where one pool's readers put the samples they hand back: `folder`/`prefix`<reader pid>-<n>."""

    folder: Path
    prefix: str  # streamer-<owner pid>-<pool>-

    def left(self) -> list[Path]:
        """The pool's files still there: none once every result was taken."""
        return _files(self.folder, self.prefix)


_told_pipe = False


def place(folder: Path = SHM) -> SharedFiles | None:
    """A new pool's files in `folder`, after removing those of owners that died; None (said once, at
    debug) where `folder` cannot be written (macOS, some containers): samples then go through the pipe."""
    global _told_pipe
    if not os.access(folder, os.W_OK | os.X_OK):
        if not _told_pipe:
            log.debug("%s missing or not writable: reader processes send samples through their pipes", folder)
            _told_pipe = True
        return None
    remove(path for path in _files(folder, "streamer-") if _owner_gone(path.name))
    return SharedFiles(folder, f"streamer-{os.getpid()}-{secrets.token_hex(4)}-")


def mapped(path: str, count: int) -> np.ndarray:
    """In the owner: the `count` samples of a reader's file, mapped, the file unlinked at once (the
    mapping lives as long as the array and its views)."""
    return np.frombuffer(_map(path, 2 * count), np.int16)


def unpickled(path: str, nbytes: int) -> Any:
    """In the owner: what a reader pickled into its file (`nbytes` long), the file unlinked and let go."""
    buf = _map(path, nbytes)
    try:
        return pickle.loads(buf)
    finally:
        buf.close()


def _map(path: str, nbytes: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)


# In a reader process: the files it made that its owner has not yet taken.
_made: set[str] = set()
_made_lock = threading.Lock()
_serial = itertools.count()
_told_write = False


def write(files: SharedFiles, raw: np.ndarray | bytes) -> str | None:
    """In a reader: `raw` (int16 samples, or bytes) written to a new file of `files`, its path; None where it
    is small or no file takes it. Written, not mapped: a full /dev/shm gives an error here rather than a SIGBUS."""
    global _told_write
    data = memoryview(np.ascontiguousarray(raw, np.int16) if isinstance(raw, np.ndarray) else raw).cast("B")
    if data.nbytes < MIN_BYTES:
        return None
    path = str(files.folder / f"{files.prefix}{os.getpid()}-{next(_serial)}")
    try:
        with _made_lock:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            _made.add(path)
    except OSError as exc:
        error = exc
    else:
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
            return path
        except OSError as exc:
            error = exc
            remove([path])
        finally:
            os.close(fd)
    if not _told_write:
        log.debug("reader %d: results through the pipe (%s)", os.getpid(), error)
        _told_write = True
    return None


def forget_taken() -> None:
    """In a reader: stop tracking the files its owner has taken (unlinked)."""
    global _made
    with _made_lock:
        _made = {path for path in _made if os.path.exists(path)}


def remove_untaken() -> None:
    """In a reader whose owner is gone, as it exits: remove the files it made that the owner did not take.
    A task still running makes no file after it (the lock is kept)."""
    _made_lock.acquire()
    remove(_made)


def remove(paths: Iterable[Path | str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:  # gone already, or another user's
            pass


def gone(pid: int) -> bool:
    """Process `pid` has ended (a zombie has: it can read no pipe and map no file)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: the pid is another user's now
        return True
    return _is_zombie(pid)


def _owner_gone(name: str) -> bool:
    owner = name.split("-")[1]
    return owner.isdigit() and gone(int(owner))


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0] == b"Z"
    except (OSError, IndexError):
        return False  # no /proc (macOS): os.kill alone decides


def _files(folder: Path, prefix: str) -> list[Path]:
    try:
        return [folder / name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return []
