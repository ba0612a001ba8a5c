"""ABEA on the GPU: the device arena and the host launcher, with the CPU's answers.

`CudaAbea` owns one device: at start-up it takes one arena sized for the configured batches
(`streamer_gpu.memory`; f5c's heuristic partition: X bases and Y = avg_epk * X events), and per
batch it splits the reads (`streamer_gpu.host.assign_reads`), packs and copies the GPU
reads, runs the kernels while CPU threads align the reads the split gave the CPU, aligns
ultra-long reads last, and merges everything back into batch order. Answers are identical
to `streamer.pipeline.abea.align_batch`; a CUDA error or device out-of-memory in a batch sends that
batch's GPU reads to the CPU and is logged and recorded, never lost.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass

import numpy as np
from numba import cuda

from streamer.pipeline.abea import AbeaParams, AbeaReads, Alignment, abea, abea_arrays, model_arrays
from streamer.pipeline.chunks import chunked
from streamer.pipeline.gpu import AbeaBatchStats, CudaOptions
from streamer_gpu import kernels
from streamer_gpu.host import (
    CPU,
    GPU,
    NOT_MINE,
    SLOT_BYTES,
    ULTRA,
    arena_capacity,
    assign_reads,
    gather,
    log_trim,
    merge,
    read_params,
)
from streamer_gpu.buffers import to_device, to_host
from streamer_gpu.device import resident_threads
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.memory import fixed_bytes, plan_memory
from streamer_gpu.streams import open_stream
from streamer_gpu.target import CUDA_ERRORS, SIMULATED
from streamer.pore.model import PoreModel
from streamer.pipeline.scaling import F5C_CODES, require_nucleotide

log = logging.getLogger(__name__)
# small batches (the last of a run, a daemon's trickle) are normal here, not a tuning problem; numba
# may wrap the message in a terminal's highlight codes
SMALL_GRID = r"(?:\x1b\[[0-9;]*m)?Grid size .* under-utilization"
warnings.filterwarnings("ignore", message=SMALL_GRID)

# the simulator reports unbounded free memory: size its arena as on a small device
SIMULATED_FREE_BYTES = 1 << 28
# every array carved from the arena starts on this boundary (coalesced loads)
ALIGN = 256
# the carved arrays: name, dtype, sized per base / event / row / row x band width / read slot (+1)
_CARVE = (
    ("seq", np.uint8, "bases"), ("gp_mean", np.float32, "bases"), ("stdv", np.float32, "bases"),
    ("log_stdv", np.float32, "bases"), ("ev_mean", np.float32, "events"), ("trace", np.uint8, "cells"),
    ("ll_e", np.int32, "rows"), ("cap_kmer", np.int32, "rows"), ("cap_event", np.int32, "rows"),
    ("steps", np.uint8, "rows"), ("base_off", np.int64, "offsets"), ("ev_off", np.int64, "offsets"),
    ("row_off", np.int64, "offsets"), ("aln_off", np.int64, "offsets"), ("shift", np.float32, "reads"),
    ("scale", np.float32, "reads"), ("lp", np.float64, "lp"), ("end_event", np.int32, "reads"),
    ("first_kmer", np.int32, "reads"), ("first_event", np.int32, "reads"), ("n_aligned", np.int32, "reads"),
    ("sum_emission", np.float64, "reads"), ("status", np.int8, "reads"),
)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """Launch shape: threads per read and reads per block of the fill kernel; block size of the others.

    The default is the fastest exact layout measured on an H100 (benchmarks/RESULTS-gpu-abea.md).
    """

    threads_per_read: int = 64
    reads_per_block: int = 1
    block: int = 64


class Arena:
    """One device buffer allocated once, carved into arrays per base (X), event (Y), band row (X + Y), read slot.

    The partition follows f5c's heuristic (`streamer_gpu.host.arena_capacity`); because the arrays
    are views of a single allocation, `repartition` can move the X/Y split (a new avg_epk, or band
    width) between batches without giving memory back to the driver or asking for more.
    """

    def __init__(self, n_bytes: int, avg_epk: float, bandwidth: int):
        self.n_bytes = n_bytes
        # any partition of n_bytes fits: carved sizes exceed it by at most a slot, an offset each and the padding
        self._buffer = cuda.device_array(n_bytes + SLOT_BYTES + 4 * 8 + ALIGN * len(_CARVE), np.uint8)
        self.repartition(avg_epk, bandwidth)

    def repartition(self, avg_epk: float, bandwidth: int | None = None) -> None:
        """Re-divide the same buffer for avg_epk events per base (and band width); contents are not kept."""
        self.avg_epk = avg_epk
        self.bandwidth = bandwidth = self.bandwidth if bandwidth is None else bandwidth
        cap = arena_capacity(self.n_bytes, avg_epk, bandwidth)
        self.bases, self.events, self.rows, self.reads = cap.bases, cap.events, cap.rows, cap.reads
        sizes = {"bases": cap.bases, "events": cap.events, "rows": cap.rows, "cells": cap.rows * bandwidth,
                 "offsets": cap.reads + 1, "reads": cap.reads, "lp": 3 * cap.reads}  # fmt: skip
        at = 0
        for name, dtype, per in _CARVE:
            n_bytes = sizes[per] * np.dtype(dtype).itemsize
            view = self._buffer[at : at + n_bytes].view(dtype)
            setattr(self, name, view.reshape(cap.reads, 3) if per == "lp" else view)
            at += -(-n_bytes // ALIGN) * ALIGN
        assert at <= len(self._buffer), "arena partition larger than its buffer"


@dataclass(frozen=True)
class _Packed:
    """The GPU reads of a batch, contiguous on the host, with their offsets and parameters."""

    seq: np.ndarray
    ev_mean: np.ndarray
    base_off: np.ndarray
    ev_off: np.ndarray
    row_off: np.ndarray
    lp: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    seconds: float


@dataclass
class _GpuOutput:
    """What came back for the GPU reads (in their order); pairs as first pair + steps, decoded by the merge."""

    n_aligned: np.ndarray
    sum_emission: np.ndarray
    status: np.ndarray
    aln_off: np.ndarray
    first_kmer: np.ndarray
    first_event: np.ndarray
    steps: np.ndarray
    times: list[float]  # pack, h2d, kernels, d2h (with decoding the steps)
    cells: int

    @classmethod
    def empty(cls) -> _GpuOutput:
        none32 = np.zeros(0, np.int32)
        return cls(none32, np.zeros(0), np.zeros(0, np.int8), np.zeros(1, np.int64), none32, none32,
                   np.zeros(0, np.uint8), [0.0] * 4, 0)  # fmt: skip


class TooLittleMemory(Exception):
    """The free device memory does not hold a useful arena beside the HMM (the message says how much)."""


class CudaAbea:
    """One GPU's ABEA: arena, model on the device, compiled kernels; `align` a batch at a time."""

    def __init__(self, options: CudaOptions = CudaOptions(), bandwidth: int = 100, layout: Layout = Layout(),
                 arena_bytes: int | None = None):  # fmt: skip
        self.options = options
        self.layout = layout
        cuda.select_device(options.dev_id)
        device = cuda.current_context().device
        name = getattr(device, "name", "CUDA simulator")
        self.device_name = name.decode() if isinstance(name, bytes) else str(name)
        self.lanes = 1  # lanes of this arena's size the device's memory holds (`open_lane` opens the others)
        if arena_bytes is None:
            free, _ = cuda.current_context().get_memory_info()
            free = free if math.isfinite(free) else SIMULATED_FREE_BYTES
            plan = plan_memory(int(free), bool(getattr(device, "INTEGRATED", 0)), options, bandwidth,
                               resident_threads(device), 0 if SIMULATED else fixed_bytes(options))  # fmt: skip
            if plan.refused:
                raise TooLittleMemory(plan.refused)
            arena_bytes = plan.arena_bytes
            # numba's simulator runs a launch's threads as Python threads over its own shared state:
            # two launches at once (two lanes' batches) corrupt it, so it keeps one lane
            self.lanes = 1 if SIMULATED else plan.lanes
        self._faults = fault_plan()
        # every launch and copy of this stage goes on it (`options.stream_priority`)
        self.stream = open_stream(options.stream_priority).stream
        self.arena = Arena(arena_bytes, options.avg_epk, bandwidth)
        self._retuned: CudaOptions | None = None
        self._retune_lock = threading.Lock()
        self._codes = cuda.to_device(F5C_CODES, stream=self.stream)
        self._model: tuple | None = None
        self._model_of: PoreModel | None = None
        self.set_layout(layout)
        for compile_now in (kernels.kcache_kernel, kernels.backtrack_kernel, kernels.compact_kernel):
            compile_now()
        a = self.arena
        log.info("GPU ABEA on %s: arena %.2f GB for %d bases, %d events, %d reads per batch",
                 self.device_name, arena_bytes / 1e9, a.bases, a.events, a.reads)  # fmt: skip

    def retune(self, options: CudaOptions) -> None:
        """Split the next batches with these thresholds; a new avg_epk re-partitions the arena in place.

        Taken up at the start of the next `align`, so a batch in flight on another thread keeps its
        arena. The device, memory share and caps K/B of `options` are not revisited.
        """
        with self._retune_lock:
            self._retuned = options

    def _take_retune(self) -> None:
        with self._retune_lock:
            options, self._retuned = self._retuned, None
        if options is None:
            return
        if options.avg_epk != self.arena.avg_epk:
            self.arena.repartition(options.avg_epk)
            a = self.arena
            log.info("GPU ABEA: arena re-partitioned for %.2f events per base: %d bases, %d events, %d reads",
                     options.avg_epk, a.bases, a.events, a.reads)  # fmt: skip
        self.options = options

    def set_layout(self, layout: Layout) -> None:
        """Launch later batches with another layout (compiled on first use)."""
        self.layout = layout
        self._fill = kernels.fill_kernel(self.arena.bandwidth, layout.threads_per_read, layout.reads_per_block)

    def _device_model(self, model: PoreModel) -> tuple:
        if self._model_of is not model:
            self._model = tuple(cuda.to_device(a, stream=self.stream)
                                for a in (model.level_mean, model.level_stdv, model.level_log_stdv))
            self._model_of = model
        return self._model

    def align(self, reads, model: PoreModel, params: AbeaParams = AbeaParams()) -> tuple[Alignment, AbeaBatchStats]:
        """`streamer.pipeline.abea.align_batch` on GPU and CPU together, plus the batch's measurements.

        Ultra-long reads are set aside to the end of the batch: aligned on the CPU once the GPU
        and the CPU threads are done with the rest, so that they hold neither back.
        """
        t_start = time.perf_counter()
        self._faults.check("abea")
        require_nucleotide(model)
        arrays = abea_arrays(reads)
        seq, seq_off, ev_mean, ev_off, status, shift, scale = arrays
        bandwidth, skip_prob, max_events_per_base = params.bandwidth, params.skip_prob, params.max_events_per_base
        self._take_retune()
        if bandwidth != self.arena.bandwidth:
            log.info("GPU ABEA: band width %d, re-partitioning the arena", bandwidth)
            self.arena.repartition(self.options.avg_epk, bandwidth)
            self.set_layout(self.layout)
        opt, a = self.options, self.arena
        owner, counts = assign_reads(
            seq_off, ev_off, status, model.k, max_events_per_base, opt.max_lf, opt.max_epk, opt.ultra_thresh,
            a.bases, a.events, a.rows, a.reads,
        )  # fmt: skip
        n_ultra = int(np.count_nonzero(owner == ULTRA))
        cpu_args = model_arrays(model, params)

        def on_cpu(mine):
            st = np.where(mine, status, np.int8(NOT_MINE))
            t0 = time.perf_counter()
            # reads of very different lengths: hand them out one at a time, not in equal slices
            with chunked(1):
                out = abea(seq, seq_off, ev_mean, ev_off, st, shift, scale, *cpu_args)
            return out, st, time.perf_counter() - t0

        gpu_idx = np.flatnonzero(owner == GPU)
        # packed before the CPU reads start: the gather has numba's parallel workers to itself
        packed = self._pack(gpu_idx, arrays, model.k, skip_prob)
        cpu_result: list = []
        worker = threading.Thread(target=lambda: cpu_result.append(on_cpu(owner == CPU)), name="abea-cpu")
        worker.start()
        fallback = ""
        gpu = None
        t0 = time.perf_counter()
        try:
            gpu = self._run_gpu(packed, model, params)
        except CUDA_ERRORS as exc:
            fallback = f"{type(exc).__name__}: {exc}"
            log.warning("GPU ABEA failed on a batch of %d reads (%s); its %d GPU reads are aligned on the CPU",
                        len(owner), fallback, len(gpu_idx))  # fmt: skip
            owner[gpu_idx] = ULTRA
        t_gpu = time.perf_counter() - t0 + (packed.seconds if packed is not None else 0.0)
        worker.join()
        (cpu_out, cpu_status, t_cpu) = cpu_result[0]
        late = owner == ULTRA
        if late.any():
            late_out, late_status, t_late = on_cpu(late)
        else:
            late_out, late_status, t_late = cpu_out, cpu_status, 0.0
        if gpu is None:
            gpu = _GpuOutput.empty()
            gpu_idx = gpu_idx[:0]
        # after the join: numba's parallel workers are not to be shared with the CPU reads
        t0 = time.perf_counter()
        aln_off, aln_kmer, aln_event = self._merge(owner, gpu_idx, cpu_out, late_out, gpu)
        if len(gpu_idx):  # decoding the GPU's steps is part of its copy back
            took = time.perf_counter() - t0
            gpu.times[3] += took
            t_gpu += took
        sum_emission = np.where(late, late_out[3], cpu_out[3])
        n_aligned = np.where(late, late_out[4], cpu_out[4])
        sum_emission[gpu_idx] = gpu.sum_emission
        n_aligned[gpu_idx] = gpu.n_aligned
        status[:] = np.where(late, late_status, cpu_status)
        status[gpu_idx] = gpu.status
        t_pack, t_h2d, t_kernels, t_d2h = gpu.times
        stats = AbeaBatchStats(
            n_reads=len(owner),
            n_bases=int(seq_off[-1] - seq_off[0]),
            max_reads=opt.max_reads,
            max_bases=opt.max_bases,
            n_gpu=len(gpu_idx),
            n_cpu=int(np.count_nonzero(owner == CPU)),
            n_ultra=n_ultra,
            n_memout=int(counts[0]),
            n_long=int(counts[1]),
            n_events=int(counts[2]),
            x_util=float(counts[3]) / a.bases,
            y_util=float(counts[4]) / a.events,
            t_cpu=t_cpu,
            t_gpu=t_gpu,
            t_pack=t_pack,
            t_h2d=t_h2d,
            t_kernels=t_kernels,
            t_d2h=t_d2h,
            t_ultra=t_late,
            cells=gpu.cells,
            fallback=fallback,
            t_wall=time.perf_counter() - t_start,
        )
        return Alignment(aln_off, aln_kmer, aln_event, sum_emission, n_aligned), stats

    @staticmethod
    def _merge(owner, gpu_idx, cpu_out, late_out, gpu: _GpuOutput):
        gpu_pos = np.zeros(len(owner), dtype=np.int64)
        gpu_pos[gpu_idx] = np.arange(len(gpu_idx))
        return merge(owner, gpu_pos, cpu_out[0], cpu_out[1], cpu_out[2], late_out[0], late_out[1], late_out[2],
                     gpu.aln_off, gpu.first_kmer, gpu.first_event, gpu.steps)  # fmt: skip

    @staticmethod
    def _pack(idx, reads: AbeaReads, k, skip_prob) -> _Packed | None:
        """The GPU reads' bases, events, offsets and per-read parameters, contiguous on the host."""
        if len(idx) == 0:
            return None
        seq, seq_off, ev_mean, ev_off, _, shift, scale = reads
        t0 = time.perf_counter()
        base_off, ev_o, row_off, lp = read_params(seq_off, ev_off, idx, k, skip_prob)
        if len(idx) == len(seq_off) - 1:
            seq_p = seq[seq_off[0] : seq_off[-1]]
            ev_p = ev_mean[ev_off[0] : ev_off[-1]]
        else:
            seq_p = np.empty(base_off[-1], np.uint8)
            ev_p = np.empty(ev_o[-1], np.float32)
            gather(seq, seq_off, idx, base_off, seq_p)
            gather(ev_mean, ev_off, idx, ev_o, ev_p)
        shift_p = np.ascontiguousarray(shift[idx])
        scale_p = np.ascontiguousarray(scale[idx])
        return _Packed(seq_p, ev_p, base_off, ev_o, row_off, lp, shift_p, scale_p, time.perf_counter() - t0)

    def _run_gpu(self, p: _Packed | None, model, params: AbeaParams) -> _GpuOutput | None:
        if p is None:
            return None
        n = len(p.shift)
        a, lay, k, w, s = self.arena, self.layout, model.k, self.arena.bandwidth, self.stream
        t1 = time.perf_counter()
        level_mean, level_stdv, level_log_stdv = self._device_model(model)
        for dev, host in ((a.seq, p.seq), (a.ev_mean, p.ev_mean), (a.base_off, p.base_off), (a.ev_off, p.ev_off),
                          (a.row_off, p.row_off), (a.shift, p.shift), (a.scale, p.scale), (a.lp, p.lp)):  # fmt: skip
            to_device(dev, host, s)
        s.synchronize()
        t2 = time.perf_counter()
        kernels.kcache_kernel()[n, lay.block, s](a.seq, a.base_off, a.shift, a.scale, k, self._codes, level_mean,
                                                 level_stdv, level_log_stdv, n, a.gp_mean, a.stdv, a.log_stdv)  # fmt: skip
        per_block = lay.reads_per_block
        self._fill[(n + per_block - 1) // per_block, lay.threads_per_read * per_block, s](
            a.ev_mean, a.gp_mean, a.stdv, a.log_stdv, a.base_off, a.ev_off, a.row_off, a.lp, log_trim(params.trim_prob), k, n,
            a.trace, a.ll_e, a.end_event,
        )  # fmt: skip
        kernels.backtrack_kernel()[(n + lay.block - 1) // lay.block, lay.block, s](
            a.ev_mean, a.gp_mean, a.stdv, a.log_stdv, a.base_off, a.ev_off, a.row_off, k, w, n, a.trace, a.ll_e,
            a.end_event, params.min_avg_log_emission, params.max_skip_run, a.cap_kmer, a.cap_event, a.n_aligned, a.sum_emission,
            a.status,
        )  # fmt: skip
        s.synchronize()
        t3 = time.perf_counter()
        n_aligned, sum_emission, status = (to_host(d, n, s) for d in (a.n_aligned, a.sum_emission, a.status))
        s.synchronize()
        aln_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.where(status == 0, n_aligned, 0), out=aln_off[1:])
        to_device(a.aln_off, aln_off, s)
        t4 = time.perf_counter()
        kernels.compact_kernel()[n, lay.block, s](a.row_off, a.aln_off, a.cap_kmer, a.cap_event, n, a.steps,
                                                  a.first_kmer, a.first_event)  # fmt: skip
        s.synchronize()
        t5 = time.perf_counter()
        total = int(aln_off[-1])
        steps = to_host(a.steps, total, s)
        first_kmer, first_event = to_host(a.first_kmer, n, s), to_host(a.first_event, n, s)
        s.synchronize()
        t6 = time.perf_counter()
        times = [p.seconds, t2 - t1, (t3 - t2) + (t5 - t4), (t4 - t3) + (t6 - t5)]
        return _GpuOutput(n_aligned, sum_emission, status, aln_off, first_kmer, first_event, steps, times,
                          int(p.row_off[-1]) * w)  # fmt: skip
