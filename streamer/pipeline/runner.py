"""The one batch driver: every command's batches go through it, several in flight, handed back in order.

    submit (caller) -> start: reads begun -> assemble: signal in hand, packed -> compute -> finish -> take (batch order)

A batch is a `Job`: `start` begins its reads when it is submitted (a reader pool's tasks, a Dask
task); `assemble` waits for them and makes its inputs, on the one assembler thread, in batch
order; a compute thread runs the stages on it (`Stages.compute`: the pipeline, the batch's
`BatchOutcome`); the finishing thread renders its results for the sinks (`Stages.finish`), so the
compute threads go on to the next batch meanwhile; `take` hands the batches back in the order submitted.
At most `limit` batches are in flight (submitted, not yet taken): `submit` waits for room. So
one batch's signal is read while another is packed and others are in the stages, and the
output is that of batches run one by one.

`streamer call` and `streamer eventalign` plan from the BAM (`streamer.pipeline.planned`: reads on
the reader pool, `ahead` batches before the stages need them); `streamer call --dask` submits
each batch to a worker (`streamer.cluster`); the daemon submits the batches the ledger says
are due (`streamer.daemon.batches`). A batch the pipeline raises on is retried read by read
where `Stages.isolate` is set (the daemon): a read that fails alone is recorded against it;
when every read fails, the fault is not in the reads and the exception stops the caller.

A failure in any thread stops the others and is raised in the caller.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numba

from streamer.pipeline import timeline
from streamer.pipeline.signal_pool import READS_PER_TASK
from streamer.pipeline.steps import Done

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerOptions:
    """io_workers read signal; compute_threads run batches through the stages at once; `ahead`
    batches are read while the stages work; a reader task loads about reads_per_task reads; with
    tight_heap, freed batch arrays go back to the system at once (`tighten_heap`), for a small budget."""

    io_workers: int = os.cpu_count() or 1
    io_mode: str = "auto"  # "processes", "threads", or by format (`reader_pool`)
    compute_threads: int = 2
    ahead: int = 2
    reads_per_task: int = READS_PER_TASK
    tight_heap: bool = False

    @property
    def limit(self) -> int:
        """Batches in flight: `ahead` being read, one packed, one queued and one computing per thread."""
        return self.ahead + 1 + 2 * self.compute_threads


class Job(Protocol):
    def start(self) -> None:
        """On submission, in the submitting thread: begin the batch's reads (quickly)."""

    def assemble(self) -> Any:
        """On the assembler thread, in batch order: what the driver's compute step takes."""


class _Stop(Exception):
    """Another thread failed: this one leaves quietly."""


_DONE = object()


