"""Helpers for the daemon's tests: leak checks, a fast stand-in pipeline, run folders."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import NamedTuple

import pytest

import numpy as np

from streamer_plugins.cpg.calls import MethCalls
from streamer_plugins.texts import Texts
from streamer.skips import Skip, Skipped


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def no_leaks():
    """Fail a test that leaves a thread running or a file descriptor open."""
    threads = set(threading.enumerate())
    fds = _open_fds()
    yield
    extra = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not extra, f"threads left running: {extra}"
    leaked = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in _open_fds() - fds if os.path.exists(f"/proc/self/fd/{fd}")}
    leaked = {fd: target for fd, target in leaked.items() if not target.startswith("anon_inode:")}
    assert not leaked, f"file descriptors left open: {leaked}"


class FakeResult:
    """One call per record that goes on, at its alignment start; enough to check exactly-once."""

    def __init__(self, reads, skip_ids):
        self.batch = None
        self.read_ids = [r.read_id for r in reads]
        self.ref_names = [r.ref_name for r in reads]
        self.skipped = [Skipped(r.read_id, Skip.NO_EVENTS, "fake") for r in reads if r.read_id in skip_ids]
        keep = [i for i, r in enumerate(reads) if r.read_id not in skip_ids]
        n = len(keep)
        start = np.array([reads[i].ref_start for i in keep], dtype=np.int64)
        calls = MethCalls(
            read=np.array(keep, dtype=np.int64), start=start, end=start.copy(),
            strand=np.array([-1 if reads[i].rc else 1 for i in keep], dtype=np.int8),
            llr=np.full(n, 3.0), ll_meth=np.full(n, -1.0), ll_unmeth=np.full(n, -4.0),
            num_motifs=np.ones(n, dtype=np.int32), sequence=Texts.of(["ACGTT"] * n),
        )
        self.products = {"calls": calls}
        self.n_bases = sum(len(r.seq) for r in reads)
        self.timings: dict[str, float] = {}


class FakePipeline:
    """Stands in for `streamer.pipeline.stages.Pipeline` where the numbers do not matter."""

    def __init__(self, skip_ids=(), gate: threading.Event | None = None, poison=()):
        self.skip_ids = set(skip_ids)
        self.poison = set(poison)  # a batch holding one of these raises, as a pipeline bug would
        self.batches: list[list[str]] = []
        self.gate = gate
        self.entered = threading.Event()

    def process(self, reads):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append([r.read_id for r in reads])
        if self.poison & {r.read_id for r in reads} or "*" in self.poison:
            raise IndexError("index 7 is out of bounds")
        return FakeResult(reads, self.skip_ids)

    def run_batch(self, batch):
        """`process` on a packed batch (the daemon packs its batches from the readers' columns)."""
        return self.process([Packed(batch.read_ids[i], batch.ref_names[i], int(batch.ref_start[i]), bool(batch.rc[i]),
                                    batch.seq[batch.seq_off[i] : batch.seq_off[i + 1]]) for i in range(batch.n)])


class Packed(NamedTuple):
    """A record of a packed batch, as much of it as `FakeResult` reads."""

    read_id: str
    ref_name: str
    ref_start: int
    rc: bool
    seq: np.ndarray


def rows(path: Path) -> list[str]:
    """Data rows of a TSV, sorted (the daemon's batch order is not `streamer call`'s)."""
    lines = Path(path).read_text().splitlines(keepends=True)
    return sorted(lines[1:])
