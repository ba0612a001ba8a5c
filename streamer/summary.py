"""Counts a run reports: reads and bases processed, calls made, every skip by reason, throughput.

Throughput is bases over the wall time after start-up (models loaded, kernels compiled or loaded
from numba's cache, which on a machine's first run takes tens of seconds): the figure to hold
against a sequencer's output (one PromethION flow cell peaks near 1 Mbases/s); start-up is
reported on its own. Stage times are summed over the real batches (the warm-up batch that
compiles the kernels is start-up); where batches overlap (`streamer call`) they add up to more
than the wall time, and `waits` says which side waited for the other.

Peak memory is the proportional set size (PSS) summed over this process and every process it
started (signal readers, their fork server), sampled while the run goes: reader processes share
pages with each other, so summing their RSS would count those pages several times. Where there
is no /proc (macOS), it is this process's peak RSS.

Every driver of batches (`streamer call` here or on Dask, `streamer eventalign`, the daemon)
hands back a `BatchOutcome` per batch and counts it with `tally`: the counters of a run
summary and of the daemon's ledger are the same numbers, counted once.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from streamer.pipeline import timeline
from streamer.skips import Skip, Skipped

PIPELINE_ERROR = "pipeline error"  # an outcome beyond `Skip`: the pipeline raised on this read alone


@dataclass
class BatchOutcome:
    """How a batch's alignment records ended: every one either called, skipped (planning, signal,
    stages) or lost with a read the pipeline failed on alone; and what the batch made."""

    records_in: int
    records_called: int = 0
    bases: int = 0  # of the records sent through the stages
    calls: int = 0  # rows the batch's main sink made of it
    skipped: list[Skipped] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # read id -> why the pipeline failed on it
    records_lost: int = 0  # the records of `failed` reads
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    gpu: Counter = field(default_factory=Counter)  # GPU stage counts (`RunSummary.gpu`)
    gpu_seconds: Counter = field(default_factory=Counter)  # where the GPU stages' time went (`RunSummary.gpu_seconds`)


def tally(outcome: BatchOutcome) -> Counter:
    """The batch's counters: records in, called, bases, calls, and `skipped.<reason>` per record skipped."""
    counters = Counter({"records_in": outcome.records_in, "records_called": outcome.records_called,
                        "bases": outcome.bases, "calls": outcome.calls})  # fmt: skip
    counters.update(f"skipped.{s.reason.label}" for s in outcome.skipped)
    counters[f"skipped.{PIPELINE_ERROR}"] += outcome.records_lost
    return counters


def count_gpu(gpu: Counter, seconds: Counter, result: Any) -> None:
    """A batch result's GPU stage counts into `gpu` and, by part, their seconds into `seconds` (`BatchOutcome`'s
    fields; the stage's wall time is in its `timings`)."""
    g = getattr(result, "gpu_stats", None)
    if g is not None:
        gpu["abea_reads_gpu"] += g.n_gpu
        gpu["abea_reads_cpu"] += g.n_cpu + g.n_ultra
        gpu["abea_batches_fallback"] += bool(g.fallback)
        seconds.update(abea_pack=g.t_pack, abea_h2d=g.t_h2d, abea_kernels=g.t_kernels, abea_d2h=g.t_d2h,
                       abea_cpu_reads=g.t_cpu, abea_ultra_reads=g.t_ultra)  # fmt: skip
    h = getattr(result, "hmm_stats", None)
    if h is not None:
        gpu["hmm_windows_gpu"] += h.n_gpu
        gpu["hmm_windows_cpu"] += h.n_cpu
        gpu["hmm_batches_fallback"] += bool(h.fallback)
        seconds.update(hmm_pack=h.t_pack, hmm_h2d=h.t_h2d, hmm_kernel=h.t_kernel, hmm_d2h=h.t_d2h,
                       hmm_cpu_windows=h.t_cpu)  # fmt: skip


_FIELDS = {"records_in": "reads_in", "records_called": "reads_called", "bases": "bases", "calls": "calls"}


