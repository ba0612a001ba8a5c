"""Event detection on the GPU: its four kernels and `CudaEvents`, the launcher with the CPU's answers.

The kernels run the cells of `streamer.pipeline.event_cells` compiled for the device
(`streamer_gpu.target`), the CPU kernel's own arithmetic, so the events agree with
`streamer.pipeline.events` to the bit. The prefix sums are a chain of float64 roundings that no
parallel scan reproduces, but the same additions from the same value round the same: so `sums` forms
each read's in order on one thread and keeps every KEEP-th, and any other thread forms the ones it
needs again from the nearest kept one. `tstats` then takes a thread per STEP samples for the two
t-series, `peaks` a block per read for the detectors (a few selects a sample, the one sequential
step left; `sums` and `peaks` stage a read's samples in shared memory for the thread that steps
through them), the host turns the boundary counts into event offsets, and `fill` takes a thread per
event. The longest read still sets a launch's time, but its sequential steps are now the short ones.

`CudaEvents` owns one device's buffers (grown with the largest chunk seen) and a stream (of the
priority asked for: `streamer_gpu.streams`). A batch's
signal is copied to the device once, in chunks of at most `CHUNK_SAMPLES` samples so that device
memory does not grow with the batch (`streamer_gpu.memory` counts it), and its events are copied
back (their means alone where no sink renders the rest): scaling, the CPU's share of ABEA and
recalibration all read them on the host. A CUDA error or
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

from streamer.pipeline.batch import offsets_of
from streamer.pipeline.event_cells import START, event_cells, scratch_size
from streamer.pipeline.events import EventParams, batch_signal, detect_events_kernel, event_offsets, means_only
from streamer.pipeline.gpu import EventsBatchStats
from streamer_gpu.buffers import DeviceBuffers, to_host
from streamer_gpu.faults import from_env as fault_plan
from streamer_gpu.memory import EVENT_CHUNK_SAMPLES
from streamer_gpu.streams import open_stream
from streamer_gpu.target import CUDA_ERRORS, DEVICE

log = logging.getLogger(__name__)

STEP = 16  # samples each `tstats` thread forms the t-statistics of
KEEP = 16  # `sums` keeps a read's prefix sums every KEEP samples
# the prefix sums a `tstats` thread forms, from the kept one at or before its windows' first, to its
# windows' last: STEP + 2 w + KEEP; windows up to 31 samples (the chemistries' longest is 14)
SCRATCH = STEP + 2 * 31 + KEEP
BLOCK = 64  # threads a block of `tstats` and `fill`
WARP = 32  # threads a block of `sums` and `peaks`: one read, its loads coalesced
STAGE = 512  # samples `sums` and `peaks` stage in shared memory at a time (a multiple of KEEP)
FIELDS = {"start": np.int64, "length": np.float32, "mean": np.float32, "stdv": np.float32}  # what `fill` writes


@functools.cache
def kernels():
    """(sums, tstats, peaks, fill): compiled on first use, so that importing this module needs no GPU."""
    cells = event_cells(DEVICE)
    accumulate, t_series, detect_run, event = cells.accumulate, cells.t_series, cells.detect_run, cells.event
    dadd = DEVICE.dadd

    @cuda.jit(device=True)
    def read_of(off, n_reads, k):
        """The read r whose items off[r]..off[r+1]-1 hold item k (off non-decreasing from 0)."""
        lo, hi = 0, n_reads
        while lo < hi:
            mid = (lo + hi) >> 1
            if off[mid + 1] <= k:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @cuda.jit(device=True)
    def sums_from(signal, a, keep_s, keep_q, c0, j0, j):
        """The read's prefix sums at sample j, formed from the kept ones at j0 (a multiple of KEEP,
        at keep index c0 + j0 // KEEP) as `sums` formed them."""
        c = c0 + j0 // KEEP
        s, q = keep_s[c], keep_q[c]
        for k in range(j0, j):
            s, q = accumulate(s, q, signal[a + k])
        return s, q

    @cuda.jit("void(float32[::1], int64[::1], int64[::1], float64[::1], float64[::1])", cache=True)
    def sums(signal, signal_off, keep_off, keep_s, keep_q):
        """A block of WARP threads per read: its prefix sums in order, kept at samples 0, KEEP, 2 KEEP...
        from keep_off[r]. The block stages STAGE samples at a time in shared memory, coalesced, for its
        first thread's sequential sums: a load from global memory in each step would set their pace."""
        r = cuda.blockIdx.x
        lane = cuda.threadIdx.x
        staged = cuda.shared.array(STAGE, np.float32)
        a = signal_off[r]
        n = signal_off[r + 1] - a
        c = keep_off[r]
        s = 0.0
        q = 0.0
        if lane == 0:
            keep_s[c] = s
            keep_q[c] = q
        for j0 in range(0, n, STAGE):
            m = min(STAGE, n - j0)
            for k in range(lane, m, WARP):
                staged[k] = signal[a + j0 + k]
            cuda.syncthreads()
            if lane == 0:
                for k in range(m):
                    s, q = accumulate(s, q, staged[k])
                    if (k + 1) % KEEP == 0:  # STAGE is a multiple of KEEP
                        c += 1
                        keep_s[c] = s
                        keep_q[c] = q
            cuda.syncthreads()

    @cuda.jit(
        "void(float32[::1], int64[::1], int64[::1], int64[::1], int64, int64, int64, float64[::1], float64[::1], "
        "float32[::1], float32[::1])",
        cache=True,
    )
    def tstats(signal, signal_off, keep_off, step_off, w1, w2, n_reads, keep_s, keep_q, t1, t2):
        """One thread per STEP samples of a read (step_off[r] its first): their two t-statistics, at the
        samples' own positions in t1 and t2."""
        g = cuda.grid(1)
        if g >= step_off[n_reads]:
            return
        r = read_of(step_off, n_reads, g)
        a = signal_off[r]
        n = signal_off[r + 1] - a
        b0 = (g - step_off[r]) * STEP
        b1 = min(b0 + STEP, n)
        pre_s = cuda.local.array(SCRATCH, np.float64)
        pre_q = cuda.local.array(SCRATCH, np.float64)
        ahead = max(w1, w2)
        j = max(b0 - ahead, 0) // KEEP * KEEP  # the kept sum the windows' first is formed from
        base = min(j, b0 - ahead)  # pre_s[i - base] holds the sum at sample i, as `t_series` reads it
        c = keep_off[r] + j // KEEP
        s, q = keep_s[c], keep_q[c]
        pre_s[j - base] = s
        pre_q[j - base] = q
        while j < min(n, b1 - 1 + ahead):
            s, q = accumulate(s, q, signal[a + j])
            j += 1
            pre_s[j - base] = s
            pre_q[j - base] = q
        t_series(pre_s, pre_q, base, b0, b1, n, w1, t1[a + b0 : a + b1])
        t_series(pre_s, pre_q, base, b0, b1, n, w2, t2[a + b0 : a + b1])

    @cuda.jit(
        "void(float32[::1], float32[::1], int64[::1], int64, int64, float32, float32, float32, int32[::1], int64[::1])",
        cache=True,
    )
    def peaks(t1, t2, signal_off, w1, w2, th1, th2, height, peaks, n_peaks):
        """A block of WARP threads per read: the detectors over its t-statistics, staged as `sums` stages
        the signal; its boundaries at its own samples' positions in `peaks`, their count."""
        r = cuda.blockIdx.x
        lane = cuda.threadIdx.x
        staged1 = cuda.shared.array(STAGE, np.float32)
        staged2 = cuda.shared.array(STAGE, np.float32)
        a = signal_off[r]
        n = signal_off[r + 1] - a
        settings = (w1, w2, th1, th2, height)
        state = START
        count = 0
        for i0 in range(0, n, STAGE):
            m = min(STAGE, n - i0)
            for k in range(lane, m, WARP):
                staged1[k] = t1[a + i0 + k]
                staged2[k] = t2[a + i0 + k]
            cuda.syncthreads()
            if lane == 0:
                state, count = detect_run(state, staged1, staged2, 0, i0, i0 + m, settings, peaks, a, count)
            cuda.syncthreads()
        if lane == 0:
            n_peaks[r] = count

    @cuda.jit(
        "void(float32[::1], int64[::1], int64[::1], int32[::1], int64[::1], int64[::1], int64, float64[::1], "
        "float64[::1], int64[::1], float32[::1], float32[::1], float32[::1])",
        cache=True,
    )
    def fill(signal, signal_off, keep_off, peaks, n_peaks, ev_off, n_reads, keep_s, keep_q, start, length, mean,
             stdv):  # fmt: skip
        """One thread per event: its start, length, and statistics from the prefix sums at its ends."""
        k = cuda.grid(1)
        if k >= ev_off[n_reads]:
            return
        r = read_of(ev_off, n_reads, k)
        a = signal_off[r]
        e = k - ev_off[r]
        b0 = np.int64(0) if e == 0 else np.int64(peaks[a + e - 1])
        b1 = signal_off[r + 1] - a if e == n_peaks[r] else np.int64(peaks[a + e])
        s0, q0 = sums_from(signal, a, keep_s, keep_q, keep_off[r], b0 // KEEP * KEEP, b0)
        s1, q1 = sums_from(signal, a, keep_s, keep_q, keep_off[r], b1 // KEEP * KEEP, b1)
        n_f = np.float32(b1 - b0)
        start[k] = b0
        length[k] = n_f
        mean[k], stdv[k] = event(np.float32(dadd(s1, -s0)), np.float32(dadd(q1, -q0)), n_f)

    return sums, tstats, peaks, fill


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
        self._sums, self._tstats, self._peaks, self._fill = kernels()

    def detect(self, signal: np.ndarray, signal_off: np.ndarray, params: EventParams, spread: bool = True):
        """(ev_off, ev_start, ev_length, ev_mean, ev_stdv) of the batch, plus its measurements. Without
        `spread` only the means come back (`means_only`): a fifth of the bytes."""
        t0 = time.perf_counter()
        signal, signal_off = batch_signal(signal, signal_off)
        times = [0.0, 0.0, 0.0]
        fallback = ""
        if signal_off[-1] == signal_off[0]:
            events = None  # no samples: nothing to launch
        elif scratch_size(params.w1, params.w2, STEP) + KEEP - 1 > SCRATCH:
            fallback = f"windows of {params.w1} and {params.w2} samples are longer than the GPU kernel's"
            events = None
        else:
            try:
                self._faults.check("events")
                events = self._run_gpu(signal, signal_off, params, spread, times)
            except CUDA_ERRORS as exc:
                fallback = f"{type(exc).__name__}: {exc}"
                log.warning("GPU event detection failed on a batch of %d reads (%s): its events are detected on "
                            "the CPU", len(signal_off) - 1, fallback)  # fmt: skip
                events = None
        on_gpu = events is not None
        if events is None:
            p = params
            events = detect_events_kernel(signal, signal_off, p.w1, p.w2, p.threshold1, p.threshold2, p.peak_height)
            events = events if spread else means_only(events)
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

    def _run_gpu(self, signal, signal_off, params: EventParams, spread: bool, times: list[float]):
        """The events chunk by chunk; `times` gains each chunk's h2d, kernel and d2h seconds."""
        n_reads = len(signal_off) - 1
        bounds = chunk_bounds(signal_off, self.chunk_samples)
        parts = []
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            parts.append(self._chunk(signal[signal_off[r0] : signal_off[r1]], signal_off[r0 : r1 + 1] - signal_off[r0],
                                     params, spread, times))  # fmt: skip
        if len(parts) == 1:
            return parts[0]
        ev_off = np.zeros(n_reads + 1, np.int64)
        at = 0
        for r0, r1, part in zip(bounds[:-1], bounds[1:], parts):
            ev_off[r0 + 1 : r1 + 1] = part[0][1:] + at
            at += int(part[0][-1])
        return (ev_off, *(np.concatenate([part[i] for part in parts]) for i in range(1, 5)))

    def _chunk(self, signal, signal_off, params: EventParams, spread: bool, times: list[float]):
        s, b = self.stream, self._buffers
        n = len(signal_off) - 1
        lengths = np.diff(signal_off)
        keep_off = offsets_of(lengths // KEEP + 1)
        step_off = offsets_of((lengths + STEP - 1) // STEP)
        t0 = time.perf_counter()
        d_signal, d_off = b.put("signal", signal, s), b.put("signal_off", signal_off, s)
        d_keep_off, d_step_off = b.put("keep_off", keep_off, s), b.put("step_off", step_off, s)
        keep_s, keep_q = (b.get(name, (int(keep_off[-1]),), np.float64) for name in ("keep_s", "keep_q"))
        t1s, t2s = (b.get(name, (max(len(signal), 1),), np.float32) for name in ("t1", "t2"))
        d_peaks = b.get("peaks", (max(len(signal), 1),), np.int32)
        d_n_peaks = b.get("n_peaks", (n,), np.int64)
        s.synchronize()
        t1 = time.perf_counter()
        p = params
        if n:
            self._sums[n, WARP, s](d_signal, d_off, d_keep_off, keep_s, keep_q)
            self._tstats[_grid(int(step_off[-1])), BLOCK, s](d_signal, d_off, d_keep_off, d_step_off, p.w1, p.w2,
                                                             n, keep_s, keep_q, t1s, t2s)  # fmt: skip
            self._peaks[n, WARP, s](t1s, t2s, d_off, p.w1, p.w2, np.float32(p.threshold1), np.float32(p.threshold2),
                                    np.float32(p.peak_height), d_peaks, d_n_peaks)  # fmt: skip
        n_peaks = to_host(d_n_peaks, n, s)
        s.synchronize()
        ev_off = event_offsets(signal_off, n_peaks)
        total = int(ev_off[-1])
        out = [b.get(name, (total,), dtype) for name, dtype in FIELDS.items()]
        if total:
            self._fill[_grid(total), BLOCK, s](d_signal, d_off, d_keep_off, d_peaks, d_n_peaks,
                                               b.put("ev_off", ev_off, s), n, keep_s, keep_q, *out)  # fmt: skip
        s.synchronize()
        t2 = time.perf_counter()
        host = [to_host(d, total if spread or name == "mean" else 0, s) for d, name in zip(out, FIELDS)]
        s.synchronize()
        t3 = time.perf_counter()
        times[0] += t1 - t0
        times[1] += t2 - t1
        times[2] += t3 - t2
        return (ev_off, *host)


def _grid(n: int) -> int:
    """Blocks of BLOCK threads for n threads (at least one)."""
    return max(1, (n + BLOCK - 1) // BLOCK)
