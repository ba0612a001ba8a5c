"""Event detection's per-read arithmetic written once for the CPU kernel (`streamer.pipeline.events`)
and the CUDA kernels (`streamer_gpu.events`): prefix sums, the two t-statistics, the peak detector,
the events' statistics.

`event_cells(target)` compiles them for a target (`streamer.pipeline.targets`); both kernels run the
same source with the same rounding operations in the same order, so their events agree to the bit.
The arithmetic is f5c's (see `streamer.pipeline.events`). The prefix sums are a chain of float64
additions whose every step rounds, so they are formed in order, one read at a time: a parallel scan
would round differently. A read's sums are kept only as far as the t-statistics look: a ring of the
last `len(ring)` (a power of two above twice the longer window) sums, which a GPU thread holds in its
local memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from streamer.pipeline.targets import Target

FLT_MIN = np.float32(np.finfo(np.float32).tiny)
FLT_MAX = np.float32(np.finfo(np.float32).max)


@numba.njit(nogil=True, cache=True)
def ring_size(w1, w2):
    """The ring of prefix sums the windows need: a power of two above 2 max(w1, w2)."""
    size = 1
    while size <= 2 * max(w1, w2):
        size *= 2
    return size


class EventCells(NamedTuple):
    """Event detection's per-read arithmetic compiled for one target (`event_cells`)."""

    read_peaks: Callable
    fill_read: Callable


