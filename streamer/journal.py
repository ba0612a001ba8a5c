"""The daemon's journal: the row outputs, appended batch by batch and cut back to the ledger.

`meth.tsv` and `skipped.tsv` grow by whole batches: rows are appended, flushed and fsynced,
and only then does the ledger commit the new end offsets. At start, `Journal` cuts each file
back to its committed offset, which drops the rows of a batch that was written but never
committed (a crash between the two steps); those reads are still open and are redone.
`eventalign.tsv`, when enabled, is one more such file. A file keeps the columns it was started
with: a header that no longer matches the configuration stops the start. The derived tables
(`meth-freq.tsv`, `meth.bed`, `summary.json`) are not journaled: they are replaced whole
(`streamer.sinks.write_atomic`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from streamer.ledger import LedgerError

log = logging.getLogger(__name__)

SKIPPED_HEADER = "read_id\treason\tdetail\n"


class Journal:
    """Append-only outputs whose committed length the ledger holds."""

    def __init__(self, out_dir: Path, headers: Mapping[str, str], committed: Mapping[str, int]):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {}
        self._offsets: dict[str, int] = {}
        self.fresh: dict[str, int] = {}  # outputs created now: their header offsets, still to commit
        try:
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

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files = {}
