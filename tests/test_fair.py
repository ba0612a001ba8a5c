"""Several runs on one pipeline: turns go round the runs with a batch ready, none starves."""

from __future__ import annotations

import threading

from streamer.daemon.fair import FairQueue, SharedPipeline


def grants(q: FairQueue, n: int) -> list:
    out = []
    for _ in range(n):
        run = q.grant()
        out.append(run)
        if run is not None:
            q.done()
    return out


def test_a_run_with_one_batch_is_served_behind_at_most_one_of_a_backlog():
    q = FairQueue()
    for _ in range(100):
        q.ask("a")
    assert grants(q, 3) == ["a", "a", "a"]  # alone, a takes every turn
    q.ask("b")
    assert grants(q, 1) == ["b"]  # b was never served: it goes before a's 98th
    assert q.served == {"a": 3, "b": 1}


def test_backlogged_runs_alternate():
    q = FairQueue()
    for _ in range(5):
        q.ask("a")
        q.ask("b")
        q.ask("c")
    assert grants(q, 15) == ["a", "b", "c"] * 5
    assert q.grant() is None


def test_a_run_that_comes_back_waits_its_turn_behind_the_others_not_for_the_backlog():
    q = FairQueue()
    for _ in range(10):
        q.ask("a")
    q.ask("b")
    assert grants(q, 2) == ["a", "b"]
    q.ask("b")  # b has a new batch while a still has 9
    assert grants(q, 4) == ["a", "b", "a", "a"]


def test_slots_bound_the_batches_in_flight():
    q = FairQueue(slots=2)
    for run in "abc":
        q.ask(run)
    assert [q.grant(), q.grant(), q.grant()] == ["a", "b", None]
    q.done()
    assert q.grant() == "c"


class Recorder:
    """A pipeline that notes which run's batch it ran, one at a time."""

    def __init__(self, hold: threading.Event):
        self.order: list[str] = []
        self.hold = hold

    def process(self, reads):
        self.hold.wait(timeout=30)
        self.order.append(reads)
        return reads


def test_shared_pipeline_interleaves_two_runs_threads():
    hold = threading.Event()
    pipe = Recorder(hold)
    shared = SharedPipeline(pipe)
    views = {run: shared.for_run(run) for run in "ab"}
    first = threading.Thread(target=views["a"].process, args=("a0",))
    first.start()  # a's first batch holds the pipeline until `hold`
    while shared.queue.running == 0:
        threading.Event().wait(0.01)
    threads = [threading.Thread(target=lambda run=run: [views[run].process(f"{run}{i}") for i in range(1, 4)])
               for run in "ab"]  # fmt: skip
    for t in threads:
        t.start()
    while len(shared.queue.waiting) < 2:  # both runs queued behind a0
        threading.Event().wait(0.01)
    hold.set()
    for t in (first, *threads):
        t.join(timeout=30)
    runs = [name[0] for name in pipe.order]
    assert pipe.order[0] == "a0" and sorted(pipe.order) == ["a0", "a1", "a2", "a3", "b1", "b2", "b3"]
    # after a0, b (never served) goes first, then the two alternate while both have batches
    assert runs[1:] == ["b", "a", "b", "a", "b", "a"]
