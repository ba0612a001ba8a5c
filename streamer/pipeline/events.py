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

The CPU kernel (`detect_events_kernel`) makes two parallel passes over a batch's reads, with
the arithmetic of `streamer.pipeline.event_cells`. Boundaries: the reads, longest first, go in
groups through sixteen lanes (`group_peaks`), a block of samples of each lane's read at a time:
each lane's prefix sums in order, then the t-statistics and the detectors over all sixteen side by
side, which LLVM runs in SIMD lanes (the detectors are selects: as branches, about one an event
would be mispredicted), then each lane's boundaries gathered into its read's slots. Events: each
read's sums formed again a block at a time, its events written where the counts put them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numba
import numpy as np

from streamer.pipeline.chunks import chunked
from streamer.pipeline.event_cells import START, event_cells, scratch_size
from streamer.pipeline.targets import CPU, LANE

log = logging.getLogger(__name__)
_cpu = event_cells(CPU)  # a read alone (`batch_peaks`' long reads) and each read's events
_read_peaks, _fill_read = _cpu.read_peaks, _cpu.fill_read
_lane = event_cells(LANE)  # compiled into the lane loops' own function, which LLVM then vectorises
_accumulate, _tstat, _fits, _detect = _lane.accumulate, _lane.tstat, _lane.fits, _lane.detect
BLOCK = 256  # samples of a read formed at a time (1,024 and 128 measured slower)
ALONE_BLOCK = 1024  # the same for a read that runs alone (`_read_peaks`)
LANES = 16  # reads side by side: one AVX-512 vector of float32 (two of AVX2)
ALONE_COST = 4  # a sample alone costs about four in a lane (one thread: 15.9 against 4.0-4.4 ns, 2 cores)
U = np.uint64  # unsigned offsets: numba adds no negative-index wraparound


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
    signal: np.ndarray, signal_off: np.ndarray, params: EventParams = DNA_PARAMS, spread: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segment every read of a batch into events.

    `signal` is float32 pA of all reads concatenated, read i owning
    `signal[signal_off[i]:signal_off[i + 1]]`. Returns `(ev_off, ev_start, ev_length,
    ev_mean, ev_stdv)`: event arrays concatenated in read order, `ev_start` relative to
    the read's first sample. Without `spread`, the means alone (`means_only`).
    """
    signal, signal_off = batch_signal(signal, signal_off)
    out = detect_events_kernel(
        signal, signal_off, params.w1, params.w2, params.threshold1, params.threshold2, params.peak_height
    )
    log.debug("events: %d reads, %d samples -> %d events", len(signal_off) - 1, len(signal), out[0][-1])
    return out if spread else means_only(out)


def means_only(events: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Events without their starts, lengths and spreads (empty arrays of their types): the scalings, ABEA,
    recalibration and the HMM read the means alone, so a run that renders no event needs no more (and a
    GPU copies back a fifth of the bytes)."""
    ev_off, start, length, mean, stdv = events
    return ev_off, np.empty(0, start.dtype), np.empty(0, length.dtype), mean, np.empty(0, stdv.dtype)


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

    Two parallel passes: find each read's boundaries (`batch_peaks`, kept as read-relative int32 in
    a buffer as long as the signal), then, once their counts fix the output offsets, write the
    events (`batch_fill`). Work is handed to threads one read or group at a time, as reads differ in
    length by orders of magnitude (`lane_groups`). The large arrays are numpy's: allocated inside a numba kernel
    they would be faulted in 4 KiB page by page, where numpy's get huge pages.
    """
    peaks = np.empty(len(signal), np.int32)
    settings = (np.int32(w1), np.int32(w2), np.float32(threshold1), np.float32(threshold2), np.float32(peak_height))
    order, alone, bounds = lane_groups(np.diff(signal_off), numba.get_num_threads())
    with chunked(1):
        n_peaks = batch_peaks(signal, signal_off, settings, order, alone, bounds, peaks)
        ev_off = event_offsets(signal_off, n_peaks)
        total = ev_off[-1]
        out = (np.empty(total, np.int64), np.empty(total, np.float32), np.empty(total, np.float32),
               np.empty(total, np.float32))  # fmt: skip
        batch_fill(signal, signal_off, peaks, n_peaks, ev_off, *out)
    return (ev_off, *out)


def lane_groups(lengths: np.ndarray, threads: int) -> tuple[np.ndarray, int, np.ndarray]:
    """The reads longest first; how many of them run alone (`alone_reads`); where each group of the rest
    starts (and the last ends): at most 4 x threads groups of about equal samples where each can hold
    `LANES` reads, so that a group's reads, side by side in its lanes, end at about the same time."""
    order = np.argsort(-lengths, kind="stable")
    sorted_lengths = lengths[order]
    alone = alone_reads(sorted_lengths, max(1, threads))
    cum = np.cumsum(sorted_lengths[alone:])
    n_groups = 4 * max(1, threads)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, n_groups) / n_groups, side="right") if len(cum) else []
    bounds = [alone]
    for cut in cuts:
        cut = max(alone + int(cut), bounds[-1] + LANES)
        if cut <= len(order) - LANES:
            bounds.append(cut)
    bounds.append(len(order))
    return order, alone, np.array(bounds, np.int64)


