"""f5c's tuning monitor (paper 4.3.4, Fig. 9): two decision trees over one batch's measurements.

The trees are pure functions of the measurements, with the paper's thresholds. The only state
is the run of consecutive batches that reached the same leaf: a leaf is advice only once it
repeats more than 3 times in a row, counted as f5c counts (first sighting, then 4 repeats).
Guards keep batches whose measurements say nothing about the settings (the last batch of a
run, a single read, a GPU failure, a batch too small or too quick to time) out of the trees;
such a batch neither extends nor breaks a run of leaves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from streamer.compat import StrEnum
from streamer.pipeline.gpu import AbeaBatchStats

UTIL_REASONABLE = 0.70  # an array class is reasonably used above this fraction of its capacity
UTIL_GAP = 0.30  # X and Y utilisations further apart than this are out of proportion
LOAD_FACTOR = 0.30  # |f| above this: one side takes markedly longer than the other
READ_SHARE = 0.10  # more than this share of a batch's reads sent to the CPU for one reason
REPEATS = 3  # a leaf is advice once it repeats more than this many times in a row


class MemoryLeaf(StrEnum):
    """Fig. 9a: are the arena's per-base (X) and per-event (Y) arrays used in proportion, and filled?"""

    FINE = "fine"  # both above 70%
    S1 = "S1"  # X high, Y low, X - Y > 30: raise max-epk or lower avg-epk
    S2 = "S2"  # Y high, X low, Y - X > 30: lower max-epk or raise avg-epk
    UNEVEN = "uneven"  # one above 70%, the other not, within 30 of each other: no advice
    LAST = "last batch"  # both low, n < K and b < B: end of input (or a partial batch), no advice
    S3 = "S3"  # both low, B reached first: raise B
    S4 = "S4"  # both low, K reached first: raise K
    BOTH_CAPS = "both caps"  # both low with K and B both reached: f5c leaves it unhandled, no advice


class LoadLeaf(StrEnum):
    """Fig. 9b: do the CPU and the GPU take similar times over a batch, and if not, why?"""

    T1 = "T1"  # CPU slow, > 10% of reads did not fit the arena: lower K (or B)
    T2 = "T2"  # CPU slow, > 10% of reads too long for the GPU: raise max-lf
    T3 = "T3"  # CPU slow, > 10% of reads over max-epk: raise max-epk
    T4 = "T4"  # CPU slow otherwise: lower ultra-thresh, more threads, or the CPU is too weak
    T5 = "T5"  # GPU slow: lower max-lf / max-epk, raise ultra-thresh, or the GPU is too weak
    BALANCED = "balanced"


ADVICE = {
    MemoryLeaf.S1: "GPU event arrays under-used: raise max-epk or lower avg-epk",
    MemoryLeaf.S2: "GPU read arrays under-used: lower max-epk or raise avg-epk",
    MemoryLeaf.S3: "GPU arrays under-used and B reached first: raise B (max bases per batch)",
    MemoryLeaf.S4: "GPU arrays under-used and K reached first: raise K (max reads per batch)",
    LoadLeaf.T1: "CPU got too much work, reads that did not fit the GPU arena: lower K (or B)",
    LoadLeaf.T2: "CPU got too much work, very long reads: raise max-lf",
    LoadLeaf.T3: "CPU got too much work, over-segmented reads: raise max-epk",
    LoadLeaf.T4: "CPU took too long: lower ultra-thresh or use more threads; else the CPU is too weak for this GPU",
    LoadLeaf.T5: "GPU took too long: raise ultra-thresh, lower max-lf or max-epk; else the GPU is too weak for this CPU",
}

Leaf = MemoryLeaf | LoadLeaf


