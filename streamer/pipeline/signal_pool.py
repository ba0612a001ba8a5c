"""Signal readers: a pool of processes or threads that load reads' samples ahead of the stages.

`streamer call` hands each planned batch's reads to the pool in small tasks (`read_tasks`,
`streamer.io.signal_chunks.load_chunk`) several batches ahead; the daemon reads the next batch's
signal while a batch computes (`SignalReads`). Readers are processes unless the memory budget is
small (`streamer.tuning.profiles.memory_plan`): h5py serialises every thread of a process on one
lock, the POD5 reader holds the GIL for most of its work (on 16 cores, threads spent 44 s reading
what processes read in 2.5 s), and slow5lib, though it lets the GIL go while it decodes, takes it
back after every read, which on 16 cores slowed the compute threads beside it (BLOW5 7.8-7.9 s with
threads, 5.5-6.2 s with processes, `benchmarks/RESULTS-cpu-half.md`). A task hands back
its reads' raw samples as one int16 array (half the bytes of pA). A reader process pickles its
result with that array in a file under /dev/shm (`streamer.pipeline.shared_samples`), which the
owner maps as it unpickles: through the pool's pipe, the owner's result thread held the GIL to
read and unpickle every byte (1.2 s of a 6 s batch phase on 16 cores, the compute threads
waiting on it at each return from numba or CUDA). Where /dev/shm cannot be written, or for a
task of a few reads, the array goes through the pipe.
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from concurrent.futures import (FIRST_COMPLETED, BrokenExecutor, Executor, Future, ProcessPoolExecutor,
                                ThreadPoolExecutor, wait)
from dataclasses import dataclass
from functools import partial
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

from streamer.pipeline import shared_samples, timeline
from streamer.io.signal_chunks import SignalChunk, load_chunk
from streamer.pipeline.shared_samples import SharedFiles
from streamer.io.index import SignalIndex
from streamer.io.signal import reader_libraries

log = logging.getLogger(__name__)

READS_PER_TASK = 32  # reads a reader task loads, about


IO_MODES = ("auto", "processes", "threads")


def reader_pool(index: SignalIndex, workers: int, mode: str = "auto") -> Executor:
    """Signal readers for the files of `index` (see `signal_readers`)."""
    return signal_readers(index.suffixes(), workers, mode)


def signal_readers(suffixes: Iterable[str], workers: int, mode: str = "auto") -> Executor:
    """Signal readers: processes (also for "auto") or threads.

    Processes come from a fork server that has imported the readers once, with the libraries of
    these formats (a fork of this process could inherit its threads' locks; a fresh interpreter per
    worker imports for a second); they are started on a side thread, so they come up while the
    pipeline starts.
    """
    suffixes = list(suffixes)
    if reader_mode(mode) == "threads":
        return ThreadPoolExecutor(workers, thread_name_prefix="signal-reader")
    pool = ReaderProcesses(workers, shared_samples.place(), reader_libraries(suffixes))
    threading.Thread(target=_start_workers, args=(pool, workers), name="reader-start", daemon=True).start()
    return pool


def reader_mode(mode: str = "auto") -> str:
    """"threads" or "processes": `mode`, where "auto" is processes (a small budget's plan has made it threads)."""
    if mode not in IO_MODES:
        raise ValueError(f"io mode must be one of {', '.join(IO_MODES)}, not {mode!r}")
    return "processes" if mode == "auto" else mode


def start_fork_server(suffixes: Iterable[str]) -> None:
    """The readers' fork server started now, with the libraries of these formats: begun early, it imports
    them while this process still starts up, so that the readers are up by the time the first batches
    are planned."""
    _fork_server(reader_libraries(suffixes))


class ReaderProcesses(ProcessPoolExecutor):
    """Reader processes (`_reader_start`) that hand samples back through `shared`'s files (None: the pipe);
    `libraries`: the format libraries their fork server imports, if this pool starts it."""

    def __init__(self, workers: int, shared: SharedFiles | None, libraries: Iterable[str] = ()):
        super().__init__(workers, mp_context=_fork_server(libraries), initializer=_reader_start,
                         initargs=(os.getpid(), shared))  # fmt: skip
        self.shared = shared

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut down; with `wait`, every reader has ended and every result was taken, so the files
        left are those of readers killed mid-task: removed."""
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait and self.shared is not None:
            shared_samples.remove(self.shared.left())


def read_tasks(wanted: Mapping[Path, list[str]], reads_per_task: int) -> list[dict[Path, list[str]]]:
    """The wanted reads of each file split into reader tasks (`load_chunk`) of about `reads_per_task` reads."""
    tasks, chunk, n = [], {}, 0
    for path, ids in wanted.items():
        chunk[path] = ids
        n += len(ids)
        if n >= reads_per_task:
            tasks.append(chunk)
            chunk, n = {}, 0
    if chunk:
        tasks.append(chunk)
    return tasks


def _reader_start(owner: int, shared: SharedFiles | None) -> None:
    """In a reader process: hand samples back through `shared`'s files, ignore Ctrl-C, and exit once
    process `owner` is gone, removing the files of samples it did not take.

    Ctrl-C reaches the whole process group; the owner stops its readers (a reader interrupted
    while it waits for work would print its traceback). A pool's workers wait for work on a
    pipe they hold both ends of, so without the watch they outlive a `kill -9` of their owner, and
    keep its output pipes open: a parent reading those to the end before it reaps the owner
    would wait for ever. So an owner that has died but is not yet reaped counts as gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if shared is not None:
        ForkingPickler.register(SignalChunk, partial(_handed_back, shared))

    def watch() -> None:
        while not shared_samples.gone(owner):
            time.sleep(1.0)
            shared_samples.forget_taken()
        shared_samples.remove_untaken()
        os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _handed_back(shared: SharedFiles, chunk: SignalChunk) -> tuple:
    """How a reader process pickles a task's result: its samples in a file of `shared`'s, the rest by
    value; all by value where no file takes them."""
    path = shared_samples.write(shared, chunk.raw)
    if path is None:
        return chunk.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    return _mapped_chunk, (path, len(chunk.raw), {k: v for k, v in vars(chunk).items() if k != "raw"})


def _mapped_chunk(path: str, count: int, columns: dict) -> SignalChunk:
    """In the owner, as the pool's result thread unpickles a task's result: its samples mapped from the file."""
    return SignalChunk(**columns, raw=shared_samples.mapped(path, count))


_FORK_SERVER_START = threading.Lock()
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"
_IMPORT_ROOTS = ("streamer", "streamer_gpu", "streamer_plugins")


def _fork_server(libraries: Iterable[str]) -> multiprocessing.context.ForkServerContext:
    """The fork server, started on this process's own import roots, with the readers and `libraries`
    imported (one server a process: a later pool's readers import another format's library themselves).

    It is started as `python -c`, which puts the current directory first on its path, and
    Python 3.11-3.13 ignore the path handed to it: run from a folder holding a `streamer`
    checkout, the readers would import that instead of the package this process runs. So the
    server starts with the current directory left off (PYTHONSAFEPATH) and the folders this
    process imported its packages from first (PYTHONPATH). It starts with Ctrl-C ignored, which it
    and the readers it forks keep: Ctrl-C reaches the whole process group, and the server would
    print the traceback of the import it was in; the owner stops them. A Ctrl-C that cuts the owner's
    request for a reader short no longer ends the server either (`streamer.pipeline.fork_server`).

    The pool's queues hold named semaphores, which multiprocessing's resource tracker unlinks if
    their owner cannot (a `kill -9`). It then warns of "leaked semaphore objects", a page that
    lands in the restarted daemon's log for a cleanup that went as it should: the tracker is
    started with that warning off (its command line takes this process's `-W` options).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["streamer.pipeline.fork_server", "streamer.pipeline.signal_pool", *libraries])
    roots = []
    for name in _IMPORT_ROOTS:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            root = str(Path(spec.origin).resolve().parents[1])
            if root not in roots:
                roots.append(root)
    with _FORK_SERVER_START:
        saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "PYTHONSAFEPATH")}
        os.environ["PYTHONSAFEPATH"] = "1"
        os.environ["PYTHONPATH"] = os.pathsep.join(roots + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
        if _QUIET_TRACKER not in sys.warnoptions:
            sys.warnoptions.append(_QUIET_TRACKER)
        try:
            with _sigint_ignored():
                multiprocessing.forkserver.ensure_running()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return ctx


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile, so that a process started now inherits that (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    """The pool's readers started; under `--trace`, the time until the first is up ("readers up")."""
    t0 = time.perf_counter()
    try:
        started = [pool.submit(os.getpid) for _ in range(workers)]
    except (RuntimeError, BrokenExecutor, OSError, EOFError) as exc:  # shut down already, or broken: a
        log.debug("signal readers not started: %s", exc)  # batch that needs them says so, or reads itself
        return
    if timeline.recording():
        wait(started, return_when=FIRST_COMPLETED)
        timeline.record("readers up", t0, time.perf_counter(), workers=workers)


class SignalReads:
    """The signal of the daemon's batches, read on the reader pool while the batch before computes.

    `ahead` starts reading a later batch's reads; `take` hands a batch's reads back as a
    `SignalBatch`: those read ahead, and the rest started now. Only the last `ahead` is kept,
    so at most one batch's signal is held beyond the batch in hand. Without a pool, `take`
    reads in the calling thread and `ahead` does nothing. A pool that breaks (a reader process
    killed) is not used again: the reads go on in the calling thread.
    """

    def __init__(self, pool: Executor | None, reads_per_task: int = READS_PER_TASK):
        self.pool = pool
        self.reads_per_task = reads_per_task
        self._ahead: dict[str, tuple[Future, dict[Path, list[str]]]] = {}  # read id -> its task
        self.hits = 0  # reads whose signal was read ahead

    def ahead(self, wanted: Mapping[Path, list[str]]) -> None:
        self._drop(self._ahead.values())
        self._ahead = {}
        if self.pool is None:
            return
        for chunk in read_tasks(wanted, self.reads_per_task):
            task = (self._submit(chunk), chunk)
            self._ahead.update((rid, task) for ids in chunk.values() for rid in ids)

    def take(self, wanted: Mapping[Path, list[str]]) -> SignalBatch:
        tasks: dict[int, tuple[Future, dict[Path, list[str]]]] = {}
        rest: dict[Path, list[str]] = {}
        ids: set[str] = set()
        for path, read_ids in wanted.items():
            for rid in read_ids:
                ids.add(rid)
                task = self._ahead.get(rid)
                if task is None:
                    rest.setdefault(path, []).append(rid)
                else:
                    tasks[id(task[0])] = task
                    self.hits += 1
        self._drop(t for t in self._ahead.values() if id(t[0]) not in tasks)
        self._ahead = {}
        for chunk in read_tasks(rest, self.reads_per_task):
            future = self._submit(chunk)
            tasks[id(future)] = (future, chunk)
        return SignalBatch(list(tasks.values()), ids)

    def _submit(self, chunk: dict[Path, list[str]]) -> Future:
        if self.pool is not None:
            try:
                return self.pool.submit(load_chunk, chunk)
            except BrokenExecutor as exc:
                log.warning("signal readers stopped working (%s); reading signal in this thread from now on", exc)
                self.close()
        future: Future = Future()
        future.set_result(load_chunk(chunk))
        return future

    @staticmethod
    def _drop(tasks: Iterable[tuple[Future, dict]]) -> None:
        for future, _ in tasks:
            future.cancel()

    def close(self) -> None:
        """Stop the readers (what was read ahead is dropped; nothing of it was committed)."""
        self._drop(self._ahead.values())
        self._ahead = {}
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


@dataclass
class SignalBatch:
    """One batch's reader tasks; `chunks` waits for them (a task that failed is read again here)."""

    tasks: list[tuple[Future, dict[Path, list[str]]]]
    read_ids: set[str]

    def chunks(self) -> list[SignalChunk]:
        """The tasks' columns (which may hold reads of other batches, read ahead with these)."""
        chunks = []
        for future, chunk in self.tasks:
            try:
                chunks.append(future.result())
            except Exception as exc:  # noqa: BLE001 - the reader, not the read: read it here instead
                log.warning("a signal reader failed (%s: %s); reading its %d reads in this thread",
                            type(exc).__name__, exc, sum(map(len, chunk.values())))
                chunks.append(load_chunk(chunk))
        return chunks
