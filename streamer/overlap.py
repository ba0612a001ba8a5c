"""`streamer call` with its steps overlapped: signal reading, assembly, the stages, writing.

    plan (BAM order) -> reader pool -> assemble -> compute threads -> write (batch order)

- The reader pool loads each planned batch's signal in small tasks, `ahead` batches before the
  stages need them. FAST5 and POD5 go to processes: h5py serialises every thread of a process on
  one lock, and the POD5 reader holds the GIL for most of its work (on 16 cores, threads spent
  44 s reading what processes read in 2.5 s). SLOW5/BLOW5, read through slow5lib with the GIL
  released, go to threads. A task hands back its reads' raw samples as one int16 array (half
  the bytes of pA, one object to pickle).
- One assembler thread packs a batch; its signal goes from the tasks' arrays to pA straight
  into the batch's flat array, in parallel (the same float32 steps as `SignalRecord.to_pa`).
- Compute threads each run `Pipeline.run_batch` on a batch, so one batch's CPU stages run while
  another's are on the GPU (the pipeline's GPU stages take turns), and formats its rows.
- The calling thread writes results in batch order: the output is that of batches run one by
  one.

A failure in any thread stops the others and is raised in the caller.

The daemon reads ahead with the same pool and tasks, one batch at a time (`SignalReads`).
"""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numba
import numpy as np
from numba.typed import List

from streamer.assemble import Pending, build_reads, load_chunk, signal_requests
from streamer.batch import ReadBatch, ReadInput, pack
from streamer.io.fast5 import SignalRecord
from streamer.io.index import SignalIndex
from streamer.io.reference import Reference
from streamer_plugins.cpg.calls import format_calls
from streamer.skips import Skipped
from streamer.summary import RunSummary

if TYPE_CHECKING:
    from streamer.pipeline import BatchResult, Pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OverlapOptions:
    """io_workers read signal; compute_threads run batches through the stages at once; `ahead`
    batches are read while the stages work; a reader task loads about reads_per_task reads."""

    io_workers: int = os.cpu_count() or 1
    io_mode: str = "auto"  # "processes", "threads", or by format (`reader_pool`)
    compute_threads: int = 2
    ahead: int = 2
    reads_per_task: int = 32


IO_MODES = ("auto", "processes", "threads")


def reader_pool(index: SignalIndex, workers: int, mode: str = "auto") -> Executor:
    """Signal readers for the files of `index` (see `signal_readers`)."""
    return signal_readers({p.suffix for p in index.paths.values()}, workers, mode)


def signal_readers(suffixes: Iterable[str], workers: int, mode: str = "auto") -> Executor:
    """Signal readers: processes, threads, or ("auto") threads only when every file suffix is SLOW5/BLOW5.

    Processes come from a fork server that has imported the readers once (a fork of this
    process could inherit its threads' locks; a fresh interpreter per worker imports for a
    second); they are started on a side thread, so they come up while the pipeline starts.
    """
    if mode not in IO_MODES:
        raise ValueError(f"io mode must be one of {', '.join(IO_MODES)}, not {mode!r}")
    if mode == "auto":
        slow5 = all(s.lower() in (".slow5", ".blow5") for s in suffixes)
        mode = "threads" if slow5 else "processes"
    if mode == "threads":
        return ThreadPoolExecutor(workers, thread_name_prefix="signal-reader")
    pool = ProcessPoolExecutor(workers, mp_context=_fork_server(), initializer=_end_with, initargs=(os.getpid(),))
    threading.Thread(target=_start_workers, args=(pool, workers), name="reader-start", daemon=True).start()
    return pool


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


def _end_with(pid: int) -> None:
    """In a reader process: exit once process `pid` is gone. A pool's workers wait for work on a
    pipe they hold both ends of, so without this they outlive a `kill -9` of their owner."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # the pid is another user's now: ours is gone
                os._exit(0)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


_FORK_SERVER_START = threading.Lock()
_IMPORT_ROOTS = ("streamer", "streamer_gpu", "streamer_plugins")


def _fork_server() -> multiprocessing.context.ForkServerContext:
    """The fork server, started on this process's own import roots.

    It is started as `python -c`, which puts the current directory first on its path, and
    Python 3.11-3.13 ignore the path handed to it: run from a folder holding a `streamer`
    checkout, the readers would import that instead of the package this process runs. So the
    server starts with the current directory left off (PYTHONSAFEPATH) and the folders this
    process imported its packages from first (PYTHONPATH).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["streamer.assemble"])
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
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return ctx


def _start_workers(pool: ProcessPoolExecutor, workers: int) -> None:
    try:
        for _ in range(workers):
            pool.submit(os.getpid)
    except RuntimeError:  # shut down already: the run ended before its readers were needed
        pass