class Guard(StrEnum):
    """Why a tree did not look at a batch (the false alarms f5c users reported, and our own)."""

    LAST_BATCH = "last batch"  # the run's last batch: partial by nature (both trees)
    SINGLE_READ = "single read"  # one read, K > 1 (a read longer than B): nothing to balance (both)
    GPU_FALLBACK = "gpu fallback"  # the GPU part failed and ran on the CPU: times are not the split's (both)
    SETTLING = "settling"  # settings just changed: the batch may predate them (both)
    TINY = "tiny"  # too few reads, or too little time, to compare CPU and GPU (load tree only)


BOTH_TREES = frozenset({Guard.LAST_BATCH, Guard.SINGLE_READ, Guard.GPU_FALLBACK, Guard.SETTLING})


@dataclass(frozen=True)
class GuardLimits:
    """A batch is tiny for the load tree below min_reads reads or min_seconds of CPU + GPU time.

    20 reads: one read is then 5% of the batch, so a 10% share needs three. 50 ms: the GPU's fixed
    cost per batch (packing, copies, four launches) is a few ms, and would otherwise read as T5.
    """

    min_reads: int = 20
    min_seconds: float = 0.05


@dataclass(frozen=True)
class Measurements(AbeaBatchStats):
    """Table 3 of the paper for one batch: its `AbeaBatchStats` with the caps K and B it was assembled
    under, and whether it is the run's last (the end-of-run drain)."""

    last: bool = False

    @classmethod
    def from_stats(cls, stats: AbeaBatchStats, max_reads: int, max_bases: int, last: bool = False) -> Measurements:
        return cls(**{**asdict(stats), "max_reads": max_reads, "max_bases": max_bases, "last": last})

    @property
    def factor(self) -> float:
        """f = (t_cpu - t_gpu) / (t_cpu + t_gpu): positive when the CPU side is slower."""
        total = self.t_cpu + self.t_gpu
        return (self.t_cpu - self.t_gpu) / total if total > 0 else 0.0

    @property
    def seconds(self) -> float:
        """What a change of the settings is judged by: the batch's stages, where the pipeline measured them
        (the CPU the split hands reads to is theirs too); else the ABEA stage's wall time (split, packing and
        merge included); unmeasured, CPU and GPU side by side, then the ultra-long reads."""
        if self.t_batch > 0:
            return self.t_batch
        if self.t_wall > 0:
            return self.t_wall
        return max(self.t_cpu, self.t_gpu) + self.t_ultra

    @property
    def rate(self) -> float:
        """Bases per second of `seconds`."""
        return self.n_bases / self.seconds if self.seconds > 0 else 0.0


def memory_leaf(m: Measurements) -> MemoryLeaf:
    """Fig. 9a, branch for branch as f5c's memory_balance."""
    x, y = m.x_util, m.y_util
    if x > UTIL_REASONABLE:
        if y > UTIL_REASONABLE:
            return MemoryLeaf.FINE
        return MemoryLeaf.S1 if x - y > UTIL_GAP else MemoryLeaf.UNEVEN
    if y > UTIL_REASONABLE:
        return MemoryLeaf.S2 if y - x > UTIL_GAP else MemoryLeaf.UNEVEN
    if m.n_reads < m.max_reads:
        return MemoryLeaf.LAST if m.n_bases < m.max_bases else MemoryLeaf.S3
    return MemoryLeaf.S4 if m.n_bases < m.max_bases else MemoryLeaf.BOTH_CAPS


def load_leaf(m: Measurements, f: float | None = None, threshold: float = LOAD_FACTOR) -> LoadLeaf:
    """Fig. 9b, branch for branch as f5c's load_balance (shares of the batch's reads, n).

    f defaults to the batch's own; the controller also asks with a window's mean f and a
    tighter threshold, when it carries a correction through.
    """
    f = m.factor if f is None else f
    if f > threshold:
        share = READ_SHARE * m.n_reads
        if m.n_memout > share:
            return LoadLeaf.T1
        if m.n_long > share:
            return LoadLeaf.T2
        if m.n_events > share:
            return LoadLeaf.T3
        return LoadLeaf.T4
    if f < -threshold:
        return LoadLeaf.T5
    return LoadLeaf.BALANCED


