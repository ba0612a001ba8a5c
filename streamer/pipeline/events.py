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
import math
from dataclasses import dataclass

import numba
import numpy as np

log = logging.getLogger(__name__)

_FLT_MIN = np.float32(np.finfo(np.float32).tiny)
_FLT_MAX = np.float32(np.finfo(np.float32).max)


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
    if signal.dtype != np.float32:
        raise ValueError(f"signal must be float32 pA (f5c precision), got {signal.dtype}")
    signal = np.ascontiguousarray(signal)
    signal_off = np.ascontiguousarray(signal_off, dtype=np.int64)
    if signal_off.ndim != 1 or len(signal_off) < 1:
        raise ValueError("signal_off must be a 1-D array of n_reads + 1 offsets")
    if np.any(np.diff(signal_off) < 0) or signal_off[0] < 0 or signal_off[-1] > len(signal):
        raise ValueError("signal_off must be non-decreasing and within the signal")
    out = detect_events_kernel(
        signal, signal_off, params.w1, params.w2, params.threshold1, params.threshold2, params.peak_height
    )
    log.debug("events: %d reads, %d samples -> %d events", len(signal_off) - 1, len(signal), out[0][-1])
    return out


@numba.njit(nogil=True, cache=True, parallel=True)
def detect_events_kernel(signal, signal_off, w1, w2, threshold1, threshold2, peak_height):
    """Batch kernel behind `detect_events`, for callers whose arrays are already validated.

    Two parallel passes over reads: find boundaries (kept as read-relative int32 in a
    buffer as long as the signal), then, once the per-read counts fix the output
    offsets, write the events.
    """
    n_reads = len(signal_off) - 1
    th1 = np.float32(threshold1)
    th2 = np.float32(threshold2)
    height = np.float32(peak_height)
    peaks = np.empty(len(signal), np.int32)
    n_peaks = np.zeros(n_reads, np.int64)
    for r in numba.prange(n_reads):
        a, b = signal_off[r], signal_off[r + 1]
        n_peaks[r] = _read_peaks(signal[a:b], w1, w2, th1, th2, height, peaks[a:b])

    ev_off = np.zeros(n_reads + 1, np.int64)
    for r in range(n_reads):
        n_events = n_peaks[r] + 1 if signal_off[r + 1] > signal_off[r] else 0
        ev_off[r + 1] = ev_off[r] + n_events
    total = ev_off[n_reads]
    ev_start = np.empty(total, np.int64)
    ev_length = np.empty(total, np.float32)
    ev_mean = np.empty(total, np.float32)
    ev_stdv = np.empty(total, np.float32)
    for r in numba.prange(n_reads):
        a, b = signal_off[r], signal_off[r + 1]
        e0, e1 = ev_off[r], ev_off[r + 1]
        if e1 > e0:
            _fill_events(
                signal[a:b],
                peaks[a : a + n_peaks[r]],
                ev_start[e0:e1],
                ev_length[e0:e1],
                ev_mean[e0:e1],
                ev_stdv[e0:e1],
            )
    return ev_off, ev_start, ev_length, ev_mean, ev_stdv


@numba.njit(nogil=True, cache=True)
def _read_peaks(x, w1, w2, th1, th2, height, peaks):
    """Boundaries of one read into `peaks`; returns how many (strictly increasing, in 1..n-1)."""
    n = len(x)
    if n == 0:
        return 0
    sums = np.empty(n + 1, np.float64)
    sumsq = np.empty(n + 1, np.float64)
    s = 0.0
    q = 0.0
    sums[0] = 0.0
    sumsq[0] = 0.0
    for i in range(n):
        s, q = _accumulate(s, q, x[i])
        sums[i + 1] = s
        sumsq[i + 1] = q
    return _peak_detector(sums, sumsq, n, w1, w2, th1, th2, height, peaks)


@numba.njit(nogil=True, cache=True, inline="always")
def _accumulate(s, q, v):
    """One prefix-sum step: float64 sums, with the square rounded to float32 as f5c does."""
    return s + np.float64(v), q + np.float64(np.float32(v * v))


