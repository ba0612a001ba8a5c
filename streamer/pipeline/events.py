"""Event detection: scrappie's two-window t-test segmenter, bit-compatible with f5c.

Events feed scaling and ABEA, so a single boundary moved by a rounding difference
changes alignments downstream. The arithmetic therefore follows f5c (built as C++)
step for step:

- prefix sums of x and x^2 in float64, where each x^2 is first rounded to float32;
- t-statistic: the left window's mean from the float64 sum, the right window's sum
  rounded to float32 first, the combined variance accumulated in float64 from the
  float32 pieces and clamped to FLT_MIN, then `|dm| / sqrt(var / w)` in float32;
- peak detector in float32 (thresholds rounded to float32, as f5c stores them);
- events: `mean = f32(S) / len`, `var = f32(Q) / len - mean^2` in float32, stdv
  `sqrt(max(var, 0))`, where S and Q are float64 differences of prefix sums.

The open-pore trimming f5c computes is discarded there too, so the whole signal is
segmented. Where f5c is undefined (a read with no boundary reads `peaks[-1]`) this
module returns one event spanning the read; an empty read has no events.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numba
import numpy as np

from streamer.pipeline.event_cells import START, event_cells, scratch_size
from streamer.pipeline.targets import CPU

log = logging.getLogger(__name__)
_t_block, _fill_read = event_cells(CPU).t_block, event_cells(CPU).fill_read
# the detectors compiled into the lane loop's body, so that LLVM turns that loop into vector code
_detect = event_cells(CPU._replace(jit=numba.njit(nogil=True, error_model="numpy", inline="always"))).detect
BLOCK = 1024  # samples a read's t-statistics are formed for at a time
LANES = 16  # reads whose detectors run side by side, in SIMD lanes
U = np.uint64


@dataclass(frozen=True)
class EventParams:
    """Segmenter settings: short and long windows, their t thresholds, and peak height."""

    w1: int = 3
    w2: int = 6
    threshold1: float = 1.4
    threshold2: float = 9.0
    peak_height: float = 0.2

    def __post_init__(self) -> None:
        if self.w1 < 1 or self.w2 < 1:
            raise ValueError(f"window lengths must be >= 1, got w1={self.w1}, w2={self.w2}")


DNA_PARAMS = EventParams()  # DNA on R9.4.1 (4 kHz) and R10.4.1 (5 kHz) alike, as in f5c 1.2 and later
RNA_PARAMS = EventParams(w1=7, w2=14, threshold1=2.5, threshold2=9.0, peak_height=1.0)


def detect_events(
    signal: np.ndarray, signal_off: np.ndarray, params: EventParams = DNA_PARAMS
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segment every read of a batch into events.

    `signal` is float32 pA of all reads concatenated, read i owning
    `signal[signal_off[i]:signal_off[i + 1]]`. Returns `(ev_off, ev_start, ev_length,
    ev_mean, ev_stdv)`: event arrays concatenated in read order, `ev_start` relative to
    the read's first sample.
    """
    signal, signal_off = batch_signal(signal, signal_off)
    out = detect_events_kernel(
        signal, signal_off, params.w1, params.w2, params.threshold1, params.threshold2, params.peak_height
    )
    log.debug("events: %d reads, %d samples -> %d events", len(signal_off) - 1, len(signal), out[0][-1])
    return out