def guards(m: Measurements, limits: GuardLimits = GuardLimits()) -> tuple[Guard, ...]:
    """The guards that apply to this batch, in Guard order."""
    found = []
    if m.last:
        found.append(Guard.LAST_BATCH)
    if m.n_reads <= 1 and m.max_reads > 1:
        found.append(Guard.SINGLE_READ)
    if m.fallback:
        found.append(Guard.GPU_FALLBACK)
    if m.n_reads < limits.min_reads or m.t_cpu + m.t_gpu < limits.min_seconds:
        found.append(Guard.TINY)
    return tuple(found)


@dataclass(frozen=True)
class Decision:
    """One batch through both trees: the measurements, the guards, each tree's leaf and its run length.

    A leaf is None where a guard kept the batch from that tree. advice holds the advice leaves
    (S1-S4, T1-T5) whose run has passed REPEATS repeats with this batch.
    """

    batch: int
    measurements: Measurements
    guards: tuple[Guard, ...]
    memory: MemoryLeaf | None
    load: LoadLeaf | None
    memory_run: int
    load_run: int
    advice: tuple[Leaf, ...]

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for logs and the `tuning` topic."""
        m = self.measurements
        return {"kind": "decision", "batch": self.batch, "memory": _plain(self.memory), "load": _plain(self.load),
                "memory_run": self.memory_run, "load_run": self.load_run, "advice": [str(a) for a in self.advice],
                "guards": [str(g) for g in self.guards], "factor": round(m.factor, 4),
                "measurements": asdict(m)}  # fmt: skip

    def summary(self) -> str:
        m = self.measurements
        return (f"batch {self.batch}: memory {_plain(self.memory) or 'guarded'} (x {m.x_util:.0%}, y {m.y_util:.0%}), "
                f"load {_plain(self.load) or 'guarded'} (cpu {m.t_cpu:.3f} s, gpu {m.t_gpu:.3f} s, f {m.factor:+.2f})"
                + (f", guards: {', '.join(self.guards)}" if self.guards else ""))  # fmt: skip


def _plain(leaf: Leaf | None) -> str | None:
    return None if leaf is None else str(leaf)


class Monitor:
    """Runs of consecutive leaves per tree; `observe` one batch at a time."""

    def __init__(self, limits: GuardLimits = GuardLimits()):
        self.limits = limits
        self._batch = 0
        self._memory: tuple[MemoryLeaf | None, int] = (None, 0)
        self._load: tuple[LoadLeaf | None, int] = (None, 0)

    def observe(self, m: Measurements, extra: tuple[Guard, ...] = ()) -> Decision:
        """Both trees over one batch; extra guards come from the caller (Guard.SETTLING)."""
        self._batch += 1
        found = tuple(g for g in Guard if g in set(guards(m, self.limits)) | set(extra))
        whole = BOTH_TREES.intersection(found)
        mem = None if whole else memory_leaf(m)
        load = None if whole or Guard.TINY in found else load_leaf(m)
        if mem is not None:
            self._memory = _extend(self._memory, mem)
        if load is not None:
            self._load = _extend(self._load, load)
        advice = tuple(leaf for leaf, run in (self._memory, self._load)
                       if leaf is not None and leaf in ADVICE and run - 1 > REPEATS)  # fmt: skip
        return Decision(self._batch, m, found, mem, load, self._memory[1], self._load[1], advice)

    def reset(self) -> None:
        """Forget the runs: evidence gathered under settings that have just changed."""
        self._memory = (None, 0)
        self._load = (None, 0)


def _extend(run: tuple[Any, int], leaf: Any) -> tuple[Any, int]:
    return (leaf, run[1] + 1) if run[0] == leaf else (leaf, 1)
