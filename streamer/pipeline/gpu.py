"""What the core knows of the GPU stages: their options, per-batch measurements and the device.

Plain frozen dataclasses importable without numba-cuda or a GPU, so the pipeline, the command
line and the tuning monitor can name them anywhere. The core never imports the GPU package
(`streamer_gpu`) itself: `gpu_package` is its one way there, through the `streamer.gpu` entry
point (`streamer.registry`), taken only when a GPU stage is asked for, and typed by `GpuPackage`,
what that package offers; it depends on the core, never the reverse.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol, cast

from streamer import registry


class GpuAbea(Protocol):
    """The GPU ABEA stage of one device (`streamer_gpu.abea.CudaAbea`) as the pipeline and the tuner use it."""

    options: CudaOptions
    lanes: int  # lanes of its arena's size the device holds, itself included (`GpuPackage.open_lane`)

    def align(self, reads: Any, model: Any, params: Any = ...) -> tuple[Any, AbeaBatchStats]:
        """`streamer.pipeline.abea.align_batch` of a batch record (`AbeaReads`' fields), plus its measurements."""

    def retune(self, options: CudaOptions) -> None: ...


class GpuEvents(Protocol):
    """Event detection on one device (`streamer_gpu.events.CudaEvents`) as the events stage uses it."""

    def detect(self, signal: Any, signal_off: Any, params: Any,
               spread: bool = True) -> tuple[tuple[Any, ...], EventsBatchStats]:  # fmt: skip
        """`streamer.pipeline.events.detect_events`' five arrays, plus the batch's measurements."""


class GpuFmSeeder(Protocol):
    """An FM-index on one device (`streamer_gpu.fmindex.CudaFmSeeder`) as `streamer.align.seeds` uses it."""

    def chunk_seeds(self, q: Any, job_off: Any, j0: int, j1: int, min_len: int, max_occ: int) -> tuple[Any, ...]:
        """`streamer.align.seeds.chunk_seeds` of read strands j0..j1-1."""


class GpuExtender(Protocol):
    """Extension's DP against one genome on one device (`streamer_gpu.extend.CudaExtender`)."""

    def align_jobs(self, q: Any, jobs: Any, sc: Any, threads: int) -> Any:
        """`streamer.align.extend.align_jobs` of a batch's jobs (`JobResults`)."""


class GpuChainer(Protocol):
    """Chaining on one device (`streamer_gpu.chain.CudaChainer`) as `streamer.align.chain` uses it."""

    def chain_groups(self, qs: Any, rs: Any, ln: Any, ctg: Any, grp_off: Any, params: Any) -> Any:
        """`streamer.align.chain.chain_groups` of a batch's groups of anchors."""


class GpuPackage(Protocol):
    """What the GPU package (`streamer_gpu`, an install extra) offers the core."""

    def open_gpu(self, options: CudaOptions, bandwidth: int = 100) -> GpuAbea | None:
        """The ABEA stage on options.dev_id, or None (said in one line) where there is none to use."""

    def open_lane(self, abea: Any) -> GpuAbea | None:
        """Another lane on abea's device (an arena of its size, its own stream), or None (said in one line)."""

    def open_events(self, options: CudaOptions) -> GpuEvents | None:
        """Event detection on GPU options.dev_id (whose ABEA stage opened), or None (said in one line)."""

    def build_fmindex(self, text: Any, budget: int, kmer_len: int | None = None) -> Any:
        """`streamer.align.fmindex.build_index` of a `Text` on the current GPU, or None (said in one line)."""

    def fm_seeder(self, index: Any) -> GpuFmSeeder | None:
        """Seeding against index on the current GPU (its arrays copied there once), or None (said in one line)."""

    def extender(self, genome: Any) -> GpuExtender | None:
        """Extension's DP against genome on the current GPU (copied there once), or None (said in one line)."""

    def chainer(self) -> GpuChainer | None:
        """Chaining on the current GPU, or None (said in one line) where there is none."""

    def count_gpus(self) -> int:
        """GPUs on this host (0 without numba-cuda or a GPU)."""

    def device_context(self, dev_id: int) -> Callable[[], AbstractContextManager]:
        """What makes GPU dev_id current on a thread for one batch."""

    def release_gpu(self) -> None:
        """Give the memory of dropped GPU stages back to the driver now."""

    def is_cuda_error(self, exc: BaseException) -> bool:
        """A failed launch, copy, allocation or module load on a GPU."""

    def probe_gpu(self, dev_id: int = 0) -> GpuInfo | None:
        """GPU dev_id as the device profiles need it, before the arena is taken; None where there is none."""

    def arena_bases(self, n_bytes: int, avg_epk: float, bandwidth: int) -> int:
        """Read bases an ABEA arena of n_bytes holds (f5c's partition)."""

    def device_bytes(self, options: CudaOptions, bandwidth: int, resident_threads: int) -> int:
        """Device bytes a process takes for options' batches: the arena they need, the HMM's and the rest."""


def gpu_package() -> GpuPackage:
    """The GPU package the `streamer.gpu` entry point names (`streamer_gpu`), imported on first use."""
    return cast(GpuPackage, registry.load(registry.GPU, "cuda"))


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as device profiles and learned values know it, before the arena is taken."""

    name: str
    total_bytes: int
    free_bytes: int
    integrated: bool  # shares the host's memory (Jetson)
    resident_threads: int = 0  # threads the device holds at once (SMs x threads per SM): the HMM's local memory

    @property
    def key(self) -> str:
        """Learned values are kept per device model and memory size: `NVIDIA H100 80GB HBM3 (81559 MiB)`."""
        return f"{self.name} ({self.total_bytes >> 20} MiB)"


LANE_SWITCH_INTERVAL = 0.0005
"""Seconds a thread holding the GIL keeps it from a GPU lane that asks (Python's default is 5 ms). A lane lets
the GIL go at each of a batch's few dozen CUDA calls and compiled functions, and asks for it back each time; a
thread running Python beside it (a daemon's engine, intake, sinks) then held it off for up to 5 ms a call.
`benchmarks/RESULTS-cpu-half.md`: two lanes beside a Python thread 3.7 batches a second at 5 ms, 12.1 at 0.5."""


@dataclass(frozen=True)
class CudaOptions:
    """How the GPU takes part in ABEA (f5c's names and defaults where f5c has them).

    The ABEA arena holds one batch of max_reads/max_bases (the caps K and B the batches are
    assembled under, also recorded with each batch for the tuning monitor) at avg_epk, with
    room for the tuner to grow them when autotune is on (`streamer_gpu.memory`), capped at
    mem_frac of the free device memory (None: 0.9, or 0.7 on integrated GPUs (Jetson), whose
    memory is the host's). hmm False keeps the CpG HMM on the CPU while ABEA uses the GPU; events True
    detects events there too (exact, ahead of the GPU stages, with the host's cores left to the rest; the daemon's
    device profile decides, `Plan.with_events`; `streamer call` when asked).
    dev_ids, when given, are the GPUs batches are spread over (dev_id is then the first);
    all_devices spreads them over every GPU of the host.

    reserve is device memory never taken (a co-resident basecaller's share: the cap is mem_frac of
    the free memory less it); memory_cap, where set, the most device memory the process takes
    (arena, HMM and kernel modules; on a Jetson the share of `pipeline.memory_budget` the host part
    leaves). stream_priority `low` launches every kernel and copy on streams of the device's lowest
    priority (`streamer_gpu.streams`), `normal` on ordinary ones.

    lanes is how many batches each GPU holds at once (the compute threads'): each lane its own arena,
    HMM buffers, stream and lock, so one batch's GPU stages never wait for another's host side; the
    memory share and cap are divided among the lanes.
    """

    disable: bool = False
    dev_id: int = 0
    mem_frac: float | None = None
    avg_epk: float = 2.0
    max_lf: float = 3.0
    max_epk: float = 5.0
    ultra_thresh: int = 100_000
    max_reads: int | None = None
    max_bases: int | None = None
    hmm: bool = True
    events: bool = False
    autotune: bool = False
    dev_ids: tuple[int, ...] = ()
    all_devices: bool = False
    reserve: int = 0
    memory_cap: int | None = None
    stream_priority: str = "normal"
    lanes: int = 1

    def with_devices(self, spec: str) -> CudaOptions:
        """These options on the GPUs of `--cuda-dev-id`: a number, a list (`0,1`) or `all`."""
        if spec.strip() == "all":
            return replace(self, all_devices=True)
        ids = tuple(int(d) for d in spec.split(","))
        if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
            raise ValueError(spec)
        return replace(self, dev_id=ids[0], dev_ids=ids)

    def devices(self, n_present: int) -> tuple[int, ...]:
        """The GPUs to open on a host with n_present of them."""
        return tuple(range(n_present)) if self.all_devices else self.dev_ids or (self.dev_id,)


def device_spec(text: str) -> str:
    """An argparse type for `--cuda-dev-id`: checked here, kept as text for `CudaOptions.with_devices`."""
    try:
        CudaOptions().with_devices(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a GPU number, a list of them (0,1) or all, not {text!r}") from None
    return text


@dataclass(frozen=True)
class AbeaBatchStats:
    """The paper's per-batch quantities (Table 3) plus where the GPU time went.

    Times are wall seconds. t_cpu covers the reads aligned on CPU threads while the GPU
    worked; t_gpu the GPU path from packing to the last copy back (t_pack + t_h2d +
    t_kernels + t_d2h); ultra-long reads run after both and are timed apart (t_ultra).
    x_util and y_util are the fractions (0-1) of the arena's per-base (X) and per-event (Y)
    capacity this batch used. n_memout, n_long and n_events count the reads sent to the CPU
    because the arena was full, because they were longer than max_lf x the batch's mean
    length, and because they had more events per base than max_epk. cells counts the band
    cells the GPU filled (bands x bandwidth). fallback is empty, or why the GPU part of this
    batch failed and was aligned on the CPU instead. t_wall is the whole stage, split and merge
    included (0: not measured). t_batch is every stage of the batch (`Pipeline.run_batch` sets it):
    the reads the split gives the CPU take cores the other stages and batches share, so that is what
    a change of the split is judged by (0: not measured).
    """

    n_reads: int
    n_bases: int
    max_reads: int | None
    max_bases: int | None
    n_gpu: int
    n_cpu: int
    n_ultra: int
    n_memout: int
    n_long: int
    n_events: int
    x_util: float
    y_util: float
    t_cpu: float
    t_gpu: float
    t_pack: float
    t_h2d: float
    t_kernels: float
    t_d2h: float
    t_ultra: float
    cells: int
    fallback: str = ""
    t_wall: float = 0.0
    t_batch: float = 0.0


@dataclass(frozen=True)
class HmmBatchStats:
    """Where one batch's CpG HMM windows went and where the GPU time went (wall seconds).

    n_cpu counts windows scored on CPU threads: those over the kernel's k-mer capacity, plus
    every GPU window of a batch whose GPU part failed (fallback says why). cells counts the
    forward-matrix cells the GPU filled (events x k-mers, both hypotheses). t_pack is the
    host-side packing; t_h2d includes the per-read transitions and flanks computed on the host.
    """

    n_jobs: int
    n_gpu: int
    n_cpu: int
    cells: int
    t_pack: float
    t_h2d: float
    t_kernel: float
    t_d2h: float
    t_cpu: float
    fallback: str = ""


@dataclass(frozen=True)
class EventsBatchStats:
    """Where one batch's event detection ran and where the GPU time went (wall seconds).

    on_gpu is False when the batch's events were detected on the CPU instead: fallback says why
    (a CUDA error, or windows longer than the kernel's). t_wall is the whole stage.
    """

    n_reads: int
    n_samples: int
    n_events: int
    on_gpu: bool
    t_h2d: float
    t_kernels: float
    t_d2h: float
    t_wall: float
    fallback: str = ""
