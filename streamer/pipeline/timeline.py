"""A run's timeline: when each batch was read, packed, computed stage by stage and written, on the
threads and processes that did it, so that what a run waits on can be seen rather than guessed
from summed stage times (`streamer call --trace FILE`; open FILE in Perfetto or chrome://tracing).

Off by default: `span` and `record` then return at once. Times are `time.perf_counter()`, which on
Linux is the system-wide monotonic clock, so a reader process's spans line up with the main
process's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_lock = threading.Lock()
_events: list[dict] | None = None
_limit: int | None = None


def start(limit: int | None = None) -> None:
    """Record spans from now on, the first `limit` of them (a daemon's: its memory stays bounded); a second
    start forgets what was recorded."""
    global _events, _limit
    with _lock:
        _events, _limit = [], limit


def recording() -> bool:
    return _events is not None


def record(name: str, t0: float, t1: float, where: str | None = None, stats: object = None, cpu: float | None = None,
           **args: object) -> None:  # fmt: skip
    """A span from t0 to t1 (perf_counter seconds) on `where` (default: this process and thread); `stats`, a GPU
    stage's measurements, adds their seconds by part (the `t_` fields: packing, copies, kernels); `cpu`, the
    recording thread's CPU seconds in it (`thread_cpu`), as `cpu_ms`: what the span did not spend waiting (for the
    GIL, the GPU, or a parallel region's other threads, whose work is not the thread's)."""
    if _events is None:
        return
    fields = getattr(stats, "__dataclass_fields__", {})
    args |= {f: round(getattr(stats, f), 6) for f in fields if f.startswith("t_")}
    if cpu is not None:
        args["cpu_ms"] = round(cpu * 1e3, 3)
    event = {"name": name, "ph": "X", "ts": round(t0 * 1e6, 1), "dur": round((t1 - t0) * 1e6, 1),
             "pid": "streamer", "tid": where or f"{os.getpid()} {threading.current_thread().name}"}
    if args:
        event["args"] = args
    with _lock:
        if _events is not None and (_limit is None or len(_events) < _limit):
            _events.append(event)


def count(name: str, **series: float) -> None:
    """A counter's values now, by series (Perfetto draws them stacked, on a track beside the threads)."""
    if _events is None:
        return
    event = {"name": name, "ph": "C", "ts": round(time.perf_counter() * 1e6, 1), "pid": "streamer", "args": series}
    with _lock:
        if _events is not None and (_limit is None or len(_events) < _limit):
            _events.append(event)


@contextmanager
def span(name: str, **args: object) -> Iterator[None]:
    """The time the `with` block takes, as a span on this thread, with the thread's CPU seconds in it."""
    if _events is None:
        yield
        return
    t0, c0 = time.perf_counter(), thread_cpu()
    try:
        yield
    finally:
        record(name, t0, time.perf_counter(), cpu=thread_cpu() - c0, **args)


def thread_cpu() -> float:
    """The calling thread's CPU seconds so far (a span's `cpu`: its end's less its start's)."""
    return time.thread_time()


def write(path: Path) -> int:
    """The spans recorded so far as a Chrome trace (JSON), earliest first; how many."""
    with _lock:
        events = sorted(_events or [], key=lambda e: e["ts"])
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n")
    return len(events)