def alone_reads(sorted_lengths: np.ndarray, threads: int) -> int:
    """How many of the longest reads (lengths longest first) run alone: the count that makes the stage
    shortest by this estimate, the largest of three bounds. The work over the threads, where a sample
    alone costs `ALONE_COST` in a lane; the longest read left in a lane, which advances one sample a
    step of all `LANES` lanes; the longest read alone. A long read in a lane holds its group's thread
    past the others; alone it takes four times the work: on a few cores nearly every read goes in
    lanes, on many the longest go alone."""
    n = len(sorted_lengths)
    if n == 0:
        return 0
    longest_k = np.concatenate(([0.0], np.cumsum(sorted_lengths, dtype=np.float64)))  # samples of the k longest
    work = (ALONE_COST * longest_k + (longest_k[-1] - longest_k)) / threads
    bound = np.maximum(work, np.append(sorted_lengths, 0).astype(np.float64) * LANES)  # the longest in a lane
    bound[1:] = np.maximum(bound[1:], ALONE_COST * float(sorted_lengths[0]))  # the longest alone, once one is
    return int(np.argmin(bound))


@numba.njit(nogil=True, cache=True, parallel=True, error_model="numpy")
def batch_peaks(signal, signal_off, settings, order, alone, bounds, peaks):
    """Each read's boundaries at its own samples' positions in `peaks`; returns their counts.
    Reads order[:alone] each alone, in `_read_peaks`; group g is reads order[bounds[g]:bounds[g + 1]]
    (`lane_groups`), in `group_peaks`."""
    n_peaks = np.zeros(len(signal_off) - 1, np.int64)
    size = scratch_size(settings[0], settings[1], ALONE_BLOCK)
    for item in numba.prange(alone + len(bounds) - 1):
        if item < alone:
            r = order[item]
            a = signal_off[r]
            n_peaks[r] = _read_peaks(signal, a, signal_off[r + 1] - a, settings, np.empty(size), np.empty(size),
                                     np.empty(ALONE_BLOCK, np.float32), np.empty(ALONE_BLOCK, np.float32), peaks, a)
        else:
            g = item - alone
            group_peaks(signal, signal_off, order[bounds[g] : bounds[g + 1]], settings, peaks, n_peaks)
    return n_peaks


