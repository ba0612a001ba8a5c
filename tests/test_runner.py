"""The batch driver on its own: batches handed back in the order submitted whatever the threads,
never more than its limit in flight, a failing batch retried read by read (`Stages(isolate=True)`),
a failure anywhere raised in the caller."""

from __future__ import annotations

import random
import threading
import time

import pytest

from streamer.pipeline.runner import BatchDriver
from streamer.pipeline.steps import Assembled, Done, Stages
from streamer.skips import Skip, Skipped
from streamer.summary import PIPELINE_ERROR, BatchOutcome, RunSummary, tally


class Numbered:
    """A job that notes when it started and waits a random moment to assemble."""

    def __init__(self, n: int, started: list[int]):
        self.n, self.started = n, started

    def start(self) -> None:
        self.started.append(self.n)

    def assemble(self) -> int:
        time.sleep(random.random() / 200)
        return self.n


def slow_compute(n: int) -> Done:
    time.sleep(random.random() / 50)  # later batches often finish first
    return Done(BatchOutcome(records_in=n))


def test_batches_come_back_in_the_order_submitted():
    driver = BatchDriver(slow_compute, compute_threads=4, limit=6)
    try:
        got = [d.outcome.records_in for d in driver.run(Numbered(n, []) for n in range(40))]
    finally:
        driver.close()
    assert got == list(range(40))


def test_the_front_step_runs_on_each_batch_in_order_before_its_compute_and_a_failure_there_is_raised():
    """With a GPU, each batch's leading CPU stages run on the front thread while others compute."""
    fronted: list[int] = []

    def front(n: int) -> None:
        fronted.append(n)

    def compute(n: int) -> Done:
        assert n in fronted  # its front step came first
        return slow_compute(n)

    driver = BatchDriver(compute, compute_threads=3, limit=6, front=front)
    try:
        got = [d.outcome.records_in for d in driver.run(Numbered(n, []) for n in range(30))]
    finally:
        driver.close()
    assert got == list(range(30)) and fronted == list(range(30))

    def failing(n: int) -> None:
        if n == 3:
            raise ValueError("front failed")

    driver = BatchDriver(slow_compute, compute_threads=2, limit=4, front=failing)
    try:
        with pytest.raises(ValueError, match="front failed"):
            list(driver.run(Numbered(n, []) for n in range(10)))
    finally:
        driver.close()


def test_the_finishing_step_renders_off_the_compute_threads_and_a_failure_there_is_raised():
    """Each computed batch is finished (its rows rendered) on a thread of its own before it is taken."""
    finished: dict[int, str] = {}

    def finish(done: Done) -> Done:
        finished[done.outcome.records_in] = threading.current_thread().name
        done.rendered = [str(done.outcome.records_in)]
        return done

    driver = BatchDriver(slow_compute, compute_threads=3, limit=6, finish=finish)
    try:
        got = [d.rendered for d in driver.run(Numbered(n, []) for n in range(30))]
    finally:
        driver.close()
    assert got == [[str(n)] for n in range(30)] and set(finished.values()) == {"finish"}

    def failing(done: Done) -> Done:
        if done.outcome.records_in == 3:
            raise ValueError("render failed")
        return done

    driver = BatchDriver(slow_compute, compute_threads=2, limit=4, finish=failing)
    try:
        with pytest.raises(ValueError, match="render failed"):
            list(driver.run(Numbered(n, []) for n in range(10)))
    finally:
        driver.close()


def test_no_more_than_the_limit_in_flight():
    started: list[int] = []
    gate = threading.Event()

    def held(n: int) -> Done:
        gate.wait(30)
        return Done(BatchOutcome(records_in=n))

    driver = BatchDriver(held, compute_threads=2, limit=3)
    try:
        feeder = threading.Thread(target=lambda: [driver.submit(Numbered(n, started)) for n in range(5)])
        feeder.start()
        deadline = time.monotonic() + 30
        while len(started) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert started == [0, 1, 2] and driver.in_flight == 3  # the fourth waits for room
        gate.set()
        assert [driver.take().outcome.records_in for _ in range(3)] == [0, 1, 2]
        feeder.join(30)  # room made: the last two are submitted
        assert started == [0, 1, 2, 3, 4]
        assert [driver.take().outcome.records_in for _ in range(2)] == [3, 4] and driver.in_flight == 0
    finally:
        gate.set()
        driver.close()


def test_take_ready_waits_no_longer_than_asked_and_halt_lets_only_the_batches_in_the_stages_finish():
    """The daemon's engine polls for done batches while it takes files (`take_ready`); on SIGTERM the
    batches in the stages finish and the rest never start (`halt`), to be done again after a restart."""
    entered, gate = threading.Semaphore(0), threading.Event()

    def held(n: int) -> Done:
        entered.release()
        gate.wait(30)
        return Done(BatchOutcome(records_in=n))

    driver = BatchDriver(held, compute_threads=1, limit=4)
    try:
        assert driver.take_ready(0.0) is None and not driver.oldest_coming  # nothing in flight
        for n in range(3):
            driver.submit(Numbered(n, []))
        assert entered.acquire(timeout=30)  # batch 0 is in the stages, 1 and 2 wait
        t0 = time.monotonic()
        assert driver.take_ready(0.1) is None and time.monotonic() - t0 < 10
        driver.halt()
        gate.set()
        assert driver.oldest_coming and driver.take_ready(30).outcome.records_in == 0
        time.sleep(0.1)
        assert not driver.oldest_coming and driver.take_ready(0.0) is None and driver.in_flight == 2
        assert not entered.acquire(timeout=0.2)  # batches 1 and 2 never entered the stages
    finally:
        gate.set()
        driver.close()


