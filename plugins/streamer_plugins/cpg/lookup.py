"""From event-to-k-mer (ABEA) and read-to-reference (CIGAR) to event-to-reference.

The HMM scores a reference window against the events of the read that cover it. Those events
are found as nanopolish and f5c find them: walk the CIGAR to get (reference, read) base pairs,
turn each read position into a k-mer index on the sequenced strand, and take the closest event
aligned to a k-mer at or before it (searching up to `search` k-mers each way). The quirks of
that search (the k-mer at the search limit is never examined) are kept, because they decide
which events bound a window. The tools make that map for every aligned base; only the bases at a
window's ends are ever looked at, so here the map is described by the CIGAR's runs of aligned
bases (`aligned_blocks`, `map_span`) and an entry is found, and its event looked up, when a window
asks for it (`events_bounding`): the same events, at a tenth of the work.
"""

from __future__ import annotations

import numba
import numpy as np

from streamer.pipeline.batch import CIGAR_D, CIGAR_EQ, CIGAR_I, CIGAR_M, CIGAR_N, CIGAR_S, CIGAR_X

CLOSEST_EVENT_SEARCH = 1000


@numba.njit(nogil=True, cache=True)
def is_spliced(cigar):
    """True if the alignment skips reference (N): the window lookup cannot use such a read."""
    for i in range(cigar.shape[0]):
        if cigar[i, 0] == CIGAR_N:
            return True
    return False


@numba.njit(nogil=True, cache=True)
def aligned_segments(cigar, ref_start):
    """(reference, read) position of every M/=/X base and where each segment's bases start (one entry more):
    N starts a new segment. Read positions as `aligned_blocks`'."""
    ref, read, first, segments = aligned_blocks(cigar, ref_start)
    ref_pos = np.empty(first[-1], np.int64)
    read_pos = np.empty(first[-1], np.int64)
    for b in range(ref.shape[0]):
        for t in range(first[b + 1] - first[b]):
            ref_pos[first[b] + t] = ref[b] + t
            read_pos[first[b] + t] = read[b] + t
    return ref_pos, read_pos, first[segments]


@numba.njit(nogil=True, cache=True)
def aligned_blocks(cigar, ref_start):
    """The alignment's runs of M/=/X bases, in CIGAR order: each run's first reference position and
    first read position; (one entry more) the index of its first base among all the aligned bases; and
    (one entry more) the first run of each segment, an N (a skipped region: an intron) starting a new one.
    Base a of run b is at reference ref[b] + a - first[b], read position read[b] + a - first[b].

    Read positions count soft clips and insertions, not hard clips, as in the BAM's SEQ. A read's
    windows look their events up run by run (`read_windows`), not base by base: a CIGAR has about a
    tenth as many runs as bases.
    """
    n = 0
    n_segments = 1
    for i in range(cigar.shape[0]):
        op = cigar[i, 0]
        if op == CIGAR_M or op == CIGAR_EQ or op == CIGAR_X:
            n += 1
        elif op == CIGAR_N:
            n_segments += 1
    ref = np.empty(n, np.int64)
    read = np.empty(n, np.int64)
    first = np.empty(n + 1, np.int64)
    segments = np.empty(n_segments + 1, np.int64)
    segments[0] = 0
    r = ref_start
    q = 0
    a = 0
    b = 0
    s = 1
    for i in range(cigar.shape[0]):
        op = cigar[i, 0]
        length = cigar[i, 1]
        if op == CIGAR_M or op == CIGAR_EQ or op == CIGAR_X:
            ref[b] = r
            read[b] = q
            first[b] = a
            b += 1
            a += length
            r += length
            q += length
        elif op == CIGAR_N:
            segments[s] = b
            s += 1
            r += length
        elif op == CIGAR_D:
            r += length
        elif op == CIGAR_I or op == CIGAR_S:
            q += length
    first[n] = a
    segments[n_segments] = n
    return ref, read, first, segments


@numba.njit(nogil=True, cache=True)
def _first_at_read(read, first, q):
    """The first aligned base at read position q or after (`first[-1]`: none)."""
    for b in range(read.shape[0]):
        if read[b] + first[b + 1] - first[b] > q:
            return first[b] + max(0, q - read[b])
    return first[-1]


