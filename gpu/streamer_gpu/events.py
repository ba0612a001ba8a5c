"""Event detection on the GPU: its two kernels and `CudaEvents`, the launcher with the CPU's answers.

Both kernels run the cells of `streamer.pipeline.event_cells` compiled for the device
(`streamer_gpu.target`), the CPU kernel's own arithmetic (which runs them over sixteen reads in SIMD
lanes), so the events agree with `streamer.pipeline.events` to the bit.
Its prefix sums are a chain of float64 roundings that no parallel scan reproduces, so one thread
segments one read: `peaks` finds its boundaries (its blocks of prefix sums and t-statistics in local memory), the host
turns the counts into event offsets, and `fill` writes its events. A batch's reads are spread over
enough threads to hide the memory latency of each read's sequential scan; the longest read sets the
kernel's time.

`CudaEvents` owns one device's buffers (grown with the largest chunk seen) and a stream (of the
priority asked for: `streamer_gpu.streams`). A batch's
signal is copied to the device once, in chunks of at most `CHUNK_SAMPLES` samples so that device
memory does not grow with the batch (`streamer_gpu.memory` counts it), and its events are copied
back: scaling, the CPU's share of ABEA and recalibration all read them on the host. A CUDA error or
device out-of-memory detects that batch's events on the CPU, logged and recorded, never lost.
The two kernels take device arrays and scalars, ten each, as CUDA kernels must; `detect` takes the
signal and `EventParams` and unpacks them once.
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
from numba import cuda

from streamer.pipeline.event_cells import event_cells, scratch_size
from streamer.pipeline.events import EventParams, batch_signal, detect_events_kernel, event_offsets
from streamer.pipeline.gpu import EventsBatchStats
from streamer_gpu.buffers import DeviceBuffers
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.memory import EVENT_CHUNK_SAMPLES
from streamer_gpu.streams import open_stream
from streamer_gpu.target import CUDA_ERRORS, DEVICE

log = logging.getLogger(__name__)

STEP = 16  # samples each thread forms its t-statistics for at a time
# its prefix sums in reach, STEP + 2 w + 1: windows up to 31 samples (the chemistries' longest is 14); `fill`
# forms its sums SCRATCH - 1 samples at a time
SCRATCH = 80
BLOCK = 64


@functools.cache
def kernels():
    """(peaks, fill): compiled on first use, so that importing this module needs no GPU."""
    cells = event_cells(DEVICE)
    read_peaks, fill_read = cells.read_peaks, cells.fill_read

    @cuda.jit(
        "void(float32[::1], int64[::1], int64, int64, float32, float32, float32, int64, int32[::1], int64[::1])",
        cache=True,
    )
    def peaks(signal, signal_off, w1, w2, th1, th2, height, n_reads, peaks, n_peaks):
        """One thread per read: its boundaries at its own samples' positions in `peaks`, their count."""
        r = cuda.grid(1)
        if r >= n_reads:
            return
        pre_s = cuda.local.array(SCRATCH, np.float64)
        pre_q = cuda.local.array(SCRATCH, np.float64)
        t1 = cuda.local.array(STEP, np.float32)
        t2 = cuda.local.array(STEP, np.float32)
        a = signal_off[r]
        n_peaks[r] = read_peaks(signal, a, signal_off[r + 1] - a, (w1, w2, th1, th2, height), pre_s, pre_q, t1, t2,
                                peaks, a)  # fmt: skip

    @cuda.jit(
        "void(float32[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64, int64[::1], float32[::1], "
        "float32[::1], float32[::1])",
        cache=True,
    )
    def fill(signal, signal_off, peaks, n_peaks, ev_off, n_reads, start, length, mean, stdv):
        """One thread per read: its events at ev_off[r] (its blocks of prefix sums in local memory)."""
        r = cuda.grid(1)
        if r >= n_reads or ev_off[r + 1] == ev_off[r]:
            return
        pre_s = cuda.local.array(SCRATCH, np.float64)
        pre_q = cuda.local.array(SCRATCH, np.float64)
        a = signal_off[r]
        fill_read(signal, a, signal_off[r + 1] - a, peaks, a, n_peaks[r], pre_s, pre_q, start, length, mean, stdv,
                  ev_off[r])  # fmt: skip

    return peaks, fill


def chunk_bounds(signal_off: np.ndarray, cap: int) -> list[int]:
    """Read indices splitting a batch into runs of at most cap samples (a longer read alone in its run)."""
    n = len(signal_off) - 1
    bounds = [0]
    while bounds[-1] < n:
        r = bounds[-1]
        end = int(np.searchsorted(signal_off, signal_off[r] + cap, side="right")) - 1
        bounds.append(min(n, max(end, r + 1)))
    return bounds