class Result:
    """What the driver reads of a pipeline's result."""

    def __init__(self, reads: list[Read]):
        self.read_ids = [r.read_id for r in reads]
        self.skipped = [Skipped(r.read_id, Skip.NO_CPG, "none") for r in reads if r.read_id.startswith("nocpg")]
        self.n_bases = 10 * len(reads)
        self.timings = {"align": 0.5}


class Read:
    def __init__(self, read_id: str):
        self.read_id = read_id


class Poisoned:
    """A pipeline that raises on any batch holding a poisoned read, as a bug on one read would."""

    def __init__(self, poison: set[str]):
        self.poison = poison
        self.batches: list[list[str]] = []

    def process(self, reads: list[Read]) -> Result:
        self.batches.append([r.read_id for r in reads])
        if "*" in self.poison or self.poison & {r.read_id for r in reads}:
            raise IndexError("index 7 is out of bounds")
        return Result(reads)


def assembled(*ids: str) -> Assembled:
    planned = [Skipped("lowq", Skip.LOW_MAPQ, "mapq 3")]
    return Assembled([Read(i) for i in ids], None, planned, len(ids) + len(planned))


def test_a_failing_batch_is_retried_read_by_read_and_the_failing_read_recorded():
    pipeline = Poisoned({"bad"})
    done = Stages(pipeline, render=lambda r: ",".join(r.read_ids), count=lambda r: len(r.read_ids),
                  isolate=True)(assembled("a", "bad", "bad", "nocpg", "b"))  # fmt: skip
    assert pipeline.batches == [["a", "bad", "bad", "nocpg", "b"], ["a"], ["bad", "bad"], ["nocpg"], ["b"]]
    assert done.rendered == ["a", "nocpg", "b"]
    o = done.outcome
    assert o.failed == {"bad": "IndexError: index 7 is out of bounds"} and o.records_lost == 2
    assert tally(o) == {"records_in": 6, "records_called": 2, "bases": 30, "calls": 3, "skipped.low mapq": 1,
                        "skipped.no cpg": 1, f"skipped.{PIPELINE_ERROR}": 2}  # fmt: skip
    summary = RunSummary()
    summary.add(o)
    assert (summary.reads_in, summary.reads_called, summary.bases, summary.calls) == (6, 2, 30, 3)
    assert summary.skipped == {"low mapq": 1, "no cpg": 1, PIPELINE_ERROR: 2}
    assert summary.stage_seconds["align"] == 1.5 and "format" in summary.stage_seconds


def test_a_batch_where_every_read_fails_raises_and_without_isolation_the_first_failure_does():
    with pytest.raises(IndexError):
        Stages(Poisoned({"*"}), isolate=True)(assembled("a", "b"))
    pipeline = Poisoned({"bad"})
    with pytest.raises(IndexError):
        Stages(pipeline)(assembled("a", "bad"))
    assert pipeline.batches == [["a", "bad"]]  # not retried


def test_a_failure_in_a_thread_is_raised_in_the_caller():
    """Raised at the caller's next take; the batches it took before came in order, none from the failed one on.
    (Which of the batches before the failure it took first depends on the threads' timing: a busy machine
    finishes batch 2 after batch 3 fails.)"""

    def compute(n: int) -> Done:
        if n == 3:
            raise RuntimeError("disk on fire")
        return Done(BatchOutcome(records_in=n))

    driver = BatchDriver(compute, compute_threads=2, limit=4)
    got = []
    try:
        with pytest.raises(RuntimeError, match="on fire"):
            for done in driver.run(Numbered(n, []) for n in range(10)):
                got.append(done.outcome.records_in)
    finally:
        driver.close()
    assert got == [0, 1, 2][: len(got)]


def test_the_front_step_lets_the_signal_go_once_the_events_are_in_unless_asked_to_keep_it():
    import numpy as np
    from types import SimpleNamespace

    class Front:
        def __init__(self, fails: bool):
            self.fails = fails

        def front(self, batch) -> None:
            batch.ran["events"] = 0.1
            if self.fails:
                raise ValueError("a bad read")

    def assembled():
        batch = SimpleNamespace(signal=np.ones(10, np.float32), ran={}, n=1)
        return Assembled([], batch, [], 1)

    a = assembled()
    Stages(Front(False), keep_signal=False).front(a)
    assert a.batch.signal.size == 0 and a.batch.signal.dtype == np.float32 and a.batch.ran == {"events": 0.1}
    a = assembled()
    Stages(Front(False)).front(a)  # a sink renders samples: kept
    assert a.batch.signal.size == 10
    a = assembled()
    Stages(Front(True), keep_signal=False).front(a)  # failed: the compute step runs the events again, from the signal
    assert a.batch.signal.size == 10 and a.batch.ran == {}


def test_records_are_packed_on_the_assembler_thread_and_kept_for_a_retry():
    """The daemon assembles records (a retry goes read by read): the assembler's step packs them, so the
    front step's time goes to the front stages; records the packer refuses stay records for the stages."""
    from dataclasses import replace

    from streamer.pipeline.batch import synthetic_read
    from streamer.pore.model import load_kmer_model

    fronted = []

    class Front:
        def front(self, batch) -> None:
            fronted.append(batch)

    reads = [synthetic_read(load_kmer_model(None))]
    stages = Stages(Front(), isolate=True)
    a = Assembled(reads, None, [], 1)
    stages.prepare(a)
    assert a.batch.read_ids == ["warm-up"] and a.reads == reads and fronted == []
    stages.front(a)
    assert fronted == [a.batch]
    refused = Assembled([replace(reads[0], signal=None)], None, [], 1)
    stages.prepare(refused)
    stages.front(refused)
    assert refused.batch is None and fronted == [a.batch]
