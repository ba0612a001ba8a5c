"""How much device memory a process takes: what its batches need, not what the GPU has.

Several processes share one GPU (a daemon per flow cell, a `streamer call` beside a daemon, a
Jetson's live basecaller), so the ABEA arena is sized from the batches this process will assemble
(K reads, B bases, avg_epk events per base) and capped at `mem_frac` of the free memory less the
reserve (`gpu.reserve`: memory never taken), and at the process's cap where one is set
(`gpu.memory`; on a Jetson the share of the memory budget the host part leaves); the rest of the
process's device memory (the CpG HMM's buffers and the local memory its kernel launch reserves,
the kernel modules, event detection's buffers when it runs there) is counted within the cap before
the arena is taken, so that a later launch does not run out. Pure arithmetic: `plan_memory`
decides, `CudaAbea` allocates, `device_bytes_for` tells the memory plan what a batch size costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.pipeline.gpu import CudaOptions
from streamer_gpu.host import MIN_MEAN_READ_LEN, SLOT_BYTES, bytes_per_base

# batch caps when the caller gives none (`streamer.pipeline.batching.BatchLimits`' defaults)
DEFAULT_MAX_READS = 512
DEFAULT_MAX_BASES = 5_000_000
# the tuner (`streamer.tuning.controller`) grows B by 2x and avg_epk by 1.25x a step; with autotune on
# the arena holds one step up of both, so the first grown batch still fits whole on the GPU (a
# second step spills its excess reads to the CPU threads, which the tuner sees as memout and stops)
AUTOTUNE_BASES = 2.0
AUTOTUNE_EPK = 1.25
# kernel modules loaded after the arena is taken, the model and the driver's small allocations
# (the context itself is already counted out of the free memory measured)
MODULE_BYTES = 256 << 20
# the CUDA context and the runtime's own device memory, which a cap on the process's memory must hold
# too: a bare context took 518 MiB on an H200 (nvidia-smi), the rest is margin for the driver's own
# allocations (`benchmarks/RESULTS-jetson-emulation.md`)
CONTEXT_BYTES = 768 << 20
# local memory the CpG HMM kernel launch reserves per resident thread: its forward rows (6 x 224
# float32); the driver reserves it for every thread the device can hold (2048 x 132 SMs on an H100:
# 1.45 GB), at the first launch, which is where a process that took all the rest runs out
HMM_LOCAL_BYTES_PER_THREAD = 6 * 224 * 4
# the HMM's device buffers per base of the batch: the reference span (1 byte), events (4 bytes per
# event), jobs (about 48 bytes each, at most one per 16 bases), grown by 5/4 when they are replaced
HMM_BYTES_PER_BASE_AT_EPK = (1 + 48 / 16, 4)
# event detection's device buffers hold this many samples of a batch at a time: the signal (4 bytes
# a sample), its two t-statistics (8), its boundaries (4), its kept prefix sums (16 every 16 samples)
# and the events (20 bytes each, about one per 4.5 samples; room for one per 2), grown by 5/4 when
# they are replaced
EVENT_CHUNK_SAMPLES = 1 << 25
EVENT_BYTES = int(EVENT_CHUNK_SAMPLES * (4 + 8 + 4 + 1 + 20 / 2) * 5 / 4)
# below this share of one batch's bases on the GPU, the GPU no longer pays for itself
MIN_BATCH_SHARE = 0.25


@dataclass(frozen=True)
class MemoryPlan:
    """A lane's arena bytes and the rest of its device memory, why the GPU is not used (or ""), and how many
    lanes of that size fit (`CudaOptions.lanes` at most)."""

    arena_bytes: int
    other_bytes: int
    refused: str = ""
    lanes: int = 1


def arena_bytes_for(max_reads: int, max_bases: int, avg_epk: float, bandwidth: int) -> int:
    """Device bytes of an arena that holds one whole batch of max_bases bases and max_reads reads."""
    extra_slots = max(0, max_reads - max_bases // MIN_MEAN_READ_LEN)
    return int(max_bases * bytes_per_base(avg_epk, bandwidth)) + extra_slots * SLOT_BYTES


def hmm_bytes_for(max_bases: int, avg_epk: float, resident_threads: int) -> int:
    """The CpG HMM's device buffers for a batch of max_bases bases, and its kernel's local memory."""
    per_base, per_event = HMM_BYTES_PER_BASE_AT_EPK
    return int(max_bases * (per_base + per_event * avg_epk) * 5 / 4) + HMM_LOCAL_BYTES_PER_THREAD * resident_threads


def fixed_bytes(options: CudaOptions) -> int:
    """What comes off the cap besides the arena and the HMM: the kernel modules, and event detection's
    buffers where events are detected on the GPU (the lane's, and the front lane's that runs them ahead)."""
    return MODULE_BYTES + (2 * EVENT_BYTES if options.events else 0)


def _wanted(options: CudaOptions, bandwidth: int, resident_threads: int, fixed: int) -> tuple[int, int]:
    """(arena, the rest) that options' batches want, with the tuner's room under autotune."""
    max_reads = options.max_reads or DEFAULT_MAX_READS
    max_bases = options.max_bases or DEFAULT_MAX_BASES
    epk = options.avg_epk
    if options.autotune:
        max_reads, max_bases, epk = int(max_reads * AUTOTUNE_BASES), int(max_bases * AUTOTUNE_BASES), epk * AUTOTUNE_EPK
    other = fixed + (hmm_bytes_for(max_bases, epk, resident_threads) if options.hmm else 0)
    return arena_bytes_for(max_reads, max_bases, epk, bandwidth), other


def device_bytes_for(options: CudaOptions, bandwidth: int = 100, resident_threads: int = 0) -> int:
    """Device bytes the process takes for options' batches when memory allows: the whole arena, the rest and
    its context."""
    want, other = _wanted(options, bandwidth, resident_threads, fixed_bytes(options))
    return max(1, options.lanes) * (want + other) + CONTEXT_BYTES


def plan_memory(free_bytes: int, integrated: bool, options: CudaOptions, bandwidth: int = 100,
                resident_threads: int = 0, fixed: int | None = None) -> MemoryPlan:  # fmt: skip
    """One lane's arena for options' batches within mem_frac (default 0.9, 0.7 on integrated GPUs) of
    free_bytes less options.reserve, and within options.memory_cap less the process's context (measured
    free memory is already net of it; a cap on the process's memory is not), each divided among
    options.lanes, or among fewer where a lane would not hold a whole batch.

    The HMM's memory (for resident_threads threads of its kernel) and `fixed` (default
    `fixed_bytes(options)`) come off the cap first. An arena smaller than a quarter of what one batch
    needs is refused: the process runs on the CPU (the GPU would align too few reads to pay for
    itself, and waiting for memory another process holds could wait for days).
    """
    frac = options.mem_frac if options.mem_frac is not None else (0.7 if integrated else 0.9)
    want, other = _wanted(options, bandwidth, resident_threads, fixed_bytes(options) if fixed is None else fixed)
    total = int(max(0, free_bytes - options.reserve) * frac)
    if options.memory_cap is not None:
        total = min(total, options.memory_cap - CONTEXT_BYTES)
    lanes = max(1, options.lanes)
    while lanes > 1 and total // lanes - other < want:  # a lane too small for a whole batch: fewer lanes
        lanes -= 1
    room = total // lanes - other
    if room < want * MIN_BATCH_SHARE:
        why = f"{free_bytes / 1e9:.2f} GB free"
        why += f", less the {options.reserve / 1e9:.2f} GB reserved" if options.reserve else ""
        why += f", {frac:g} of it" + (f" within the {options.memory_cap / 1e9:.2f} GB cap" if options.memory_cap
                                      is not None else "")  # fmt: skip
        return MemoryPlan(0, other, f"{why} leaves {max(room, 0) / 1e9:.2f} GB for a {want / 1e9:.2f} GB arena")
    return MemoryPlan(min(want, room), other, lanes=lanes)