@numba.njit(nogil=True, cache=True, error_model="numpy")
def group_peaks(signal, signal_off, reads, settings, peaks, n_peaks):
    """The boundaries of `reads`, `LANES` at a time, a block of `BLOCK` samples of each lane's read at a
    time: the block's prefix sums (and those its windows reach), its two t-series, the detectors,
    then each lane's boundaries gathered into its read's slots. A lane whose read ends takes the next.

    Each step goes over the lanes side by side in arrays of [row, lane] (structure of arrays), which
    LLVM turns into vector code: a lane's arithmetic is its read's own, in the same order.
    """
    w1, w2 = settings[0], settings[1]
    ahead = max(w1, w2)
    rows = BLOCK + 2 * ahead  # row j holds prefix sum (block start - ahead + j)
    # zeros: rows no read fills still go through the arithmetic, and denormal garbage would slow it
    ss = np.zeros((rows, LANES), np.float64)
    qq = np.zeros((rows, LANES), np.float64)
    tt1 = np.empty((BLOCK, LANES), np.float32)
    tt2 = np.empty((BLOCK, LANES), np.float32)
    e1 = np.empty((BLOCK, LANES), np.int32)
    e2 = np.empty((BLOCK, LANES), np.int32)
    ints = np.zeros((7, LANES), np.int32)  # pos1, pos2, valid1, valid2, masked_to, block start, block samples
    vals = np.zeros((2, LANES), np.float32)  # val1, val2
    span = np.zeros((3, LANES), np.int64)  # the read's first sample, its samples, the block's first row to form
    read = np.full(LANES, -1, np.int64)
    count = np.zeros(LANES, np.int64)
    taken = 0
    while True:
        busy = 0
        for lane in range(LANES):
            if read[lane] < 0:
                while taken < len(reads) and signal_off[reads[taken] + 1] == signal_off[reads[taken]]:
                    taken += 1  # an empty read has no boundaries
                if taken < len(reads):
                    r = reads[taken]
                    taken += 1
                    read[lane] = r
                    count[lane] = 0
                    span[0, lane], span[1, lane] = signal_off[r], signal_off[r + 1] - signal_off[r]
                    span[2, lane] = ahead + 1
                    ss[ahead, lane] = 0.0  # prefix sum 0
                    qq[ahead, lane] = 0.0
                    ints[5, lane] = 0
                    (ints[0, lane], vals[0, lane], ints[2, lane], ints[1, lane], vals[1, lane], ints[3, lane],
                     ints[4, lane]) = START  # fmt: skip
            ints[6, lane] = 0
            if read[lane] >= 0:
                ints[6, lane] = min(BLOCK, span[1, lane] - ints[5, lane])
                busy += 1
            else:
                span[0, lane], span[1, lane] = 0, 0
        if busy == 0:
            return
        for lane in range(LANES):  # the prefix sums, each lane's in order (a chain of roundings: no lanes)
            if read[lane] < 0:
                continue
            a, n, j0 = span[0, lane], span[1, lane], span[2, lane]
            p0 = ints[5, lane] - ahead  # the sum in row 0
            s, q = ss[j0 - 1, lane], qq[j0 - 1, lane]
            x0 = U(a + p0 + j0 - 1)  # the sample sum j0 adds
            for m in range(U(max(min(rows, n - p0 + 1) - j0, 0))):  # up to sum n
                s, q = _accumulate(s, q, signal[x0 + m])
                ss[U(j0) + m, lane] = s
                qq[U(j0) + m, lane] = q
        steps = ints[6].max()
        for k in range(U(steps)):  # the two t-series
            j = k + U(ahead)  # the row of sum i, for i the block's sample k
            lo1, hi1, lo2, hi2 = j - U(w1), j + U(w1), j - U(w2), j + U(w2)
            for lane in range(LANES):
                i = ints[5, lane] + np.int64(k)
                n = span[1, lane]
                t = _tstat(ss[lo1, lane], qq[lo1, lane], ss[j, lane], qq[j, lane], ss[hi1, lane], qq[hi1, lane], w1)
                tt1[k, lane] = t if _fits(i, n, w1) else np.float32(0.0)
                t = _tstat(ss[lo2, lane], qq[lo2, lane], ss[j, lane], qq[j, lane], ss[hi2, lane], qq[hi2, lane], w2)
                tt2[k, lane] = t if _fits(i, n, w2) else np.float32(0.0)
        long_emitted = False
        for k in range(U(steps)):  # the detectors
            k32 = np.int32(k)
            for lane in range(LANES):
                i = np.int32(ints[5, lane] + k32)
                state = (ints[0, lane], vals[0, lane], ints[2, lane] != 0, ints[1, lane], vals[1, lane],
                         ints[3, lane] != 0, ints[4, lane])  # fmt: skip
                on = (k32 < ints[6, lane]) & (i > 0)
                state, e1[k, lane], e2[k, lane] = _detect(state, tt1[k, lane], tt2[k, lane], i, on, settings)
                (ints[0, lane], vals[0, lane], ints[2, lane], ints[1, lane], vals[1, lane], ints[3, lane],
                 ints[4, lane]) = state  # fmt: skip
                long_emitted |= e2[k, lane] >= 0
        for j in range(2 * ahead):  # the sums the next block's windows reach move to the front
            for lane in range(LANES):
                ss[j, lane] = ss[j + BLOCK, lane]
                qq[j, lane] = qq[j + BLOCK, lane]
        for lane in range(LANES):
            if read[lane] < 0:
                continue
            span[2, lane] = 2 * ahead
            r = read[lane]
            a = span[0, lane]
            c = U(a + count[lane])  # unsigned: no negative-index wraparound on the stores
            if long_emitted:  # both detectors' boundaries, the short one's first
                for k in range(U(ints[6, lane])):
                    peaks[c] = e1[k, lane]  # kept if a boundary (>= 0): a read's n slots hold its n - 1 at most
                    c += U(e1[k, lane] >= 0)
                    peaks[c] = e2[k, lane]
                    c += U(e2[k, lane] >= 0)
            else:
                for k in range(U(ints[6, lane])):
                    peaks[c] = e1[k, lane]
                    c += U(e1[k, lane] >= 0)
            count[lane] = np.int64(c) - a
            ints[5, lane] += BLOCK
            if ints[5, lane] >= span[1, lane]:
                n_peaks[r] = count[lane]
                read[lane] = -1


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
    5'->3' (each keeps its own samples: `ev_start` still counts from the read's first sample). Starts,
    lengths and spreads left out (`means_only`) stay empty."""
    spread = ev_start.shape[0] == ev_mean.shape[0]
    for r in numba.prange(len(ev_off) - 1):
        a = ev_off[r]
        b = ev_off[r + 1] - 1
        while a < b:
            if spread:
                ev_start[a], ev_start[b] = ev_start[b], ev_start[a]
                ev_length[a], ev_length[b] = ev_length[b], ev_length[a]
                ev_stdv[a], ev_stdv[b] = ev_stdv[b], ev_stdv[a]
            ev_mean[a], ev_mean[b] = ev_mean[b], ev_mean[a]
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