class BatchDriver:
    """Jobs through `compute` on `compute_threads` threads, at most `limit` in flight, taken in order."""

    def __init__(self, compute: Callable[[Any], Done], *, compute_threads: int = 1, limit: int = 1,
                 numba_threads: int | None = None, front: Callable[[Any], None] | None = None,
                 prepare: Callable[[Any], None] | None = None, finish: Callable[[Done], Any] | None = None):  # fmt: skip
        self.compute = compute
        self.finish = finish  # run on each computed batch on a thread of its own, before it is taken (`Stages.finish`)
        self.front = front  # run on each assembled batch on a thread of its own before `compute` (`Stages.front`)
        self.prepare = prepare  # run on each on the assembler thread, after its job's `assemble` (`Stages.prepare`)
        self.compute_threads = max(1, compute_threads)
        self.limit = max(1, limit)
        self.numba_threads = numba_threads  # set on each compute thread (numba's count is per thread)
        self.waits: Counter = Counter()  # seconds the compute threads waited for assembled batches
        self._assembling: queue.Queue = queue.Queue()
        self._fronting: queue.Queue = queue.Queue(maxsize=1)
        self._computing: queue.Queue = queue.Queue(maxsize=max(1, compute_threads))
        self._finishing: queue.Queue = queue.Queue()  # bounded by `limit`
        self._results: dict[int, Done] = {}
        self._changed = threading.Condition()
        self._submitted = self._taken = 0
        self._running: set[int] = set()  # batches in the stages or being finished now
        self._halted = False  # `halt`: no batch goes into the stages any more
        self._error: BaseException | None = None
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._assembler, name="assembler", daemon=True)]
        if front is not None:
            self._threads.append(threading.Thread(target=self._fronter, name="front", daemon=True))
        self._threads += [threading.Thread(target=self._computer, name=f"compute-{i}", daemon=True)
                          for i in range(max(1, compute_threads))]  # fmt: skip
        if finish is not None:
            self._threads.append(threading.Thread(target=self._finisher, name="finish", daemon=True))
        for t in self._threads:
            t.start()

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet taken."""
        return self._submitted - self._taken

    def submit(self, job: Job) -> None:
        """Start `job` once fewer than `limit` batches are in flight (a thread's failure is raised here)."""
        with self._changed:
            while self.in_flight >= self.limit and self._error is None and not self._stopped.is_set():
                self._changed.wait(timeout=1.0)
            self._raise()
            if self._stopped.is_set():
                raise _Stop
            seq = self._submitted
            self._submitted += 1
            self._changed.notify_all()
        job.start()
        self._assembling.put((seq, job))

    def run(self, jobs: Iterable[Job]) -> Iterator[Done]:
        """Every job, submitted from a thread of its own (planning included) from now on, handed back in
        order as the iterator is taken from: a caller may start other work between the two."""
        total: list[int] = []

        def feed() -> None:
            n = 0
            try:
                for job in jobs:
                    self.submit(job)
                    n += 1
            except _Stop:
                pass
            except BaseException as exc:  # re-raised in the caller
                self._fail(exc)
            finally:
                with self._changed:
                    total.append(n)
                    self._changed.notify_all()

        first = self._taken
        feeder = threading.Thread(target=feed, name="feeder", daemon=True)
        feeder.start()
        self._threads.append(feeder)  # joined by `close` too, where the results are never taken
        return self._handed_back(first, total, feeder)

    def _handed_back(self, first: int, total: list[int], feeder: threading.Thread) -> Iterator[Done]:
        try:
            while True:
                with self._changed:
                    while not total and self.in_flight == 0 and self._error is None:
                        self._changed.wait(timeout=1.0)
                    self._raise()
                    if total and self._taken - first >= total[0]:
                        return
                yield self.take()
        finally:
            with self._changed:
                self._stopped.set()
                self._changed.notify_all()
            feeder.join()

    def halt(self) -> None:
        """Put no more batches through the stages: those in them finish and can be taken, the others never will."""
        with self._changed:
            self._halted = True
            self._changed.notify_all()

    @property
    def oldest_coming(self) -> bool:
        """Whether the oldest batch not yet taken is done or in the stages (after `halt`: whether one will come)."""
        with self._changed:
            return self._taken in self._results or self._taken in self._running or (
                not self._halted and self._taken < self._submitted)

    @property
    def has_room(self) -> bool:
        """Whether `submit` would start a batch now."""
        return self.in_flight < self.limit

    def take(self) -> Done:
        """The oldest batch not yet taken, when it is done (a thread's failure is raised here)."""
        if self._taken >= self._submitted:
            raise RuntimeError("no batch in flight")
        while (done := self.take_ready(1.0)) is None:
            pass
        return done

    def take_ready(self, timeout: float = 0.0) -> Done | None:
        """The oldest batch not yet taken if it is done within `timeout` seconds, else None (also when none
        is in flight); a thread's failure is raised here."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._taken < self._submitted and self._taken not in self._results and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(timeout=left)
            self._raise()
            if self._taken not in self._results:
                return None
            done = self._results.pop(self._taken)
            self._taken += 1
            self._changed.notify_all()
        return done

    def close(self) -> None:
        """Stop the threads (batches in flight are dropped)."""
        with self._changed:
            self._stopped.set()
            self._changed.notify_all()
        self._assembling.put(_DONE)
        self._wake()
        for t in self._threads:
            t.join()

    def _wake(self) -> None:
        """A stop told to the threads waiting on their queues now, not at their next look (0.1 s): where a queue is
        full, its threads are not waiting on it."""
        for q, n in ((self._fronting, self.front is not None), (self._computing, self.compute_threads),
                     (self._finishing, self.finish is not None)):  # fmt: skip
            for _ in range(n):
                try:
                    q.put_nowait(_DONE)
                except queue.Full:
                    break

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _fail(self, exc: BaseException) -> None:
        with self._changed:
            if self._error is None:
                self._error = exc
            self._stopped.set()
            self._changed.notify_all()
        self._wake()

    def _assembler(self) -> None:
        try:
            while not self._stopped.is_set():
                item = self._assembling.get()
                if item is _DONE:
                    break
                seq, job = item
                with timeline.span("assemble", batch=seq):
                    assembled = job.assemble()
                    if self.prepare is not None:
                        self.prepare(assembled)
                self._hand_on(self._fronting if self.front is not None else self._computing, (seq, job, assembled))
        except _Stop:
            pass
        except BaseException as exc:  # re-raised in the caller
            self._fail(exc)

    def _hand_on(self, to: queue.Queue, item: tuple) -> None:
        """Put item on the next step's queue once it has room (`_Stop` if the driver stops meanwhile)."""
        while True:
            if self._stopped.is_set():
                raise _Stop
            try:
                to.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _fronter(self) -> None:
        """The front step: each assembled batch's leading stages, in batch order, while others compute."""
        try:
            self._numba_threads()
            while not self._stopped.is_set():
                try:
                    item = self._fronting.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is _DONE:
                    break
                with timeline.span("front", batch=item[0]):
                    self.front(item[2])
                self._hand_on(self._computing, item)
        except _Stop:
            pass
        except BaseException as exc:  # re-raised in the caller
            self._fail(exc)

    def _numba_threads(self) -> None:
        if self.numba_threads is not None:
            numba.set_num_threads(max(1, min(self.numba_threads, numba.config.NUMBA_NUM_THREADS)))

    def _computer(self) -> None:
        try:
            self._numba_threads()
            idle = 0.0
            while not self._stopped.is_set():
                t0 = time.perf_counter()
                try:
                    item = self._computing.get(timeout=0.1)
                except queue.Empty:
                    idle += time.perf_counter() - t0
                    continue
                if item is _DONE:
                    break
                seq, job, assembled = item
                idle += time.perf_counter() - t0
                with self._changed:
                    if self._halted:
                        continue
                    self._running.add(seq)
                with timeline.span("batch", batch=seq):
                    done = self.compute(assembled)
                done.job = job
                with self._changed:
                    self.waits["stages_for_batches"] += idle
                    idle = 0.0
                if self.finish is not None:
                    self._finishing.put((seq, done))
                else:
                    self._done(seq, done)
        except BaseException as exc:  # re-raised in the caller
            self._fail(exc)

    def _done(self, seq: int, done: Done) -> None:
        with self._changed:
            self._running.discard(seq)
            self._results[seq] = done
            self._changed.notify_all()

    def _finisher(self) -> None:
        """Each computed batch through `finish`, in the order computed, then ready to be taken."""
        try:
            self._numba_threads()  # the rows' formatting runs parallel regions too
            while not self._stopped.is_set():
                try:
                    item = self._finishing.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is _DONE:
                    break
                seq, done = item
                with timeline.span("finish", batch=seq):
                    self.finish(done)
                self._done(seq, done)
        except BaseException as exc:  # re-raised in the caller
            self._fail(exc)