@numba.njit(nogil=True, cache=True, parallel=True)
def _gather_pa(chunks, chunk_of, start, off, unit, offset):
    """pA of every read, end to end: (float32(raw) + offset) * unit, as `SignalRecord.to_pa` rounds it."""
    n = chunk_of.shape[0]
    out = np.empty(off[n], np.float32)
    for i in numba.prange(n):
        src = chunks[chunk_of[i]]
        s = start[i]
        o = off[i]
        for t in range(off[i + 1] - o):
            out[o + t] = (np.float32(src[s + t]) + offset[i]) * unit[i]
    return out


def pack_with_signal(reads: list[ReadInput], records: dict[str, SignalRecord], where: dict[str, tuple[int, int, int]],
                     chunks: list[np.ndarray]) -> ReadBatch:  # fmt: skip
    """`pack` of reads whose samples are still in the chunks: where[id] = (chunk, start, length)."""
    batch = pack(reads)
    n = len(reads)
    chunk_of = np.empty(n, np.int64)
    start = np.empty(n, np.int64)
    off = np.zeros(n + 1, np.int64)
    unit = np.empty(n, np.float32)
    offset = np.empty(n, np.float32)
    for i, r in enumerate(reads):
        chunk_of[i], start[i], length = where[r.read_id]
        off[i + 1] = off[i] + length
        rec = records[r.read_id]
        unit[i] = np.float32(rec.range) / np.float32(rec.digitisation)
        offset[i] = np.float32(rec.offset)
    batch.signal = _gather_pa(List(chunks), chunk_of, start, off, unit, offset)
    batch.signal_off = off
    return batch


class SignalReads:
    """The signal of the daemon's batches, read on the reader pool while the batch before computes.

    `ahead` starts reading a later batch's reads; `take` hands a batch's reads back as a
    `SignalBatch`: those read ahead, and the rest started now. Only the last `ahead` is kept,
    so at most one batch's signal is held beyond the batch in hand. Without a pool, `take`
    reads in the calling thread and `ahead` does nothing. A pool that breaks (a reader process
    killed) is not used again: the reads go on in the calling thread.
    """

    def __init__(self, pool: Executor | None, reads_per_task: int = OverlapOptions.reads_per_task):
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
    """One batch's reader tasks; `result` waits for them (a task that failed is read again here)."""

    tasks: list[tuple[Future, dict[Path, list[str]]]]
    read_ids: set[str]

    def result(self) -> tuple[dict[str, SignalRecord], dict[str, str]]:
        """The batch's records (samples are views of their task's array) and the reads that failed, with why."""
        records: dict[str, SignalRecord] = {}
        errors: dict[str, str] = {}
        for future, chunk in self.tasks:
            try:
                c = future.result()
            except Exception as exc:  # noqa: BLE001 - the reader, not the read: read it here instead
                log.warning("a signal reader failed (%s: %s); reading its %d reads in this thread",
                            type(exc).__name__, exc, sum(map(len, chunk.values())))
                c = load_chunk(chunk)
            for rid, (s, n) in c.where.items():
                if rid in self.read_ids:
                    records[rid] = replace(c.records[rid], raw=c.raw[s:s + n])
            errors.update((rid, why) for rid, why in c.errors.items() if rid in self.read_ids)
        return records, errors


_DONE = object()


class _Stop(Exception):
    """Another thread failed: this one leaves quietly."""


