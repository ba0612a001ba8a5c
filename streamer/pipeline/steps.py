"""What the batch driver's steps take and give for batches run here: an `Assembled` batch in, the
`Stages` that compute it (the pipeline, then the main sink's rendering on the driver's finishing
thread), a `Done` out with its `BatchOutcome`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.pipeline.batch import ReadBatch, ReadInput, pack
from streamer.skips import Skipped
from streamer.summary import BatchOutcome, count_gpu

log = logging.getLogger(__name__)


@dataclass
class Assembled:
    """A batch ready for the stages: packed (`batch`), and as records where a read-by-read retry needs
    them (`reads`, packed by `packed` or by the pipeline where they could not be; or made by `remake`
    only if a retry needs them: the daemon's, packed from the readers' columns); the records that could
    not go, and how many came in."""

    reads: list[ReadInput]
    batch: ReadBatch | None
    skipped: list[Skipped]
    records_in: int
    remake: Callable[[], list[ReadInput]] | None = None

    def records(self) -> list[ReadInput]:
        """The batch's records, made now where they were left to `remake`."""
        if self.remake is not None:
            self.reads, self.remake = self.remake(), None
        return self.reads


def packed(reads: list[ReadInput]) -> ReadBatch | None:
    """Records packed for the stages on the assembler thread, kept beside them for a retry read by read;
    None where there are none or one is refused (the compute step packs them again, and isolates it)."""
    if not reads:
        return None
    try:
        return pack(reads)
    except Exception as exc:  # noqa: BLE001 - met again, and handled, where the batch computes
        log.debug("a batch of %d records could not be packed (%s): the stages take the records", len(reads), exc)
        return None


@dataclass
class Done:
    """A batch through the stages: its results (one, or one per read after a retry), what the
    sinks rendered of each, its outcome, and the job it was."""

    outcome: BatchOutcome
    results: list[Any] = field(default_factory=list)
    rendered: list[Any] = field(default_factory=list)
    job: Any = None


class Stages:
    """The compute step of local batches: the pipeline and the batch's outcome (`compute`), then each
    result rendered (`finish`, on the driver's finishing thread; `__call__` runs both).

    `render` and `count` are the main sink's (what it makes of a result, how many rows); with
    `isolate` a batch the pipeline raises on is redone read by read (`streamer.pipeline.runner`).
    Without `keep_signal` (no sink renders samples: `streamer call`) a batch's signal is let go once
    its events are detected on the front thread: about a third of what a batch in flight holds. Without
    `keep_events` (no sink renders events) their starts, lengths and spreads are not made at all
    (`ReadBatch.event_spread`), as only the means are aligned and scored: about half of what the batch
    holds then, and four fifths of the bytes a GPU's events copy back.
    """

    def __init__(self, pipeline: Any, render: Callable[[Any], Any] = lambda result: None,
                 count: Callable[[Any], int] = lambda result: 0, isolate: bool = False,
                 keep_signal: bool = True, keep_events: bool = True):  # fmt: skip
        self.pipeline = pipeline
        self.render = render
        self.count = count
        self.isolate = isolate
        self.keep_signal = keep_signal
        self.keep_events = keep_events

    def prepare(self, a: Assembled) -> None:
        """The batch packed where it came as records alone (the daemon's, kept for a retry read by read), on
        the driver's assembler thread, so that the front thread's time goes to the front stages."""
        if a.batch is None and hasattr(self.pipeline, "front"):  # a test's stand-in may have none: it takes records
            a.batch = packed(a.reads)

    def front(self, a: Assembled) -> None:
        """The batch's leading stages that need no lane (`Pipeline.front`), on the driver's front thread.
        Where they fail, `__call__` runs them again with the rest, and fails or isolates as it does."""
        front = getattr(self.pipeline, "front", None)
        if front is None or a.batch is None:
            return
        a.batch.event_spread = self.keep_events
        try:
            front(a.batch)
        except Exception as exc:  # noqa: BLE001 - the compute step meets it again, where it is handled
            log.debug("the front stages failed on a batch of %d records (%s): run with the rest", a.records_in, exc)
            a.batch.ran.clear()
            return
        if not self.keep_signal and "events" in a.batch.ran:
            a.batch.signal = np.empty(0, a.batch.signal.dtype)

    def __call__(self, a: Assembled) -> Done:
        return self.finish(self.compute(a))

    def compute(self, a: Assembled) -> Done:
        if a.batch is None and not a.records():
            return Done(BatchOutcome(a.records_in, skipped=a.skipped))
        results, failed = self._run(a)
        return Done(outcome_of(a, results, failed, sum(self.count(r) for r in results)), results)

    def finish(self, done: Done) -> Done:
        """Each result rendered by the main sink: on a thread of its own in the driver, as the TSV's text
        (numba's, without the GIL, then Python's string) took a sixth of the compute threads' time."""
        t0 = time.perf_counter()
        done.rendered = [self.render(r) for r in done.results]
        if done.results:
            done.outcome.timings["format"] = done.outcome.timings.get("format", 0.0) + time.perf_counter() - t0
        return done

    def _run(self, a: Assembled) -> tuple[list[Any], dict[str, str]]:
        if a.batch is not None:
            a.batch.event_spread = self.keep_events
        try:
            return [self.pipeline.run_batch(a.batch) if a.batch is not None else self.pipeline.process(a.records())], {}
        except Exception as exc:  # noqa: BLE001 - isolated below, re-raised if not a read's fault
            if not self.isolate or len({r.read_id for r in a.records()}) <= 1:
                raise
            log.error("the pipeline failed on a batch of %d records (%s); retrying read by read", len(a.reads), exc,
                      exc_info=True)
        by_read: dict[str, list[ReadInput]] = {}
        for r in a.reads:
            by_read.setdefault(r.read_id, []).append(r)
        results, failed = [], {}
        first_error: Exception | None = None
        for rid, reads in by_read.items():
            try:
                results.append(self.pipeline.process(reads))
            except Exception as exc:  # noqa: BLE001 - recorded against the read
                first_error = first_error or exc
                failed[rid] = f"{type(exc).__name__}: {exc}"
                log.error("read %s: the pipeline fails on it: %s", rid, failed[rid])
        if len(failed) == len(by_read):
            raise first_error
        return results, failed


def outcome_of(a: Assembled, results: list[Any], failed: dict[str, str], calls: int) -> BatchOutcome:
    """The outcome of an assembled batch from its results and the reads the pipeline failed on."""
    timings: Counter = Counter()
    gpu: Counter = Counter()
    seconds: Counter = Counter()
    skipped = list(a.skipped)
    for r in results:
        skipped += r.skipped
        timings.update(r.timings)
        count_gpu(gpu, seconds, r)
    return BatchOutcome(a.records_in, sum(len(r.read_ids) - len(r.skipped) for r in results),
                        sum(r.n_bases for r in results), calls, skipped, failed,
                        sum(1 for r in a.records() if r.read_id in failed) if failed else 0, dict(timings), gpu,
                        seconds)  # fmt: skip
