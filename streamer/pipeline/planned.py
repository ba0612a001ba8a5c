"""Batches planned from the BAM, as `streamer call` and `streamer eventalign` run them through the
batch driver: each batch's signal read on the reader pool as soon as it is submitted, packed on the
assembler thread, and the run's counts and stage times gathered into its `RunSummary`.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING

from streamer.io.reference import Reference
from streamer.pipeline import timeline
from streamer.io.signal_chunks import load_chunk
from streamer.pipeline.batching import Pending, assemble_batch, signal_requests
from streamer.pipeline.runner import BatchDriver, RunnerOptions
from streamer.pipeline.steps import Assembled, Done, Stages
from streamer.pipeline.signal_pool import READS_PER_TASK, read_tasks
from streamer.skips import Skipped
from streamer.summary import RunSummary

if TYPE_CHECKING:
    from streamer.pipeline.stages import Pipeline


# mallopt(3) parameters
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8


def tighten_heap() -> None:
    """glibc malloc: two arenas, and every block of 1 MiB or more mapped on its own, so that a freed batch
    array is given back to the system rather than left in the heap of the thread that freed it (each
    thread's arena, and a mapping threshold that grows with each large free, kept about 40 MB of freed
    batches on 2 cores). Nothing elsewhere."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_ARENA_MAX, 2)
        libc.mallopt(_M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):  # not glibc
        pass


class Reading:
    """What a run's planned batches share: the reader pool, the reference, the readers' times."""

    def __init__(self, ref: Reference, pool: Executor, reads_per_task: int = READS_PER_TASK):
        self.ref = ref
        self.pool = pool
        self.reads_per_task = reads_per_task
        self.read_seconds = 0.0
        self.assemble_seconds = 0.0
        self.signal_wait = 0.0

    def job(self, pending: list[Pending], skipped: list[Skipped]) -> Planned:
        return Planned(self, pending, skipped)


class Planned:
    """A batch planned from the BAM: its signal read on the pool, packed on the assembler thread."""

    def __init__(self, reading: Reading, pending: list[Pending], skipped: list[Skipped]):
        self.reading = reading
        self.pending = pending
        self.skipped = skipped
        self.tasks: list[Future] = []

    def start(self) -> None:
        r = self.reading
        self.tasks = [r.pool.submit(load_chunk, c) for c in read_tasks(signal_requests(self.pending), r.reads_per_task)]

    def assemble(self) -> Assembled:
        r = self.reading
        t0 = time.perf_counter()
        chunks = [task.result() for task in self.tasks]
        t1 = time.perf_counter()
        self.tasks = []
        r.read_seconds += sum(c.seconds for c in chunks)
        for c in chunks:
            timeline.record("read", c.started, c.started + c.seconds, where=c.worker, reads=len(c.read_ids))
        batch, failed = assemble_batch(self.pending, chunks, r.ref)
        r.signal_wait += t1 - t0
        r.assemble_seconds += time.perf_counter() - t1
        return Assembled([], batch, self.skipped + failed, len(self.pending) + len(self.skipped))


def run_batches(
    pipeline: Pipeline,
    plans: Iterable[tuple[list[Pending], list[Skipped]]],
    ref: Reference,
    pool: Executor,
    summary: RunSummary,
    on_done: Callable[[Done], None],
    stages: Stages | None = None,
    options: RunnerOptions = RunnerOptions(),
    starting: Callable[[], None] = lambda: None,
) -> None:
    """Every planned batch through `stages` (default: the pipeline alone), counted into `summary`.

    `starting` runs on the calling thread once the batches' reads have begun: a pipeline made with
    `start=False` starts there, while the first batches are read, packed and their events detected.
    `on_done` gets each batch in order on the calling thread, after it is counted; the time it
    takes is the "write" stage of batches that reached the stages.
    """
    if options.tight_heap:
        tighten_heap()
    reading = Reading(ref, pool, options.reads_per_task)
    stages = stages or Stages(pipeline)
    driver = BatchDriver(stages.compute, compute_threads=options.compute_threads, limit=options.limit,
                         numba_threads=pipeline.options.threads, front=stages.front, finish=stages.finish)  # fmt: skip
    try:
        batches = driver.run(reading.job(pending, skipped) for pending, skipped in plans)
        starting()
        for done in batches:
            t0 = time.perf_counter()
            summary.add(done.outcome)
            on_done(done)
            if done.results:
                t1 = time.perf_counter()
                summary.stage_seconds["write"] += t1 - t0
                timeline.record("write", t0, t1, reads=done.outcome.records_in)
    finally:
        driver.close()
    summary.stage_seconds["read"] += reading.read_seconds
    summary.stage_seconds["assemble"] += reading.assemble_seconds
    summary.waits.update({"stages_for_batches": driver.waits["stages_for_batches"],
                          "assembly_for_signal": reading.signal_wait})  # fmt: skip
