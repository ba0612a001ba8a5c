"""Event detection's per-read arithmetic written once for the CPU kernel (`streamer.pipeline.events`)
and the CUDA kernels (`streamer_gpu.events`): prefix sums, the two t-statistics, the peak detectors,
the events' statistics.

`event_cells(target)` compiles them for a target (`streamer.pipeline.targets`); both kernels run the
same source with the same rounding operations in the same order, so their events agree to the bit.
The arithmetic is f5c's (see `streamer.pipeline.events`). The prefix sums are a chain of float64
additions whose every step rounds, so they are formed in order, one read at a time: a parallel scan
would round differently. A read goes in blocks: a block's prefix sums (and the few either side its
windows reach), then its two t-series (`tstat` where the windows `fit`), then the detectors over
them (`detect`: selects, no branch the data decides). The CPU kernel runs these cells over sixteen
reads side by side, in SIMD lanes (a read alone: `read_peaks`); once a read's boundaries are known,
`fill_read` forms its sums again, a block at a time, and writes its events. The GPU splits the same
work across threads (`streamer_gpu.events`): a read's prefix sums in order on one thread, kept every
few samples, from which any other thread forms the same sums again (the same additions from the
same value round the same), so `t_series` and `event` run a thread per block of samples or per event,
and only `detect_run`, a few selects a sample, stays one thread a read.
The cells take a read's flat arrays and the detectors' settings, a dozen or so, as device functions
must; `detect_events` and `CudaEvents.detect` take the signal and `EventParams` and unpack them once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numba
import numpy as np

from streamer.pipeline.targets import Target

U = np.uint64
FLT_MIN = np.float32(np.finfo(np.float32).tiny)
FLT_MAX = np.float32(np.finfo(np.float32).max)


@numba.njit(nogil=True, cache=True)
def scratch_size(w1, w2, block):
    """The prefix sums a block of `block` samples reaches: its own, and max(w1, w2) either side."""
    return block + 2 * max(w1, w2) + 1


# the detectors' state at a read's first sample (`detect`): both searching, nothing masked
START = (np.int32(-1), FLT_MAX, False, np.int32(-1), FLT_MAX, False, np.int32(0))


class EventCells(NamedTuple):
    """Event detection's per-read arithmetic compiled for one target (`event_cells`)."""

    accumulate: Callable
    tstat: Callable
    fits: Callable
    detect: Callable
    t_series: Callable
    read_peaks: Callable
    detect_run: Callable
    event: Callable
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
    def fits(i, n, w):
        """Whether both windows of w samples either side of sample i lie in a read of n samples (and w > 1):
        elsewhere the t-statistic is 0."""
        return (w >= 2) & (i >= w) & (i + w <= n)

    @t.jit
    def t_series(pre_s, pre_q, base, b0, b1, n, w, out):
        """The t-statistics of window w at samples b0..b1-1 of a read of n into out[0:] (`fits`).

        pre_s/pre_q[j - base] hold the prefix sums j the windows reach (any value where they do not fit).
        """
        for k in range(b1 - b0):
            j = U(b0 + k - base)  # unsigned: numba adds no negative-index wraparound
            lo, hi = j - U(w), j + U(w)
            t = tstat(pre_s[lo], pre_q[lo], pre_s[j], pre_q[j], pre_s[hi], pre_q[hi], w)
            out[k] = t if fits(b0 + k, n, w) else np.float32(0.0)

    @t.jit
    def t_block(x, a, n, w1, w2, sums, b0, pre_s, pre_q, t1, t2):
        """The two t-series of the read x[a:a+n] at samples b0.. (as many as t1 holds, up to n) into t1, t2.

        sums = (s, q, filled, base): the prefix sums 0..filled are formed, sum j at pre_s[j - base]
        (any value at b0 = 0); those the block's windows reach (`scratch_size`) move to the front, the
        rest are formed in order. Returns sums for the next block.
        """
        s, q, filled, base = sums
        ahead = max(w1, w2)
        if b0 == 0:
            s, q, filled, base = 0.0, 0.0, 0, -ahead
            pre_s[ahead] = 0.0
            pre_q[ahead] = 0.0
        b1 = min(b0 + len(t1), n)
        new_base = b0 - ahead
        for j in range(max(new_base, 0), filled + 1):
            pre_s[j - new_base] = pre_s[j - base]
            pre_q[j - new_base] = pre_q[j - base]
        base = new_base
        while filled < min(n, b1 - 1 + ahead):
            s, q = accumulate(s, q, x[a + filled])
            filled += 1
            pre_s[filled - base] = s
            pre_q[filled - base] = q
        t_series(pre_s, pre_q, base, b0, b1, n, w1, t1)
        t_series(pre_s, pre_q, base, b0, b1, n, w2, t2)
        return s, q, filled, base

    @t.jit
    def detector(pos, val, valid, t, i, threshold, height, half, on):
        """One sample of a peak detector, if on, in selects: no branch the data decides.

        Its search follows the running minimum (pos -1) until t rises height above it, then the
        running maximum (pos, val); once t fell height below a maximum over the threshold and more
        than half a window passed, it emits the maximum's position and searches again from t.
        Returns (pos, val, valid), the maximum's position, whether that is over the threshold, and
        whether it is emitted.
        """
        searching = pos < 0
        lower = t < val
        higher = t > val
        rise = fsub(t, val) > height
        fall = fsub(val, t) > height
        flat = fsub(t, t) > height  # the fall from a maximum t itself set: 0 > height for a finite t
        past = on & (not searching)
        take = (on & searching & (lower | rise)) | (past & higher)
        found = (on & searching & rise & (not lower)) | (past & higher)
        over = past & ((t > threshold) if take else (val > threshold))
        valid = valid | (over & (flat if take else fall))
        val = t if take else val
        top = i if found else pos
        emit = past & valid & (i - top > half)
        pos = np.int32(-1) if emit else top
        return pos, t if emit else val, valid & (not emit), top, over, emit

    @t.jit
    def detect(state, t1, t2, i, on, settings):
        """Sample i of scrappie's short and long peak detectors over their t-statistics t1 and t2, if on.

        state = (pos1, val1, valid1, pos2, val2, valid2, masked_to), `START` at a read's first sample;
        settings = (w1, w2, th1, th2, height), the thresholds and height float32 as f5c stores them.
        A short peak over its threshold masks and resets the long detector for w1 samples. Returns
        the new state and each detector's boundary at this sample (-1 if none), short first.
        Positions are int32: a read's samples count far below 2^31.
        """
        pos1, val1, valid1, pos2, val2, valid2, masked_to = state
        w1, w2, th1, th2, height = settings
        pos1, val1, valid1, top, over, emit = detector(pos1, val1, valid1, t1, i, th1, height, w1 >> 1, on)
        peak1 = top if emit else np.int32(-1)
        masked_to = np.int32(top + w1) if over else masked_to
        pos2 = np.int32(-1) if over else pos2
        val2 = FLT_MAX if over else val2
        valid2 = valid2 & (not over)
        pos2, val2, valid2, top, _, emit = detector(pos2, val2, valid2, t2, i, th2, height, w2 >> 1,
                                                    on & (masked_to < i))  # fmt: skip
        peak2 = top if emit else np.int32(-1)
        return (pos1, val1, valid1, pos2, val2, valid2, masked_to), peak1, peak2

    @t.jit
    def detect_run(state, t1, t2, k0, i0, i1, settings, peaks, p0, count):
        """`detect` over samples i0..i1-1 of a read, their t-statistics at t1/t2[k0:]; each boundary into
        peaks[p0 + count], counted on. Returns the state and the count after sample i1 - 1."""
        for i in range(i0, i1):
            state, peak1, peak2 = detect(state, t1[k0 + i - i0], t2[k0 + i - i0], np.int32(i), i > 0, settings)
            if peak1 >= 0:
                peaks[p0 + count] = peak1
                count += 1
            if peak2 >= 0:
                peaks[p0 + count] = peak2
                count += 1
        return state, count

    @t.jit
    def read_peaks(x, a, n, settings, pre_s, pre_q, t1, t2, peaks, p0):
        """Boundaries of the read x[a:a+n] into peaks[p0:]; returns how many (strictly increasing, in 1..n-1).

        One read alone (the CPU kernel's longest reads): its blocks of len(t1) samples (`t_block`: pre_s/pre_q hold
        `scratch_size(w1, w2, len(t1))` sums), then `detect` over them, off at sample 0.
        """
        w1, w2 = settings[0], settings[1]
        sums = (0.0, 0.0, 0, 0)
        state = START
        count = 0
        for b0 in range(0, n, len(t1)):
            sums = t_block(x, a, n, w1, w2, sums, b0, pre_s, pre_q, t1, t2)
            state, count = detect_run(state, t1, t2, 0, b0, min(b0 + len(t1), n), settings, peaks, p0, count)
        return count

    @t.jit
    def event(total, total_sq, length):
        """An event's (mean, stdv) from its samples' sum and sum of squares (float32 roundings of
        differences of float64 prefix sums): mean = sum / len and var = sum_sq / len - mean^2 in
        float32, stdv sqrt(max(var, 0))."""
        n_f = np.float32(length)
        m_ = fdiv(total, n_f)
        var = fsub(fdiv(total_sq, n_f), fmul(m_, m_))
        return m_, fsqrt(var) if var > 0 else np.float32(0.0)

    @t.jit
    def fill_read(x, a, n, peaks, p0, n_peaks, pre_s, pre_q, start, length, mean, stdv, e0):
        """Events of the read x[a:a+n] between boundaries 0, peaks[p0:p0+n_peaks], n, written at e0.

        The read goes in blocks of len(pre_s) - 1 samples: the block's prefix sums, formed in the order
        `read_peaks` formed them (so each boundary sees the same sums), then the sums of the events that
        end in it, held in mean and stdv until a last pass without a loop-carried step (the CPU
        compiler vectorises it) turns them into the events' statistics.
        """
        block = len(pre_s) - 1
        s = 0.0
        q = 0.0
        s0 = 0.0  # the prefix sums at the first sample of event e, b0
        q0 = 0.0
        b0 = np.int64(0)
        e = 0
        for c0 in range(0, n, block):
            c1 = min(c0 + block, n)
            pre_s[0] = s
            pre_q[0] = q
            for j in range(c1 - c0):
                s, q = accumulate(s, q, x[a + c0 + j])
                pre_s[j + 1] = s
                pre_q[j + 1] = q
            e1 = e
            while e1 < n_peaks and peaks[p0 + e1] <= c1:
                e1 += 1
            for k in range(e, e1):
                b = np.int64(peaks[p0 + k])
                s1, q1 = pre_s[b - c0], pre_q[b - c0]
                start[e0 + k] = b0
                length[e0 + k] = np.float32(b - b0)
                mean[e0 + k] = np.float32(dadd(s1, -s0))
                stdv[e0 + k] = np.float32(dadd(q1, -q0))
                s0, q0, b0 = s1, q1, b
            e = e1
        start[e0 + e] = b0  # the last event ends with the read
        length[e0 + e] = np.float32(n - b0)
        mean[e0 + e] = np.float32(dadd(s, -s0))
        stdv[e0 + e] = np.float32(dadd(q, -q0))
        o = U(e0)
        for k in range(U(e + 1)):
            mean[o + k], stdv[o + k] = event(mean[o + k], stdv[o + k], length[o + k])

    return EventCells(accumulate, tstat, fits, detect, t_series, read_peaks, detect_run, event, fill_read)