class _Run:
    """The threads of one overlapped run and what they hand each other."""

    def __init__(self, pipeline: Pipeline, ref: Reference, pool: Executor, options: OverlapOptions):
        self.pipeline = pipeline
        self.ref = ref
        self.pool = pool
        self.options = options
        self.batches: queue.Queue = queue.Queue(maxsize=max(1, options.compute_threads))
        self.results: dict[int, tuple] = {}
        self.ready = threading.Condition()
        self.error: BaseException | None = None
        self.stopped = threading.Event()
        self.waits: dict[str, float] = {"stages_for_batches": 0.0, "assembly_for_signal": 0.0}
        self.read_seconds = 0.0
        self.assemble_seconds = 0.0

    def fail(self, exc: BaseException) -> None:
        with self.ready:
            if self.error is None:
                self.error = exc
            self.stopped.set()
            self.ready.notify_all()

    def put(self, q: queue.Queue, item) -> None:
        while not self.stopped.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stop

    def get(self, q: queue.Queue):
        while not self.stopped.is_set():
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                continue
        raise _Stop

    # -- assembler thread
    def submit(self, pending: list[Pending]) -> list[Future]:
        chunks = read_tasks(signal_requests(pending), self.options.reads_per_task)
        return [self.pool.submit(load_chunk, c) for c in chunks]

    def assemble(self, plans: Iterable[tuple[list[Pending], list[Skipped]]]) -> None:
        try:
            window: deque = deque()
            seq = 0
            for pending, skipped in plans:
                window.append((seq, pending, skipped, self.submit(pending)))
                seq += 1
                if len(window) > self.options.ahead:
                    self.emit(*window.popleft())
            while window:
                self.emit(*window.popleft())
            for _ in range(self.options.compute_threads):
                self.put(self.batches, _DONE)
        except _Stop:
            pass
        except BaseException as exc:  # re-raised by the caller
            self.fail(exc)

    def emit(self, seq: int, pending: list[Pending], skipped: list[Skipped], tasks: list[Future]) -> None:
        records: dict[str, SignalRecord] = {}
        errors: dict[str, str] = {}
        where: dict[str, tuple[int, int, int]] = {}
        t0 = time.perf_counter()
        chunks = [task.result() for task in tasks]
        t1 = time.perf_counter()
        for i, c in enumerate(chunks):
            records.update(c.records)
            errors.update(c.errors)
            where.update((rid, (i, s, n)) for rid, (s, n) in c.where.items())
            self.read_seconds += c.seconds
        reads = build_reads(pending, records, errors, self.ref, skipped)
        batch = pack_with_signal(reads, records, where, [c.raw for c in chunks]) if reads else None
        self.waits["assembly_for_signal"] += t1 - t0
        self.assemble_seconds += time.perf_counter() - t1
        self.put(self.batches, (seq, batch, skipped, len(reads) + len(skipped)))

    # -- compute threads
    def compute(self) -> None:
        try:
            numba.set_num_threads(max(1, min(self.pipeline.options.threads, numba.config.NUMBA_NUM_THREADS)))
            if self.pipeline.gpu is not None:
                from numba import cuda

                cuda.select_device(self.pipeline.options.cuda.dev_id)
            idle = 0.0
            while True:
                t0 = time.perf_counter()
                item = self.get(self.batches)
                idle += time.perf_counter() - t0
                if item is _DONE:
                    break
                seq, batch, skipped, n_in = item
                result = text = None
                if batch is not None:
                    result = self.pipeline.run_batch(batch)
                    t1 = time.perf_counter()
                    text = format_calls(result.calls, result.read_ids, result.ref_names)
                    result.timings["format"] = time.perf_counter() - t1
                with self.ready:
                    self.results[seq] = (result, skipped, text, n_in)
                    self.waits["stages_for_batches"] += idle
                    idle = 0.0
                    self.ready.notify_all()
        except _Stop:
            pass
        except BaseException as exc:  # re-raised by the caller
            self.fail(exc)
        finally:
            with self.ready:
                self.ready.notify_all()

    # -- calling thread
    def ordered(self) -> Iterator[tuple]:
        seq = 0
        while True:
            with self.ready:
                while seq not in self.results and self.error is None and not self._finished():
                    self.ready.wait(timeout=1.0)
                if self.error is not None:
                    raise self.error
                if seq not in self.results:
                    return
                item = self.results.pop(seq)
            yield item
            seq += 1

    def _finished(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def start(self, plans) -> None:
        self.threads = [threading.Thread(target=self.assemble, args=(plans,), name="assembler", daemon=True)]
        self.threads += [threading.Thread(target=self.compute, name=f"compute-{i}", daemon=True)
                         for i in range(self.options.compute_threads)]  # fmt: skip
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join()


def run_overlapped(
    pipeline: Pipeline,
    plans: Iterable[tuple[list[Pending], list[Skipped]]],
    ref: Reference,
    pool: Executor,
    out: TextIO,
    summary: RunSummary,
    options: OverlapOptions = OverlapOptions(),
    on_result: Callable[[BatchResult], None] | None = None,
    on_skipped: Callable[[list[Skipped]], None] | None = None,
) -> None:
    """Call every planned batch, writing rows to `out` in batch order and counting into `summary`.

    `on_skipped` sees each batch's skipped records (planning and pipeline), `on_result` each
    result, in batch order on the calling thread.
    """
    run = _Run(pipeline, ref, pool, options)
    run.start(plans)
    try:
        for result, skipped, text, n_in in run.ordered():
            t0 = time.perf_counter()
            summary.reads_in += n_in
            if on_skipped is not None:
                on_skipped(skipped)
            if result is None:
                continue
            if on_skipped is not None:
                on_skipped(result.skipped)
            out.write(text)
            out.flush()
            summary.reads_called += result.n_reads - len(result.skipped)
            summary.bases += result.n_bases
            summary.calls += result.n_calls
            summary.stage_seconds.update(result.timings)
            _count_gpu(summary, result)
            if on_result is not None:
                on_result(result)
            summary.stage_seconds["write"] += time.perf_counter() - t0
    finally:
        run.stop()
    summary.stage_seconds["read"] += run.read_seconds
    summary.stage_seconds["assemble"] += run.assemble_seconds
    summary.waits.update(run.waits)


def _count_gpu(summary: RunSummary, result: BatchResult) -> None:
    if result.gpu_stats is not None:
        g = result.gpu_stats
        summary.gpu["abea_reads_gpu"] += g.n_gpu
        summary.gpu["abea_reads_cpu"] += g.n_cpu + g.n_ultra
        summary.gpu["abea_batches_fallback"] += bool(g.fallback)
    if result.hmm_stats is not None:
        h = result.hmm_stats
        summary.gpu["hmm_windows_gpu"] += h.n_gpu
        summary.gpu["hmm_windows_cpu"] += h.n_cpu
        summary.gpu["hmm_batches_fallback"] += bool(h.fallback)