@functools.cache
def event_cells(t: Target) -> EventCells:
    """The arithmetic both event kernels share, in f5c's order and rounding, compiled for target t."""
    fsub, fmul, fdiv, fsqrt, dadd, ddiv = t.fsub, t.fmul, t.fdiv, t.fsqrt, t.dadd, t.ddiv

    @t.jit
    def accumulate(s, q, v):
        """One prefix-sum step: float64 sums, with the square rounded to float32 as f5c does."""
        return dadd(s, np.float64(v)), dadd(q, np.float64(fmul(v, v)))

    @t.jit
    def tstat(s_lo, q_lo, s_mid, q_mid, s_hi, q_hi, w):
        """Welch-style t between [i-w, i) and [i, i+w) from the prefix sums at i-w, i and i+w."""
        wf = np.float32(w)
        wd = np.float64(wf)
        sum1 = dadd(s_mid, -s_lo)
        sumsq1 = dadd(q_mid, -q_lo)
        sum2 = np.float32(dadd(s_hi, -s_mid))
        sumsq2 = np.float32(dadd(q_hi, -q_mid))
        mean1 = np.float32(ddiv(sum1, wd))
        mean2 = fdiv(sum2, wf)
        var = dadd(ddiv(sumsq1, wd), -np.float64(fmul(mean1, mean1)))
        var = dadd(var, np.float64(fdiv(sumsq2, wf)))
        var = np.float32(dadd(var, -np.float64(fmul(mean2, mean2))))
        if not var > FLT_MIN:  # fmaxf: also maps NaN to FLT_MIN
            var = FLT_MIN
        delta = fsub(mean2, mean1)
        return fdiv(abs(delta), fsqrt(fdiv(var, wf)))

    @t.jit
    def t_at(ring_s, ring_q, i, w, n):
        """The t-statistic of window w at i, 0 where the windows do not fit (or w < 2)."""
        if w < 2 or n < 2 * w or i < w or i > n - w:
            return np.float32(0.0)
        m = len(ring_s) - 1
        lo, mid, hi = (i - w) & m, i & m, (i + w) & m
        return tstat(ring_s[lo], ring_q[lo], ring_s[mid], ring_q[mid], ring_s[hi], ring_q[hi], w)

    @t.jit
    def climb(pos, val, t, i, height):
        """A detector's search: the running minimum until t rises height above it, then the running
        maximum (pos, val). Returns (pos, val, whether it was already past the minimum)."""
        if pos == -1:
            if t < val:
                val = t
            elif fsub(t, val) > height:
                val = t
                pos = i
            return pos, val, False
        if t > val:
            val = t
            pos = i
        return pos, val, True

    @t.jit
    def settle(pos, val, valid, t, i, threshold, height, half):
        """A detector's emission: once t fell height below a maximum over the threshold and more than
        half a window passed, it emits the maximum's position. Returns (pos, val, valid, emitted or -1)."""
        if fsub(val, t) > height and val > threshold:
            valid = True
        if valid and i - pos > half:
            return np.int64(-1), t, False, pos
        return pos, val, valid, np.int64(-1)

    @t.jit
    def read_peaks(x, a, n, w1, w2, th1, th2, height, ring_s, ring_q, peaks, p0):
        """Boundaries of the read x[a:a+n] into peaks[p0:]; returns how many (strictly increasing, in 1..n-1).

        Scrappie's short/long peak detector over both t-series at once (short first). A short peak
        above its threshold masks and resets the long detector for w1 samples; the short detector
        skips sample 0. ring_s/ring_q: float64 scratch of `ring_size(w1, w2)`.
        """
        if n == 0:
            return 0
        m = len(ring_s) - 1
        ahead = max(w1, w2)
        s = 0.0
        q = 0.0
        ring_s[0] = 0.0
        ring_q[0] = 0.0
        summed = 0  # prefix sums up to this index are in the ring
        pos1, pos2 = np.int64(-1), np.int64(-1)
        val1, val2 = FLT_MAX, FLT_MAX
        valid1, valid2 = False, False
        masked_to = np.int64(0)  # the long detector's
        count = 0
        for i in range(n):
            while summed < min(n, i + ahead):
                s, q = accumulate(s, q, x[a + summed])
                summed += 1
                ring_s[summed & m] = s
                ring_q[summed & m] = q
            if i > 0:
                t = t_at(ring_s, ring_q, i, w1, n)
                pos1, val1, past = climb(pos1, val1, t, i, height)
                if past:
                    if val1 > th1:
                        masked_to = pos1 + w1
                        pos2, val2, valid2 = np.int64(-1), FLT_MAX, False
                    pos1, val1, valid1, emitted = settle(pos1, val1, valid1, t, i, th1, height, w1 // 2)
                    if emitted >= 0:
                        peaks[p0 + count] = emitted
                        count += 1
            if masked_to < i:
                t = t_at(ring_s, ring_q, i, w2, n)
                pos2, val2, past = climb(pos2, val2, t, i, height)
                if past:
                    pos2, val2, valid2, emitted = settle(pos2, val2, valid2, t, i, th2, height, w2 // 2)
                    if emitted >= 0:
                        peaks[p0 + count] = emitted
                        count += 1
        return count

    @t.jit
    def fill_read(x, a, n, peaks, p0, n_peaks, start, length, mean, stdv, e0):
        """Events of the read x[a:a+n] between boundaries 0, peaks[p0:p0+n_peaks], n, written at e0.

        Forms the prefix sums again in the order `read_peaks` did, so each boundary sees the same sums.
        mean = f32(S) / len and var = f32(Q) / len - mean^2 in float32, stdv sqrt(max(var, 0)).
        """
        s = 0.0
        q = 0.0
        s0 = 0.0
        q0 = 0.0
        b0 = 0
        j = 0
        for e in range(n_peaks + 1):
            b = np.int64(peaks[p0 + e]) if e < n_peaks else n
            while j < b:
                s, q = accumulate(s, q, x[a + j])
                j += 1
            n_f = np.float32(b - b0)
            m_ = fdiv(np.float32(dadd(s, -s0)), n_f)
            var = fsub(fdiv(np.float32(dadd(q, -q0)), n_f), fmul(m_, m_))
            start[e0 + e] = b0
            length[e0 + e] = n_f
            mean[e0 + e] = m_
            stdv[e0 + e] = fsqrt(var) if var > 0 else np.float32(0.0)
            s0, q0, b0 = s, q, b

    return EventCells(read_peaks, fill_read)
