"""The daemon's journal: the row outputs, appended batch by batch and cut back to the ledger.

`meth.tsv` and `skipped.tsv` grow by whole batches: rows are appended, flushed and fsynced,
and only then does the ledger commit the new end offsets. At start, `Journal` cuts each file
back to its committed offset, which drops the rows of a batch that was written but never
committed (a crash between the two steps); those reads are still open and are redone.
`eventalign.tsv`, when enabled, is one more such file. A file keeps the columns it was started
with: a header that no longer matches the configuration stops the start. The derived tables
(`meth-freq.tsv`, `meth.bed`, `summary.json`) are not journaled: they are replaced whole
(`streamer.sinks.write_atomic`).

The journal also holds the output folder: an exclusive lock (`.streamer.lock`, naming the
holder's pid) keeps a second daemon out whatever its state folder, and a small reserved file
(`.streamer.reserve`) is given back when the daemon fails, so that `summary.json` can still
say why on a full disk.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from streamer.errors import ConfigError
from streamer.daemon.ledger_schema import LedgerError

log = logging.getLogger(__name__)

SKIPPED_HEADER = "read_id\treason\tdetail\n"
LOCK = ".streamer.lock"
RESERVE = ".streamer.reserve"
RESERVE_BYTES = 64 * 1024  # summary.json with the whole configuration is a few KiB


class Journal:
    """Append-only outputs whose committed length the ledger holds."""

    def __init__(self, out_dir: Path, headers: Mapping[str, str], committed: Mapping[str, int]):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {}
        self._offsets: dict[str, int] = {}
        self.fresh: dict[str, int] = {}  # outputs created now: their header offsets, still to commit
        self._lock_fd: int | None = lock_output(self.dir)
        try:
            _reserve(self.dir / RESERVE)
            for name, header in headers.items():
                self._files[name] = self._open(name, header, committed.get(name))
        except BaseException:
            self.close()
            raise

    def _open(self, name: str, header: str, committed: int | None):
        path = self.dir / name
        if committed is None:
            if path.exists() and not header.encode().startswith(path.read_bytes()[: len(header) + 1]):
                raise LedgerError(f"{path} exists but the ledger has no record of it; use an empty output "
                                  "folder, or the state folder that wrote it")
            fh = open(path, "wb")
            fh.write(header.encode())
            self._sync(fh)
            self.fresh[name] = self._offsets[name] = fh.tell()
            return fh
        if not path.exists():
            raise LedgerError(f"{path} is missing, but the ledger has {committed} bytes of it committed")
        fh = open(path, "r+b")
        if committed and fh.readline() != header.encode():
            fh.close()
            raise LedgerError(f"{path} was written with other columns than this configuration gives ({header!r}); "
                              "restore the settings it was written with, or move it away")
        size = fh.seek(0, os.SEEK_END)
        if size < committed:
            fh.close()
            raise LedgerError(f"{path} is {size} bytes, shorter than the {committed} the ledger committed: "
                              "it was changed outside streamer")
        if size > committed:
            log.warning("%s: removing %d bytes written by a batch that was never committed (it is redone)",
                        path, size - committed)
            fh.truncate(committed)
            self._sync(fh)
        fh.seek(committed)
        self._offsets[name] = committed
        return fh

    @staticmethod
    def _sync(fh) -> None:
        fh.flush()
        os.fsync(fh.fileno())

    def append(self, lines: Mapping[str, list[str]]) -> dict[str, int]:
        """Append each file's lines, flush and fsync; the new offsets, for the ledger to commit."""
        for name, rows in lines.items():
            if rows:
                fh = self._files[name]
                fh.write("".join(rows).encode())
                self._sync(fh)
                self._offsets[name] = fh.tell()
        return dict(self._offsets)

    def path(self, name: str) -> Path:
        return self.dir / name

    def release_reserve(self) -> None:
        """Give the reserved space back (the daemon failed: what it writes now must fit)."""
        (self.dir / RESERVE).unlink(missing_ok=True)

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files = {}
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def check_output_free(out_dir: Path) -> None:
    """`lock_output`'s refusal before anything slow (models, kernels) is done; the lock is not kept."""
    if (Path(out_dir) / LOCK).exists():
        os.close(lock_output(Path(out_dir)))


def lock_output(out_dir: Path) -> int:
    """The output folder's exclusive lock (its descriptor), or a `ConfigError` naming the holder.

    A configuration error (exit 78): two daemons given one output folder stay in conflict however
    often either is restarted, and each state folder would disown the other's rows.
    """
    path = out_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(f"output.dir {out_dir}: another streamer daemon (pid {holder}) writes to this output "
                          "folder; give each daemon its own") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _reserve(path: Path) -> None:
    """Hold `RESERVE_BYTES` of the output folder's file system (kept across starts)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
                raise
            os.pwrite(fd, bytes(RESERVE_BYTES), 0)
            os.fsync(fd)
    finally:
        os.close(fd)
