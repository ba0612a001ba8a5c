"""Input files parsed in reader processes of their own, off the GIL the stages share.

Parsing a BAM holds the parsing thread's GIL some 35-55 µs a record (pysam: a Python object per
record and its CIGAR), and a run's stages need that GIL between their kernels; handed back pickled,
a record costs about 3-4 µs of unpickling (2 cores). A large result comes back pickled in a file
under /dev/shm (`streamer.pipeline.shared_samples`), read by the caller in one call: through the
pool's pipe, a BAM of 1,000 reads took 2 s to come back beside two busy threads on 2 cores, against
0.2 s. The daemon's landed files (`begin`: a signal file's read ids, a basecall file's reads with
`streamer.daemon.basecall_cache.read_basecall_file`) and `streamer call`'s alignment records
(`records`, one process) go through them where reader processes fit the memory budget; where they
do not, or the process stops, the calling thread parses, as before, with the same results and errors.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from streamer.io.alignments import AlignmentFilter, AlignmentRecord, iter_alignments
from streamer.pipeline import shared_samples, timeline
from streamer.pipeline.shared_samples import SharedFiles
from streamer.pipeline.signal_pool import ReaderProcesses
from streamer.skips import Skipped

log = logging.getLogger(__name__)

T = TypeVar("T")
CHUNK = 1024  # alignment records a task hands back, by default
AHEAD = 2  # tasks asked for before their records are taken


class ParseProcess:
    """A reader process (started with the first file) that parses, or the caller where there is none;
    `workers` processes for files parsed whole (`begin`), where one would queue them: `records` (one
    file's chunks, parsed by the process that holds it) takes one."""

    def __init__(self, processes: bool, chunk: int = CHUNK, libraries: Iterable[str] = (), workers: int = 1):
        self._processes = processes
        self._workers = workers
        self._chunk = chunk
        self._libraries = list(libraries)  # the signal formats' libraries, where this process starts the fork server
        self._pool: ReaderProcesses | None = None
        self._lock = threading.Lock()

    def run(self, parse: Callable[..., T], *args) -> T:
        """`parse(*args)` in the process (a module-level function, picklable arguments), else here."""
        return self.begin(parse, *args).result()

    def begin(self, parse: Callable[..., T], *args) -> Parsed[T]:
        """`parse(*args)` begun in the process, its result taken later (`Parsed`); where there is no process,
        parsed by whoever takes it."""
        pool = self._open()
        future = None
        if pool is not None:
            try:
                future = pool.submit(_handed_back, pool.shared, parse, args)
            except BrokenProcessPool:
                self._lost()
            except RuntimeError:  # shut down meanwhile: parsed here
                pass
        return Parsed(self, future, parse, args)

    def records(self, path: Path, filt: AlignmentFilter) -> Iterator[AlignmentRecord | Skipped]:
        """`iter_alignments(path, filt)`: parsed in the process a chunk of records a task, `AHEAD` tasks
        ahead, the first asked for now; if the process stops midway, the rest here, from the record
        where it stopped."""
        if self._workers != 1:
            raise ValueError("records are parsed by one process a file: a ParseProcess of one worker")
        pool = self._open()
        if pool is None:
            return iter_alignments(path, filt)
        token = uuid.uuid4().hex
        ask = (_handed_back, pool.shared, _next_chunk, (token, path, filt, self._chunk))
        first: Future = Future()

        def ask_first() -> None:  # the first submission starts the process (a fork, its imports): not on the caller
            try:
                first.set_result(deque(pool.submit(*ask) for _ in range(AHEAD)))
            except BaseException as exc:  # noqa: BLE001 - met where the tasks are taken
                first.set_exception(exc)

        threading.Thread(target=ask_first, name="parse-start", daemon=True).start()
        return self._taken(pool, first, ask, token, path, filt)

    def _taken(self, pool: ReaderProcesses, first: Future, ask: tuple, token: str, path: Path,
               filt: AlignmentFilter) -> Iterator[AlignmentRecord | Skipped]:  # fmt: skip
        taken = 0
        tasks: deque = deque()
        try:
            tasks = first.result()
            while (chunk := _taken_back(tasks.popleft().result())) is not None:
                tasks.append(pool.submit(*ask))
                timeline.record("parse", chunk.started, chunk.started + chunk.seconds, where=chunk.worker,
                                records=len(chunk.records))  # fmt: skip
                taken += len(chunk.records)
                yield from chunk.records
            return
        except BrokenProcessPool:
            self._lost()
        except RuntimeError:  # shut down before the first task went: parsed here
            pass
        finally:
            for task in tasks:
                task.cancel()
            if self._processes:
                with suppress(RuntimeError):  # shut down or broken meanwhile: nothing left to drop
                    pool.submit(_drop, token)
        yield from islice(iter_alignments(path, filt), taken, None)

    def _open(self) -> ReaderProcesses | None:
        with self._lock:
            if self._processes and self._pool is None:
                self._pool = ReaderProcesses(self._workers, shared_samples.place(), self._libraries)
            return self._pool if self._processes else None

    def _lost(self) -> None:
        log.warning("the parsing process stopped; input files are parsed in this process from now on")
        with self._lock:
            self._processes = False

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._processes = self._pool, None, False
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class _InFile:
    """A result a reader pickled into a file (`shared_samples.write`): its path and length."""

    path: str
    nbytes: int


def _handed_back(shared: SharedFiles | None, parse: Callable[..., T], args: tuple) -> T | _InFile:
    """In the reader process: `parse(*args)`, in a file of `shared`'s where it is large and one takes it."""
    result = parse(*args)
    if shared is None:
        return result
    data = pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
    path = shared_samples.write(shared, data)
    return result if path is None else _InFile(path, len(data))


def _taken_back(result: T | _InFile) -> T:
    """In the caller: the reader's result, read from its file where it came in one."""
    return shared_samples.unpickled(result.path, result.nbytes) if isinstance(result, _InFile) else result


class Parsed(Generic[T]):
    """A parse begun by `ParseProcess.begin`: whether it is done, without waiting; its result, waiting."""

    def __init__(self, owner: ParseProcess, future: Future | None, parse: Callable[..., T], args: tuple):
        self._owner, self._future, self._parse, self._args = owner, future, parse, args

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def wait(self, timeout: float) -> bool:
        """Done within `timeout` seconds."""
        return self._future is None or bool(wait([self._future], timeout).done)

    def result(self) -> T:
        """What the parse gave, or raised; parsed here if the process stopped before it was done."""
        if self._future is not None:
            try:
                return _taken_back(self._future.result())
            except BrokenProcessPool:
                self._owner._lost()
            except CancelledError:  # the process was shut down first
                pass
        return self._parse(*self._args)


# in the reader process: the files `records` is going through, by token (None once at their end)
_OPEN: dict[str, Iterator[AlignmentRecord | Skipped] | None] = {}


class _Chunk(NamedTuple):
    """A parsing task's records, and when and where it parsed them (for `--trace`)."""

    records: list[AlignmentRecord | Skipped]
    started: float  # perf_counter: the system's monotonic clock, comparable across processes
    seconds: float
    worker: str


def _next_chunk(token: str, path: Path, filt: AlignmentFilter, n: int) -> _Chunk | None:
    """The next `n` records of the file `token` goes through; None at its end (and after)."""
    t0 = time.perf_counter()
    if token not in _OPEN:
        _OPEN[token] = iter_alignments(path, filt)
    it = _OPEN[token]
    chunk = list(islice(it, n)) if it is not None else []
    if not chunk:
        _OPEN[token] = None
        return None
    return _Chunk(chunk, t0, time.perf_counter() - t0, f"{os.getpid()} parsing")


def _drop(token: str) -> None:
    _OPEN.pop(token, None)
