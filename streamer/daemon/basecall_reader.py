"""The daemon's basecall files parsed in a process of their own.

Parsing a BAM holds its thread's GIL about 50 µs a record (pysam, a Python object per record and its
CIGAR), and the daemon's stages share that GIL: at a PromethION's 24 Mbases/s, some 4,000 records
a second, about a fifth of it. Parsed in a reader process and handed back pickled, a record costs
the daemon about 4 µs (2 cores, the shared reads' BAM). Where reader processes do not fit the
memory budget (`pipeline.io_mode: threads`), or the process stops, the calling thread parses, as
before. Files that fail give the same `InputError` either way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Container
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from streamer.daemon.basecall_cache import ReadBasecalls, read_basecall_file
from streamer.io.alignments import AlignmentFilter
from streamer.pipeline.signal_pool import ReaderProcesses

log = logging.getLogger(__name__)


class BasecallReader:
    """`read_basecall_file` in one reader process (started at the first file), or in the caller."""

    def __init__(self, processes: bool):
        self._processes = processes
        self._pool: ReaderProcesses | None = None
        self._lock = threading.Lock()

    def __call__(self, path: Path, fmt: str, filt: AlignmentFilter,
                 wanted: Container[str] | None = None) -> dict[str, ReadBasecalls]:  # fmt: skip
        pool = self._open()
        if pool is not None:
            try:
                return pool.submit(read_basecall_file, path, fmt, filt, wanted).result()
            except BrokenProcessPool:
                log.warning("the basecall parsing process stopped; basecall files are parsed in the daemon from now on")
                with self._lock:
                    self._processes = False
        return read_basecall_file(path, fmt, filt, wanted)

    def _open(self) -> ReaderProcesses | None:
        with self._lock:
            if self._processes and self._pool is None:
                self._pool = ReaderProcesses(1, None)
            return self._pool if self._processes else None

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._processes = self._pool, None, False
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