@dataclass
class RunSummary:
    started: float = field(default_factory=time.monotonic)
    reads_in: int = 0  # alignment records considered (the JSON keys keep their names)
    reads_called: int = 0  # records that reached the end of the pipeline
    bases: int = 0  # bases of the records sent through the pipeline
    calls: int = 0  # call rows written
    startup_s: float = 0.0  # from the start until the pipeline was ready (models, kernels, GPU)
    compiled: bool = False  # start-up compiled the kernels (numba's cache did not have them)
    batches_resumed: int = 0  # batches already in the output of a resumed run, not computed again
    skipped: Counter = field(default_factory=Counter)
    stage_seconds: Counter = field(default_factory=Counter)
    waits: Counter = field(default_factory=Counter)  # seconds a step spent waiting for another
    gpu: Counter = field(default_factory=Counter)  # GPU stage counts: windows, reads, batches that fell back
    # the GPU stages' wall seconds by part (packing, copies, kernels, the CPU's share), summed over batches
    gpu_seconds: Counter = field(default_factory=Counter)
    memory_budget: int = 0  # bytes the run was sized for (0: none given)
    peak_memory: int = 0  # bytes, the largest summed PSS sampled (`watching_memory`)

    @contextmanager
    def watching_memory(self, every: float = 0.2, tree_every: int = 10) -> Iterator[None]:
        """Sample the process tree's memory into `peak_memory` while the block runs (a thread, joined at its end),
        and into the timeline where one is recorded, so that it shows what the peak held.

        The tree (every thread's children of every process: hundreds of /proc reads with numba's and
        the readers' threads) is walked again every `tree_every` samples only; its PSS every sample.
        """
        stop = threading.Event()

        def record(pids: list[int]) -> None:
            each = [_pss(pid) for pid in pids]
            self.peak_memory = max(self.peak_memory, sum(each))
            timeline.count("memory MB", this_process=each[0] >> 20, other_processes=sum(each[1:]) >> 20)

        def sample() -> None:
            pids, n = tree_pids(), 0
            while not stop.wait(every):
                n += 1
                if n % tree_every == 0:
                    pids = tree_pids()
                record(pids)
            record(pids)  # at the end too: a run shorter than `every` still has its sample

        self.peak_memory = max(self.peak_memory, tree_pss())
        thread = threading.Thread(target=sample, name="memory-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def skip(self, reason: Skip, n: int = 1) -> None:
        self.skipped[reason.label] += n

    def add(self, outcome: BatchOutcome) -> None:
        """A batch's outcome into the run's counts (`tally`), stage times and GPU counts."""
        for key, n in tally(outcome).items():
            if key.startswith("skipped."):
                if n:
                    self.skipped[key[len("skipped."):]] += n
            else:
                setattr(self, _FIELDS[key], getattr(self, _FIELDS[key]) + n)
        self.stage_seconds.update(outcome.timings)
        self.gpu.update(outcome.gpu)
        self.gpu_seconds.update(outcome.gpu_seconds)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def as_dict(self) -> dict:
        elapsed = self.elapsed
        working = elapsed - self.startup_s
        return {
            "reads_in": self.reads_in,
            "reads_called": self.reads_called,
            "reads_skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "bases": self.bases,
            "calls": self.calls,
            "elapsed_s": round(elapsed, 3),
            "startup_s": round(self.startup_s, 3),
            "compiled_kernels": self.compiled,
            "batches_resumed": self.batches_resumed,
            "bases_per_s": round(self.bases / working, 1) if working > 0 else 0.0,
            "reads_per_s": round(self.reads_called / working, 2) if working > 0 else 0.0,
            "stage_seconds": {k: round(v, 3) for k, v in sorted(self.stage_seconds.items())},
            "waits_s": {k: round(v, 3) for k, v in sorted(self.waits.items())},
            "gpu": dict(sorted(self.gpu.items())),
            "gpu_seconds": {k: round(v, 3) for k, v in sorted(self.gpu_seconds.items())},
            "memory_budget_mb": round(self.memory_budget / 2**20, 1),
            "peak_memory_mb": round(max(self.peak_memory, tree_pss()) / 2**20, 1),
            "threading_layer": threading_layer(),
        }

    def progress_line(self) -> str:
        d = self.as_dict()
        return (
            f"{d['reads_in']} records, {d['reads_called']} called, {d['reads_skipped']} skipped, "
            f"{d['calls']} calls, {d['bases_per_s'] / 1e3:.1f} kbases/s"
        )

    def report(self) -> str:
        d = self.as_dict()
        lines = [  # a read with a supplementary (or kept secondary) alignment is counted once per record
            f"alignment records considered: {d['reads_in']} (one per read and alignment; a read aligned in parts "
            "counts once per part)",
            f"records called:   {d['reads_called']}",
            f"records skipped:  {d['reads_skipped']}",
        ]
        lines += [f"  {reason}: {n}" for reason, n in d["skipped_by_reason"].items()]
        if self.batches_resumed:
            lines.append(f"batches resumed:  {self.batches_resumed} (already in the output, not computed again)")
        lines += [
            f"calls written:    {d['calls']}",
            f"bases processed:  {d['bases']}",
            f"wall time:        {d['elapsed_s']:.2f} s (start-up {d['startup_s']:.2f} s"
            + (", compiling kernels for this machine: first run only)" if self.compiled else ")"),
            f"throughput:       {d['bases_per_s']:.0f} bases/s ({d['bases_per_s'] / 1e6:.2f} Mbases/s, "
            f"{d['reads_per_s']:.1f} reads/s; after start-up)",
        ]
        budget = f" (budget {d['memory_budget_mb']:.0f} MB)" if self.memory_budget else ""
        lines.append(f"peak memory:      {d['peak_memory_mb']:.0f} MB, summed over its processes{budget}")
        total = sum(self.stage_seconds.values())
        if total > 0:
            lines.append("time by stage:    " + ", ".join(
                f"{k} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in sorted(self.stage_seconds.items())
            ))
        if self.waits:
            lines.append("waiting:          " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(self.waits.items())))
        if self.gpu:
            lines.append("GPU:              " + ", ".join(f"{k} {v}" for k, v in sorted(self.gpu.items())))
        return "\n".join(lines)


def threading_layer() -> str | None:
    """numba's threading layer (`streamer.load_tbb`), once a parallel region has run; else None."""
    numba = sys.modules.get("numba")
    try:
        return numba.threading_layer() if numba is not None else None
    except ValueError:  # no region has run
        return None


def tree_pss(pid: int | None = None) -> int:
    """Bytes of PSS summed over process `pid` (this one) and its descendants; peak RSS without /proc."""
    pid = pid or os.getpid()
    if not Path(f"/proc/{pid}/smaps_rollup").exists():
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return sum(map(_pss, tree_pids(pid)))


def tree_pids(pid: int | None = None) -> list[int]:
    """Process `pid` (this one) and its descendants, as /proc shows them (only `pid` without /proc)."""
    found, todo = [], [pid or os.getpid()]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += map(int, Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:  # gone meanwhile, or no /proc
            pass
    return found


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0
