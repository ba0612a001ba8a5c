"""`streamer call`'s batches run concurrently: signal reading, packing, the stages, writing.

    plan (BAM order) -> reader pool -> pack -> compute threads -> write (batch order)

- The reader pool (`streamer.pipeline.signal_pool`) loads each planned batch's signal in small tasks,
  `ahead` batches before the stages need them.
- One packing thread makes each batch's inputs (`streamer.pipeline.batching.batch_inputs`) and packs
  them (`streamer.pipeline.batch.pack`), the samples going from the tasks' arrays to pA straight into
  the batch's flat array.
- Compute threads each run `Pipeline.run_batch` on a batch, so one batch's CPU stages run while
  another's are on the GPU (the pipeline's GPU stages take turns), and let the sinks render it.
- The calling thread hands results to the sinks in batch order: the output is that of batches
  run one by one.

A failure in any thread stops the others and is raised in the caller.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numba

from streamer.pipeline.batch import pack
from streamer.pipeline.batching import Pending, batch_inputs, chunk_records, load_chunk, signal_requests
from streamer.io.reference import Reference
from streamer.pipeline.signal_pool import READS_PER_TASK, read_tasks
from streamer.skips import Skipped
from streamer.summary import RunSummary

if TYPE_CHECKING:
    from streamer.pipeline.stages import BatchResult, Pipeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerOptions:
    """io_workers read signal; compute_threads run batches through the stages at once; `ahead`
    batches are read while the stages work; a reader task loads about reads_per_task reads."""

    io_workers: int = os.cpu_count() or 1
    io_mode: str = "auto"  # "processes", "threads", or by format (`reader_pool`)
    compute_threads: int = 2
    ahead: int = 2
    reads_per_task: int = READS_PER_TASK


_DONE = object()


class _Stop(Exception):
    """Another thread failed: this one leaves quietly."""


class _Run:
    """The threads of one overlapped run and what they hand each other."""

    def __init__(self, pipeline: Pipeline, ref: Reference, pool: Executor, options: RunnerOptions,
                 render: Callable[[BatchResult], Any]):
        self.pipeline = pipeline
        self.render = render
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
        t0 = time.perf_counter()
        chunks = [task.result() for task in tasks]
        t1 = time.perf_counter()
        self.read_seconds += sum(c.seconds for c in chunks)
        reads, failed = batch_inputs(pending, *chunk_records(chunks), self.ref)
        batch = pack(reads) if reads else None
        self.waits["assembly_for_signal"] += t1 - t0
        self.assemble_seconds += time.perf_counter() - t1
        self.put(self.batches, (seq, batch, skipped + failed, len(reads) + len(skipped) + len(failed)))

    # -- compute threads
    def compute(self) -> None:
        try:
            numba.set_num_threads(max(1, min(self.pipeline.options.threads, numba.config.NUMBA_NUM_THREADS)))
            idle = 0.0
            while True:
                t0 = time.perf_counter()
                item = self.get(self.batches)
                idle += time.perf_counter() - t0
                if item is _DONE:
                    break
                seq, batch, skipped, n_in = item
                result = rendered = None
                if batch is not None:
                    result = self.pipeline.run_batch(batch)
                    t1 = time.perf_counter()
                    rendered = self.render(result)
                    result.timings["format"] = time.perf_counter() - t1
                with self.ready:
                    self.results[seq] = (result, skipped, rendered, n_in)
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


def run_batches(
    pipeline: Pipeline,
    plans: Iterable[tuple[list[Pending], list[Skipped]]],
    ref: Reference,
    pool: Executor,
    summary: RunSummary,
    on_result: Callable[[BatchResult, Any], int],
    render: Callable[[BatchResult], Any] = lambda result: None,
    on_skipped: Callable[[list[Skipped]], None] | None = None,
    options: RunnerOptions = RunnerOptions(),
    on_batch_done: Callable[[], None] | None = None,
) -> None:
    """Run every planned batch through the pipeline, counting into `summary`.

    `render` runs on the compute threads (formatting); `on_result` gets each result with what
    `render` made of it, in batch order on the calling thread, and returns the rows it wrote;
    `on_skipped` each batch's skipped records (planning and stages), before its result;
    `on_batch_done` once per batch, when all of it is handed over.
    """
    run = _Run(pipeline, ref, pool, options, render)
    run.start(plans)
    try:
        for result, skipped, rendered, n_in in run.ordered():
            t0 = time.perf_counter()
            summary.reads_in += n_in
            if on_skipped is not None:
                on_skipped(skipped)
            if result is not None:
                if on_skipped is not None:
                    on_skipped(result.skipped)
                summary.reads_called += result.n_reads - len(result.skipped)
                summary.bases += result.n_bases
                summary.stage_seconds.update(result.timings)
                _count_gpu(summary, result)
                summary.calls += on_result(result, rendered)
                summary.stage_seconds["write"] += time.perf_counter() - t0
            if on_batch_done is not None:
                on_batch_done()
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
