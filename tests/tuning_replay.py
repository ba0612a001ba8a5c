"""A replay of batches through the real GPU ABEA split under a SYNTHETIC COST MODEL (no GPU, no alignment).

Reads are only lengths and event counts. Each batch is cut from the read stream by the caps K
and B as `streamer.pipeline.batching` cuts it, split by the real `streamer_gpu.host.assign_reads` against
the real arena partition (`arena_capacity`), and timed by a model, not measured:

- GPU: a fixed cost per batch, copies per base, and the kernels: band cells over the device's
  aggregate rate, or the longest GPU read's cells over one block's rate, whichever is longer
  (one block per read: a long read holds the batch back, paper 4.3.1);
- CPU: the CPU reads spread longest-first over the threads, each thread at its own cell rate
  (a CPU core aligns one read several times faster than one GPU block does);
- ultra-long reads: the same, after both.

Rates are of the order measured on an H200 (benchmarks/RESULTS-gpu-abea.md: 77 Gcells/s over a
whole batch; 16 CPU threads at 2.5 Gcells/s). The model is for exercising the tuner's decisions
and convergence, not for predicting throughput.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from streamer_gpu.host import CPU, GPU, ULTRA, arena_capacity, assign_reads
from streamer.pipeline.gpu import AbeaBatchStats
from streamer.tuning.controller import Controller
from streamer.tuning.knobs import Settings

K_MER = 6
BANDWIDTH = 100
MAX_EVENTS_PER_BASE = 15.0


@dataclass(frozen=True)
class CostModel:
    """SYNTHETIC: seconds from band cells; see the module docstring."""

    gpu_fixed: float = 0.004
    gpu_per_base: float = 1.0e-9
    gpu_rate: float = 75e9  # cells per second, the whole device
    block_rate: float = 20e6  # cells per second, one read's block
    thread_rate: float = 150e6  # cells per second, one CPU thread


@dataclass(frozen=True)
class Reads:
    """A stream of reads: bases and events of each."""

    lengths: np.ndarray
    events: np.ndarray

    @classmethod
    def synthetic(cls, n: int, seed: int = 1, median: float = 6000, sigma: float = 0.7, epk: float = 1.9,
                  long_share: float = 0.0, long_len: float = 40_000, overseg_share: float = 0.0,
                  overseg_epk: tuple[float, float] = (5.5, 8.0)) -> Reads:  # fmt: skip
        """Log-normal lengths and ~epk events per base; optional shares of long and over-segmented reads."""
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(np.log(median), sigma, n), 300, 400_000)
        longs = rng.random(n) < long_share
        lengths[longs] = rng.normal(long_len, long_len / 8, longs.sum()).clip(long_len / 2)
        per_base = rng.normal(epk, 0.15, n).clip(1.2)
        over = rng.random(n) < overseg_share
        per_base[over] = rng.uniform(*overseg_epk, over.sum())
        lengths = lengths.astype(np.int64)
        return cls(lengths, (lengths * per_base).astype(np.int64))


def cells(lengths: np.ndarray, events: np.ndarray) -> np.ndarray:
    return (events + lengths - K_MER + 1 + 2) * BANDWIDTH


def spread(work: np.ndarray, threads: int, rate: float) -> float:
    """Longest-first greedy schedule of per-read cells over threads: the makespan in seconds."""
    if len(work) == 0:
        return 0.0
    loads = [0.0] * max(1, threads)
    for w in sorted(work.tolist(), reverse=True):
        heapq.heapreplace(loads, loads[0] + w)
    return max(loads) / rate


class Replay:
    """Batches of `reads` under the settings of a controller (or fixed settings), timed by the model."""

    def __init__(self, reads: Reads, arena_bytes: int, threads: int = 16, model: CostModel = CostModel()):
        self.reads = reads
        self.arena_bytes = arena_bytes
        self.threads = threads
        self.model = model
        self.pos = 0

    def next_batch(self, s: Settings) -> tuple[np.ndarray, np.ndarray]:
        """The next batch as assembly cuts it: until K reads or B bases (the read that crosses B is in)."""
        lengths = self.reads.lengths
        n = len(lengths)
        take, bases = [], 0
        while len(take) < s.max_reads and bases < s.max_bases:
            i = self.pos % n
            take.append(i)
            bases += int(lengths[i])
            self.pos += 1
        idx = np.array(take)
        return self.reads.lengths[idx], self.reads.events[idx]

    def run_batch(self, s: Settings) -> AbeaBatchStats:
        lengths, events = self.next_batch(s)
        cap = arena_capacity(self.arena_bytes, s.avg_epk, BANDWIDTH)
        seq_off = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=seq_off[1:])
        ev_off = np.zeros(len(events) + 1, np.int64)
        np.cumsum(events, out=ev_off[1:])
        status = np.zeros(len(lengths), np.int8)
        owner, counts = assign_reads(seq_off, ev_off, status, K_MER, MAX_EVENTS_PER_BASE, s.max_lf, s.max_epk,
                                     s.ultra_thresh, cap.bases, cap.events, cap.rows, cap.reads)  # fmt: skip
        work = cells(lengths, events)
        # over-segmented reads (>= 15 events per base) are failed by the CPU kernel at once: no work
        work[events >= MAX_EVENTS_PER_BASE * lengths] = 0
        m = self.model
        g, c, u = owner == GPU, owner == CPU, owner == ULTRA
        t_gpu = 0.0
        if g.any():
            kernels = max(work[g].sum() / m.gpu_rate, work[g].max() / m.block_rate)
            t_gpu = m.gpu_fixed + lengths[g].sum() * m.gpu_per_base + kernels
        return AbeaBatchStats(
            n_reads=len(lengths), n_bases=int(lengths.sum()), max_reads=s.max_reads, max_bases=s.max_bases,
            n_gpu=int(g.sum()), n_cpu=int(c.sum()), n_ultra=int(u.sum()), n_memout=int(counts[0]),
            n_long=int(counts[1]), n_events=int(counts[2]), x_util=counts[3] / cap.bases, y_util=counts[4] / cap.events,
            t_cpu=spread(work[c], self.threads, m.thread_rate), t_gpu=t_gpu, t_pack=0.0, t_h2d=0.0, t_kernels=0.0,
            t_d2h=0.0, t_ultra=spread(work[u], self.threads, m.thread_rate), cells=int(work[g].sum()),
        )  # fmt: skip


@dataclass(frozen=True)
class Step:
    stats: AbeaBatchStats
    settings: Settings
    decision: object
    actions: tuple


def replay(controller: Controller, replay: Replay, batches: int) -> list[Step]:
    """Run batches, feeding each one's measurements to the controller, whose changes apply from the next."""
    steps = []
    for _ in range(batches):
        s = controller.settings
        stats = replay.run_batch(s)
        actions = controller.observe(stats)
        steps.append(Step(stats, s, controller.decision, tuple(actions)))
    return steps


def fixed(s: Settings, replay: Replay, batches: int) -> list[AbeaBatchStats]:
    return [replay.run_batch(s) for _ in range(batches)]


def throughput(stats: list[AbeaBatchStats]) -> float:
    """Bases per second of the modelled stage over the batches."""
    return sum(st.n_bases for st in stats) / sum(max(st.t_cpu, st.t_gpu) + st.t_ultra for st in stats)



