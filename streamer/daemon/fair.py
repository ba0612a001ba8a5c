"""Several runs, one pipeline: whose batch goes next, so that no run starves behind another's backlog.

`FairQueue` is the decision, pure: runs ask for a turn; a free slot goes to the asking run that
was last served longest ago (round robin over the runs with a batch ready, in the order they
first asked among those never served). A run with a backlog of a hundred batches and a run with
one therefore alternate: the second waits at most one batch per other run. `SharedPipeline` is
the threads' side: each run's daemon calls its `RunPipeline.process`, which waits for the turn.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Hashable
from typing import Any


class FairQueue:
    """Turns on `slots` batches at a time, round robin over the runs that have one ready."""

    def __init__(self, slots: int = 1):
        self.slots = slots
        self.running = 0
        self.waiting: dict[Hashable, int] = {}  # run -> batches it has ready
        self.last: dict[Hashable, int] = {}  # run -> tick of its last turn
        self.first: dict[Hashable, int] = {}  # run -> tick it first asked (order among the never served)
        self.served: dict[Hashable, int] = {}
        self._tick = itertools.count(1)

    def ask(self, run: Hashable) -> None:
        self.waiting[run] = self.waiting.get(run, 0) + 1
        self.first.setdefault(run, next(self._tick))

    def grant(self) -> Hashable | None:
        """The run whose batch takes the free slot now, or None (no slot, or no one asking)."""
        if self.running >= self.slots or not self.waiting:
            return None
        run = min(self.waiting, key=lambda r: (self.last.get(r, 0), self.first[r]))
        self.waiting[run] -= 1
        if not self.waiting[run]:
            del self.waiting[run]
        self.last[run] = next(self._tick)
        self.served[run] = self.served.get(run, 0) + 1
        self.running += 1
        return run

    def done(self) -> None:
        self.running -= 1


class SharedPipeline:
    """One warm pipeline behind a `FairQueue`: `for_run(name)` is what that run's daemon calls."""

    def __init__(self, pipeline: Any, slots: int = 1):
        self.pipeline = pipeline
        self.queue = FairQueue(slots)
        self._changed = threading.Condition()
        self._granted: list[Hashable] = []  # runs granted a turn whose thread has not yet taken it

    def for_run(self, run: Hashable) -> RunPipeline:
        return RunPipeline(self, run)

    def _turn(self, run: Hashable) -> None:
        with self._changed:
            self.queue.ask(run)
            self._grant()
            while run not in self._granted:
                self._changed.wait()
            self._granted.remove(run)

    def _release(self) -> None:
        with self._changed:
            self.queue.done()
            self._grant()

    def _grant(self) -> None:
        while (run := self.queue.grant()) is not None:
            self._granted.append(run)
        self._changed.notify_all()


class RunPipeline:
    """A run's view of the shared pipeline (`streamer.daemon.shell.PipelineLike`): a batch waits for its turn."""

    def __init__(self, shared: SharedPipeline, run: Hashable):
        self.shared = shared
        self.run = run

    def __getattr__(self, name: str) -> Any:  # gpu, options, devices: the pipeline's
        return getattr(self.shared.pipeline, name)

    def process(self, reads):
        self.shared._turn(self.run)
        try:
            return self.shared.pipeline.process(reads)
        finally:
            self.shared._release()