@numba.njit(nogil=True, cache=True)
def _run_of(first, a, b):
    """The run holding aligned base a, looked for from run b on."""
    while first[b + 1] <= a:
        b += 1
    return b


@numba.njit(nogil=True, cache=True)
def base_event(read, first, b, a, rc, read_len, k, first_event, search):
    """The event of aligned base a (of run b): the closest event of its k-mer on the sequenced strand."""
    q = read[b] + a - first[b]
    return closest_event(first_event, read_len - q - k if rc else q, search)


@numba.njit(nogil=True, cache=True)
def map_span(ref, read, first, rc, read_len, k, first_event, search):
    """The read's event-to-reference map as nanopolish and f5c make it, without making it: its entries
    are the aligned bases lo..hi-1 (those at least k from either read end, in reference order), each
    with `base_event`'s event; a map whose first and last events are the same is degenerate and empty
    (lo == hi). Returns (lo, hi, the run of lo, the reference position of lo)."""
    lo = _first_at_read(read, first, k)
    hi = max(lo, _first_at_read(read, first, read_len - k))
    if lo == hi:
        return lo, lo, 0, 0
    b_lo = _run_of(first, lo, 0)
    b_hi = _run_of(first, hi - 1, b_lo)
    if (base_event(read, first, b_lo, lo, rc, read_len, k, first_event, search)
            == base_event(read, first, b_hi, hi - 1, rc, read_len, k, first_event, search)):  # fmt: skip
        return lo, lo, 0, 0
    return lo, hi, b_lo, ref[b_lo] + lo - first[b_lo]


@numba.njit(nogil=True, cache=True)
def entry_at(ref, first, lo, hi, b_lo, ref_lo, v, b):
    """The map's (`map_span`'s) first entry at reference position v or after and its run; hi when there
    is none. Runs are looked at from b on: a read's windows ask in ascending order, each from the run
    the one before found, so that together they walk the CIGAR's runs once."""
    if lo >= hi:
        return hi, b
    if v <= ref_lo:
        return lo, b_lo
    n = ref.shape[0]
    b = max(b, b_lo)
    while b < n and (ref[b] + first[b + 1] - first[b] <= v or first[b + 1] == first[b]):  # before v, or empty (M0)
        b += 1
    if b == n:
        return hi, b
    return min(first[b] + max(0, v - ref[b]), hi), b


@numba.njit(nogil=True, cache=True)
def events_bounding(ref, read, first, lo, hi, b_lo, ref_lo, ref_first, ref_last, bi, bj, rc, read_len, k, first_event,
                    search):  # fmt: skip
    """Events at the map's (`map_span`'s) first entries at or after `ref_first` and `ref_last`; ok False
    if unbounded.

    Bounded means both entries exist and the window start is covered: an entry exactly at
    `ref_first` or any entry before it. (The tools' right-bound test always holds once the
    entry exists.) Returns (ok, e1, e2, and the runs to look from for the next window's entries).
    """
    ai, bi = entry_at(ref, first, lo, hi, b_lo, ref_lo, ref_first, bi)
    aj, bj = entry_at(ref, first, lo, hi, b_lo, ref_lo, ref_last, max(bi, bj))
    if ai >= hi or aj >= hi or not (ai > lo or ref_first == ref_lo):
        return False, -1, -1, bi, bj
    return (True, base_event(read, first, bi, ai, rc, read_len, k, first_event, search),
            base_event(read, first, bj, aj, rc, read_len, k, first_event, search), bi, bj)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _next_event(first_event, start, stop, step):
    while start != stop:
        e = first_event[start]
        if e != -1:
            return e
        start += step
    return -1


@numba.njit(nogil=True, cache=True)
def closest_event(first_event, k_idx, search):
    """Event of the nearest k-mer with one, looking back first then forward (stop excluded)."""
    n = first_event.shape[0]
    before = _next_event(first_event, k_idx, max(0, k_idx - search), -1)
    if before != -1:
        return before
    return _next_event(first_event, k_idx, min(k_idx + search, n - 1), 1)
