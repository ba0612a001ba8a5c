"""From event-to-k-mer (ABEA) and read-to-reference (CIGAR) to event-to-reference.

The HMM scores a reference window against the events of the read that cover it. Those events
are found as nanopolish and f5c find them: walk the CIGAR to get (reference, read) base pairs,
turn each read position into a k-mer index on the sequenced strand, and take the closest event
aligned to a k-mer at or before it (searching up to `search` k-mers each way). The quirks of
that search (the k-mer at the search limit is never examined) are kept, because they decide
which events bound a window.
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
    """(reference, read) position of every M/=/X base and the segment of each: N starts a new one.

    Read positions count soft clips and insertions, not hard clips, as in the BAM's SEQ.
    """
    n = 0
    for i in range(cigar.shape[0]):
        if cigar[i, 0] == CIGAR_M or cigar[i, 0] == CIGAR_EQ or cigar[i, 0] == CIGAR_X:
            n += cigar[i, 1]
    ref_pos = np.empty(n, np.int64)
    read_pos = np.empty(n, np.int64)
    seg_off = [0]
    r = ref_start
    q = 0
    j = 0
    for i in range(cigar.shape[0]):
        op = cigar[i, 0]
        length = cigar[i, 1]
        if op == CIGAR_M or op == CIGAR_EQ or op == CIGAR_X:
            for _ in range(length):
                ref_pos[j] = r
                read_pos[j] = q
                j += 1
                r += 1
                q += 1
        elif op == CIGAR_D:
            r += length
        elif op == CIGAR_N:
            seg_off.append(j)
            r += length
        elif op == CIGAR_I or op == CIGAR_S:
            q += length
    seg_off.append(n)
    return ref_pos, read_pos, np.array(seg_off, np.int64)


@numba.njit(nogil=True, cache=True)
def aligned_pairs(cigar, ref_start):
    """(reference position, read position) of every M/=/X base, in CIGAR order (see `aligned_segments`)."""
    ref_pos, read_pos, _ = aligned_segments(cigar, ref_start)
    return ref_pos, read_pos


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


@numba.njit(nogil=True, cache=True)
def event_reference_map(cigar, ref_start, rc, read_len, k, first_event, search):
    """(reference position, event index) pairs for the read's aligned bases, reference order.

    Bases within k of either read end are left out; a map whose first and last events are the
    same is degenerate and comes back empty. `first_event` is the read's first event per k-mer
    (`streamer.pipeline.postalign.EventMap`).
    """
    ref_pos, read_pos = aligned_pairs(cigar, ref_start)
    out_ref = np.empty(ref_pos.shape[0], np.int64)
    out_event = np.empty(ref_pos.shape[0], np.int64)
    n = 0
    for i in range(ref_pos.shape[0]):
        q = read_pos[i]
        if q < k or q + k >= read_len:
            continue
        k_idx = read_len - q - k if rc else q
        out_ref[n] = ref_pos[i]
        out_event[n] = closest_event(first_event, k_idx, search)
        n += 1
    if n > 0 and out_event[0] == out_event[n - 1]:
        n = 0
    return out_ref[:n], out_event[:n]


@numba.njit(nogil=True, cache=True)
def _at_or_after(map_ref, v, i):
    """The first entry from i on whose reference position is at or after v (the entries ascend)."""
    n = map_ref.shape[0]
    while i < n and map_ref[i] < v:
        i += 1
    return i


@numba.njit(nogil=True, cache=True)
def events_bounding(map_ref, map_event, ref_first, ref_last, i=0, j=0):
    """Events at the first map entries at or after `ref_first` and `ref_last`; ok False if unbounded.

    Bounded means both entries exist and the window start is covered: an entry exactly at
    `ref_first` or any entry before it. (The tools' right-bound test always holds once the
    entry exists.) The entries are looked for from i and j on: a read's windows ask in ascending
    order, each from where the one before ended (the last two values returned), so that a read's
    windows walk its map once.
    """
    n = map_ref.shape[0]
    i = _at_or_after(map_ref, ref_first, i)
    j = _at_or_after(map_ref, ref_last, max(i, j))
    if i == n or j == n or not (map_ref[i] == ref_first or i > 0):
        return False, -1, -1, i, j
    return True, map_event[i], map_event[j], i, j