def batch_signal(signal: np.ndarray, signal_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch's signal and offsets checked (and made contiguous) for the event kernels, CPU and GPU."""
    if signal.dtype != np.float32:
        raise ValueError(f"signal must be float32 pA (f5c precision), got {signal.dtype}")
    signal = np.ascontiguousarray(signal)
    signal_off = np.ascontiguousarray(signal_off, dtype=np.int64)
    if signal_off.ndim != 1 or len(signal_off) < 1:
        raise ValueError("signal_off must be a 1-D array of n_reads + 1 offsets")
    if np.any(np.diff(signal_off) < 0) or signal_off[0] < 0 or signal_off[-1] > len(signal):
        raise ValueError("signal_off must be non-decreasing and within the signal")
    return signal, signal_off


def detect_events_kernel(signal, signal_off, w1, w2, threshold1, threshold2, peak_height):
    """Batch kernel behind `detect_events`, for callers whose arrays are already validated.

    Two parallel passes over reads: find boundaries (kept as read-relative int32 in a buffer as long
    as the signal), then, once the per-read counts fix the output offsets, write the events. The
    large arrays are numpy's: allocated inside a numba kernel they would be faulted in 4 KiB page
    by page, where numpy's get huge pages.
    """
    peaks = np.empty(len(signal), np.int32)
    settings = (np.int32(w1), np.int32(w2), np.float32(threshold1), np.float32(threshold2), np.float32(peak_height))
    n_peaks = batch_peaks(signal, signal_off, settings, peaks)
    ev_off = event_offsets(signal_off, n_peaks)
    total = ev_off[-1]
    out = (np.empty(total, np.int64), np.empty(total, np.float32), np.empty(total, np.float32),
           np.empty(total, np.float32))  # fmt: skip
    batch_fill(signal, signal_off, peaks, n_peaks, ev_off, *out)
    return (ev_off, *out)


@numba.njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def batch_peaks(signal, signal_off, settings, peaks):
    """Each read's boundaries at its own samples' positions in `peaks`; returns their counts.

    Reads go longest first in groups, a group's reads through `LANES` lanes (`group_peaks`), so
    that the reads side by side end at about the same time and the groups are handed out longest first.
    """
    n_reads = len(signal_off) - 1
    n_peaks = np.zeros(n_reads, np.int64)
    order = np.argsort(signal_off[:-1] - signal_off[1:], kind="mergesort")
    per = LANES * 4
    n_groups = (n_reads + per - 1) // per
    for g in numba.prange(n_groups):
        group_peaks(signal, signal_off, order[g * per : (g + 1) * per], settings, peaks, n_peaks)
    return n_peaks


@numba.njit(nogil=True, cache=True, error_model="numpy")
def group_peaks(signal, signal_off, reads, settings, peaks, n_peaks):
    """The boundaries of `reads`, `LANES` at a time: each lane forms a block of its read's t-statistics
    (`t_block`), the detectors then step through the block in all lanes at once (`lanes_step`), and
    each lane's boundaries are gathered into its read's slots. A lane whose read ends takes the next."""
    w1, w2 = settings[0], settings[1]
    size = scratch_size(w1, w2, BLOCK)
    pre_s = np.empty((LANES, size), np.float64)
    pre_q = np.empty((LANES, size), np.float64)
    t1 = np.empty((LANES, BLOCK), np.float32)
    t2 = np.empty((LANES, BLOCK), np.float32)
    tt1 = np.empty((BLOCK, LANES), np.float32)  # the same, sample-major
    tt2 = np.empty((BLOCK, LANES), np.float32)
    e1 = np.empty((BLOCK, LANES), np.int32)
    e2 = np.empty((BLOCK, LANES), np.int32)
    # pos1, pos2, valid1, valid2, masked_to, block start, block samples, whether the long detector emitted in it
    ints = np.empty((8, LANES), np.int32)
    vals = np.empty((2, LANES), np.float32)  # val1, val2
    read = np.full(LANES, -1, np.int64)
    sums_s = np.zeros(LANES, np.float64)
    sums_q = np.zeros(LANES, np.float64)
    filled = np.zeros(LANES, np.int64)
    base = np.zeros(LANES, np.int64)
    count = np.zeros(LANES, np.int64)
    taken = 0
    while True:
        busy = 0
        for lane in range(LANES):
            if read[lane] < 0:
                while taken < len(reads) and signal_off[reads[taken] + 1] == signal_off[reads[taken]]:
                    taken += 1  # an empty read has no boundaries
                if taken < len(reads):
                    read[lane] = reads[taken]
                    taken += 1
                    count[lane] = 0
                    ints[5, lane] = 0
                    set_lane(ints, vals, lane, START)
            ints[6, lane] = 0
            ints[7, lane] = 0
            if read[lane] >= 0:
                r = read[lane]
                a = signal_off[r]
                n = signal_off[r + 1] - a
                b0 = ints[5, lane]
                sums = _t_block(signal, a, n, w1, w2, (sums_s[lane], sums_q[lane], filled[lane], base[lane]), b0,
                                pre_s[lane], pre_q[lane], t1[lane], t2[lane])  # fmt: skip
                sums_s[lane], sums_q[lane], filled[lane], base[lane] = sums
                ints[6, lane] = min(BLOCK, n - b0)
                busy += 1
        if busy == 0:
            return
        steps = ints[6].max()
        for k in range(steps):
            for lane in range(LANES):
                tt1[k, lane] = t1[lane, k]
                tt2[k, lane] = t2[lane, k]
        for k in range(steps):  # LLVM runs this loop over the lanes in vector code
            for lane in range(LANES):
                i = np.int32(ints[5, lane] + k)
                state = (ints[0, lane], vals[0, lane], ints[2, lane] != 0, ints[1, lane], vals[1, lane],
                         ints[3, lane] != 0, ints[4, lane])  # fmt: skip
                on = (k < ints[6, lane]) & (i > 0)
                state, e1[k, lane], e2[k, lane] = _detect(state, tt1[k, lane], tt2[k, lane], i, on, settings)
                ints[7, lane] |= e2[k, lane] >= 0
                ints[0, lane], vals[0, lane], ints[2, lane], ints[1, lane], vals[1, lane], ints[3, lane], ints[4, lane] = state
        for lane in range(LANES):
            if read[lane] < 0:
                continue
            r = read[lane]
            a = signal_off[r]
            c = U(a + count[lane])  # unsigned: no negative-index wraparound on the stores
            if ints[7, lane]:  # both detectors' boundaries, the short one's first
                for k in range(ints[6, lane]):
                    peaks[c] = e1[k, lane]  # kept only if a boundary (>= 0)
                    c += U(e1[k, lane] >= 0)
                    peaks[c] = e2[k, lane]
                    c += U(e2[k, lane] >= 0)
            else:
                for k in range(ints[6, lane]):
                    peaks[c] = e1[k, lane]
                    c += U(e1[k, lane] >= 0)
            c = np.int64(c) - a
            count[lane] = c
            ints[5, lane] += BLOCK
            if ints[5, lane] >= signal_off[r + 1] - a:
                n_peaks[r] = c
                read[lane] = -1


@numba.njit(nogil=True, cache=True, error_model="numpy")
def set_lane(ints, vals, lane, state):
    ints[0, lane], vals[0, lane], ints[2, lane], ints[1, lane], vals[1, lane], ints[3, lane], ints[4, lane] = state


@numba.njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def batch_fill(signal, signal_off, peaks, n_peaks, ev_off, ev_start, ev_length, ev_mean, ev_stdv):
    """Each read's events at ev_off[r], from its boundaries."""
    for r in numba.prange(len(signal_off) - 1):
        a = signal_off[r]
        if ev_off[r + 1] > ev_off[r]:
            pre_s = np.empty(BLOCK + 1, np.float64)
            pre_q = np.empty(BLOCK + 1, np.float64)
            _fill_read(signal, a, signal_off[r + 1] - a, peaks, a, n_peaks[r], pre_s, pre_q, ev_start, ev_length,
                       ev_mean, ev_stdv, ev_off[r])  # fmt: skip


@numba.njit(nogil=True, cache=True, parallel=True)
def reverse_events(ev_off, ev_start, ev_length, ev_mean, ev_stdv):
    """Each read's events turned round in place: direct RNA's signal runs 3'->5', and f5c aligns its events
    5'->3' (each keeps its own samples: `ev_start` still counts from the read's first sample)."""
    for r in numba.prange(len(ev_off) - 1):
        a = ev_off[r]
        b = ev_off[r + 1] - 1
        while a < b:
            ev_start[a], ev_start[b] = ev_start[b], ev_start[a]
            ev_length[a], ev_length[b] = ev_length[b], ev_length[a]
            ev_mean[a], ev_mean[b] = ev_mean[b], ev_mean[a]
            ev_stdv[a], ev_stdv[b] = ev_stdv[b], ev_stdv[a]
            a += 1
            b -= 1


@numba.njit(nogil=True, cache=True)
def event_offsets(signal_off, n_peaks):
    """Each read's first event: a read with samples has one event more than boundaries, an empty read none."""
    n_reads = len(signal_off) - 1
    ev_off = np.zeros(n_reads + 1, np.int64)
    for r in range(n_reads):
        n_events = n_peaks[r] + 1 if signal_off[r + 1] > signal_off[r] else 0
        ev_off[r + 1] = ev_off[r] + n_events
    return ev_off
