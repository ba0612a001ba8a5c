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
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import numba
import numpy as np
from numba.typed import List

from streamer.assemble import Pending, build_reads, load_chunk, signal_requests
from streamer.batch import ReadBatch, ReadInput, pack
from streamer.io.fast5 import SignalRecord
from streamer.io.index import SignalIndex
from streamer.io.reference import Reference
from streamer.plugins.cpg.calls import format_calls
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
    """Signal readers: processes, threads, or ("auto") threads only when every indexed file is SLOW5/BLOW5.

    Processes come from a fork server that has imported the readers once (a fork of this
    process could inherit its threads' locks; a fresh interpreter per worker imports for a
    second); they are started on a side thread, so they come up while the pipeline starts.
    """
    if mode not in IO_MODES:
        raise ValueError(f"io mode must be one of {', '.join(IO_MODES)}, not {mode!r}")
    if mode == "auto":
        slow5 = all(p.suffix.lower() in (".slow5", ".blow5") for p in set(index.paths.values()))
        mode = "threads" if slow5 else "processes"
    if mode == "threads":
        return ThreadPoolExecutor(workers, thread_name_prefix="signal-reader")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["streamer.assemble"])
    pool = ProcessPoolExecutor(workers, mp_context=ctx)
    threading.Thread(target=_start_workers, args=(pool, workers), name="reader-start", daemon=True).start()
    return pool


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
        tasks, chunk, n = [], {}, 0
        for path, ids in signal_requests(pending).items():
            chunk[path] = ids
            n += len(ids)
            if n >= self.options.reads_per_task:
                tasks.append(self.pool.submit(load_chunk, chunk))
                chunk, n = {}, 0
        if chunk:
            tasks.append(self.pool.submit(load_chunk, chunk))
        return tasks

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