class CudaEvents:
    """One GPU's event detection: `detect` a batch as `streamer.pipeline.events.detect_events` does."""

    def __init__(self, dev_id: int = 0, chunk_samples: int = EVENT_CHUNK_SAMPLES, stream_priority: str = "normal"):
        cuda.select_device(dev_id)
        self.chunk_samples = chunk_samples
        self.stream = open_stream(stream_priority).stream
        self._buffers = DeviceBuffers()
        self._faults = fault_plan()
        self._peaks, self._fill = kernels()

    def detect(self, signal: np.ndarray, signal_off: np.ndarray, params: EventParams):
        """(ev_off, ev_start, ev_length, ev_mean, ev_stdv) of the batch, plus its measurements."""
        t0 = time.perf_counter()
        signal, signal_off = batch_signal(signal, signal_off)
        times = [0.0, 0.0, 0.0]
        fallback = ""
        if signal_off[-1] == signal_off[0]:
            events = None  # no samples: nothing to launch
        elif scratch_size(params.w1, params.w2, STEP) > SCRATCH:
            fallback = f"windows of {params.w1} and {params.w2} samples are longer than the GPU kernel's"
            events = None
        else:
            try:
                self._faults.check("events")
                events = self._run_gpu(signal, signal_off, params, times)
            except CUDA_ERRORS as exc:
                fallback = f"{type(exc).__name__}: {exc}"
                log.warning("GPU event detection failed on a batch of %d reads (%s): its events are detected on "
                            "the CPU", len(signal_off) - 1, fallback)  # fmt: skip
                events = None
        on_gpu = events is not None
        if events is None:
            p = params
            events = detect_events_kernel(signal, signal_off, p.w1, p.w2, p.threshold1, p.threshold2, p.peak_height)
        stats = EventsBatchStats(
            n_reads=len(signal_off) - 1,
            n_samples=int(signal_off[-1] - signal_off[0]),
            n_events=int(events[0][-1]),
            on_gpu=on_gpu,
            t_h2d=times[0],
            t_kernels=times[1],
            t_d2h=times[2],
            t_wall=time.perf_counter() - t0,
            fallback=fallback,
        )
        return events, stats

    def _run_gpu(self, signal, signal_off, params: EventParams, times: list[float]):
        """The events chunk by chunk; `times` gains each chunk's h2d, kernel and d2h seconds."""
        n_reads = len(signal_off) - 1
        bounds = chunk_bounds(signal_off, self.chunk_samples)
        parts = []
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            parts.append(self._chunk(signal[signal_off[r0] : signal_off[r1]], signal_off[r0 : r1 + 1] - signal_off[r0],
                                     params, times))  # fmt: skip
        if len(parts) == 1:
            return parts[0]
        ev_off = np.zeros(n_reads + 1, np.int64)
        at = 0
        for r0, r1, part in zip(bounds[:-1], bounds[1:], parts):
            ev_off[r0 + 1 : r1 + 1] = part[0][1:] + at
            at += int(part[0][-1])
        return (ev_off, *(np.concatenate([part[i] for part in parts]) for i in range(1, 5)))

    def _chunk(self, signal, signal_off, params: EventParams, times: list[float]):
        s, b = self.stream, self._buffers
        n = len(signal_off) - 1
        grid = (n + BLOCK - 1) // BLOCK
        t0 = time.perf_counter()
        d_signal, d_off = b.put("signal", signal, s), b.put("signal_off", signal_off, s)
        d_peaks = b.get("peaks", (max(len(signal), 1),), np.int32)
        d_n_peaks = b.get("n_peaks", (n,), np.int64)
        s.synchronize()
        t1 = time.perf_counter()
        p = params
        self._peaks[grid, BLOCK, s](d_signal, d_off, p.w1, p.w2, np.float32(p.threshold1), np.float32(p.threshold2),
                                     np.float32(p.peak_height), n, d_peaks, d_n_peaks)  # fmt: skip
        n_peaks = d_n_peaks.copy_to_host(stream=s)
        s.synchronize()
        ev_off = event_offsets(signal_off, n_peaks)
        total = int(ev_off[-1])
        out = [b.get(name, (total,), dtype) for name, dtype in
               (("start", np.int64), ("length", np.float32), ("mean", np.float32), ("stdv", np.float32))]  # fmt: skip
        self._fill[grid, BLOCK, s](d_signal, d_off, d_peaks, d_n_peaks, b.put("ev_off", ev_off, s), n, *out)
        s.synchronize()
        t2 = time.perf_counter()
        host = [d.copy_to_host(stream=s) if total else np.zeros(0, d.dtype) for d in out]
        s.synchronize()
        t3 = time.perf_counter()
        times[0] += t1 - t0
        times[1] += t2 - t1
        times[2] += t3 - t2
        return (ev_off, *host)