@numba.njit(nogil=True, cache=True)
def _tstat(sums, sumsq, i, w):
    """Welch-style t between [i-w, i) and [i, i+w); caller ensures w <= i <= n - w."""
    wf = np.float32(w)
    wd = np.float64(wf)
    sum1 = sums[i] - sums[i - w]
    sumsq1 = sumsq[i] - sumsq[i - w]
    sum2 = np.float32(sums[i + w] - sums[i])
    sumsq2 = np.float32(sumsq[i + w] - sumsq[i])
    mean1 = np.float32(sum1 / wd)
    mean2 = np.float32(sum2 / wf)
    var = np.float32(
        sumsq1 / wd
        - np.float64(np.float32(mean1 * mean1))
        + np.float64(np.float32(sumsq2 / wf))
        - np.float64(np.float32(mean2 * mean2))
    )
    if not var > _FLT_MIN:  # fmaxf: also maps NaN to FLT_MIN
        var = _FLT_MIN
    delta = np.float32(mean2 - mean1)
    return np.float32(abs(delta) / np.float32(math.sqrt(np.float32(var / wf))))


@numba.njit(nogil=True, cache=True)
def _peak_detector(sums, sumsq, n, w1, w2, th1, th2, height, peaks):
    """Scrappie's short/long peak detector over both t-series at once (short first).

    A detector tracks a running minimum until t rises `height` above it, then the
    running maximum; it emits the maximum's position once t has fallen `height` below
    it, the maximum beats the threshold and more than w/2 samples have passed. A short
    peak above its threshold masks and resets the long detector for w1 samples.
    Because of that masking, positions come out strictly increasing.
    """
    window = np.array((w1, w2), np.int64)
    threshold = np.array((th1, th2), np.float32)
    masked_to = np.zeros(2, np.int64)
    peak_pos = np.full(2, -1, np.int64)
    peak_val = np.full(2, _FLT_MAX, np.float32)
    valid = np.zeros(2, np.bool_)
    count = 0
    for i in range(n):
        for k in range(2):
            if masked_to[k] >= i:
                continue
            w = window[k]
            t = np.float32(0.0)
            if w >= 2 and n >= 2 * w and w <= i <= n - w:
                t = _tstat(sums, sumsq, i, w)
            if peak_pos[k] == -1:
                if t < peak_val[k]:
                    peak_val[k] = t
                elif np.float32(t - peak_val[k]) > height:
                    peak_val[k] = t
                    peak_pos[k] = i
                continue
            if t > peak_val[k]:
                peak_val[k] = t
                peak_pos[k] = i
            if k == 0 and peak_val[0] > threshold[0]:
                masked_to[1] = peak_pos[0] + window[0]
                peak_pos[1] = -1
                peak_val[1] = _FLT_MAX
                valid[1] = False
            if np.float32(peak_val[k] - t) > height and peak_val[k] > threshold[k]:
                valid[k] = True
            if valid[k] and i - peak_pos[k] > w // 2:
                peaks[count] = peak_pos[k]
                count += 1
                peak_pos[k] = -1
                peak_val[k] = t
                valid[k] = False
    return count


@numba.njit(nogil=True, cache=True)
def _fill_events(x, peaks, start, length, mean, stdv):
    """Events between boundaries 0, peaks..., n of one read.

    Recomputes the running prefix sums in the same order as `_read_peaks`, so each
    boundary sees bit-identical sums without keeping them for the whole batch.
    """
    n_peaks = len(peaks)
    s = 0.0
    q = 0.0
    s0 = 0.0
    q0 = 0.0
    b0 = 0
    j = 0
    for e in range(n_peaks + 1):
        b = np.int64(peaks[e]) if e < n_peaks else len(x)
        while j < b:
            s, q = _accumulate(s, q, x[j])
            j += 1
        n_f = np.float32(b - b0)
        m = np.float32(np.float32(s - s0) / n_f)
        var = np.float32(np.float32(np.float32(q - q0) / n_f) - np.float32(m * m))
        start[e] = b0
        length[e] = n_f
        mean[e] = m
        stdv[e] = np.float32(math.sqrt(var)) if var > 0 else np.float32(0.0)
        s0, q0, b0 = s, q, b
