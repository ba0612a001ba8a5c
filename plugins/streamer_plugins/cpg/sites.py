"""Motif sites of a read's reference span (CpG, GpC, dam, dcm), grouped into the windows the HMM scores.

A site is where a whole recognition sequence of the motif starts (`streamer.pore.motifs`; its
first base, whichever base is modified, as nanopolish reports it). Like nanopolish and f5c, which
fetch the reference up to the alignment's end inclusive, the base after the aligned span counts:
a site ending there joins the last group, whose window then runs past the read's events and is
dropped. Sites closer than
`min_separation` are scored together, because their k-mers overlap and
cannot be called apart. As in nanopolish and f5c, the same distance pads the window on both
sides and is the minimum distance from the alignment start; a group is dropped when it spans
more than `max_span` bases, when the read's event map does not bound its window, or when the
bounding events are no more than `min_event_span` apart. (The tools' further test of events
per reference base divides by a negative length and never rejects anything; it is not kept.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from streamer_plugins.cpg.hmm import site_at
from streamer_plugins.cpg.lookup import aligned_blocks, events_bounding, map_span

MIN_SEPARATION = 10
MAX_SPAN = 200
MIN_EVENT_SPAN = 10


def _disambiguation_table() -> np.ndarray:
    """ASCII -> base: IUPAC codes (either case) become their first possible base, as the tools do."""
    table = np.full(256, ord("A"), dtype=np.uint8)
    first_base = {
        "A": "A", "C": "C", "G": "G", "T": "T", "M": "A", "R": "A", "W": "A", "S": "C",
        "Y": "C", "K": "G", "V": "A", "H": "A", "D": "A", "B": "C", "N": "A",
    }  # fmt: skip
    for code, base in first_base.items():
        table[ord(code)] = table[ord(code.lower())] = ord(base)
    return table


DISAMBIGUATE = _disambiguation_table()


@numba.njit(nogil=True, cache=True)
def disambiguated(seq):
    """DISAMBIGUATE[seq] without the GIL, and a few times cheaper than numpy's fancy index."""
    out = np.empty(seq.shape[0], np.uint8)
    for i in range(seq.shape[0]):
        out[i] = DISAMBIGUATE[seq[i]]
    return out


@numba.njit(nogil=True, cache=True)
def motif_sites(ref, after, sites):
    """Where a site of the motif (`sites`: `Motif.table`) starts in `ref` followed by the base `after`
    (uint8 ASCII, disambiguated; 0: none)."""
    n = ref.shape[0] + (after != 0)
    seq = np.empty(n, np.uint8)
    seq[: ref.shape[0]] = ref
    if after != 0:
        seq[n - 1] = after
    out = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        if site_at(seq, 0, n, i, sites):
            out[m] = i
            m += 1
    return out[:m]


@dataclass(frozen=True)
class ReadSites:
    """Every read's motif sites, found before its events are (`batch_sites`): what the caller's plan needs of the
    batch's reference alone, so that a pipeline's front thread finds it while a compute thread runs the batch
    before. `ref` is the batch's reference disambiguated; read i's sites are `at[off[i]:off[i + 1]]`."""

    ref: np.ndarray
    ref_next: np.ndarray  # the base after each read's span, disambiguated (0: none)
    at: np.ndarray
    off: np.ndarray


def batch_sites(ref_seq: np.ndarray, ref_seq_off: np.ndarray, ref_next: np.ndarray, sites: np.ndarray) -> ReadSites:
    """`motif_sites` of every read of a batch (`sites`: `Motif.table`), whatever its status."""
    ref = disambiguated(ref_seq)
    after = np.where(ref_next != 0, DISAMBIGUATE[ref_next], 0).astype(np.uint8)
    at, off = _batch_sites(ref, ref_seq_off, after, sites)
    return ReadSites(ref, after, at, off)


@numba.njit(parallel=True, nogil=True, cache=True)
def _batch_sites(ref, ref_seq_off, after, sites):
    """Counted read by read, then found again into the batch's array (no per-read array outlives its read)."""
    n = after.shape[0]
    off = np.zeros(n + 1, np.int64)
    for i in numba.prange(n):
        off[i + 1] = motif_sites(ref[ref_seq_off[i] : ref_seq_off[i + 1]], after[i], sites).shape[0]
    for i in range(n):
        off[i + 1] += off[i]
    at = np.empty(off[n], np.int64)
    for i in numba.prange(n):
        at[off[i] : off[i + 1]] = motif_sites(ref[ref_seq_off[i] : ref_seq_off[i + 1]], after[i], sites)
    return at, off


def group_slots(span: np.ndarray, min_separation: int) -> np.ndarray:
    """The most groups a span of each length holds: the first sites of two groups are more than
    `min_separation` apart (`group_sites`). Sizes the planner's slots without finding the sites twice."""
    return np.where(span > 0, (span - 1) // (min_separation + 1) + 1, 0)


@numba.njit(nogil=True, cache=True)
def group_sites(sites, min_separation):
    """Split ascending sites into runs whose neighbours are at most `min_separation` apart.

    Returns (first, end) site indices per group, `end` exclusive.
    """
    first = np.empty(sites.shape[0], np.int64)
    end = np.empty(sites.shape[0], np.int64)
    n = 0
    i = 0
    while i < sites.shape[0]:
        j = i + 1
        while j < sites.shape[0] and sites[j] - sites[j - 1] <= min_separation:
            j += 1
        first[n] = i
        end[n] = j
        n += 1
        i = j
    return first[:n], end[:n]


@numba.njit(nogil=True, cache=True)
def read_windows(sites, cigar, ref_start, rc, read_len, k, first_event, search, min_separation, max_span,
                 min_event_span):  # fmt: skip
    """The groups of one read that get scored, in reference order.

    `sites` are the motif's sites in the read's aligned span starting at `ref_start` (`motif_sites`);
    the CIGAR, strand, read length and `first_event` (the read's first event per k-mer) make its
    event-to-reference map (`lookup.map_span`), which bounds each window. Returns per kept group the
    reference-span-local positions of its first and last site, its number of sites and the events
    bounding its window `[first - min_separation, last + min_separation]`.
    """
    ref, read, run_first, _ = aligned_blocks(cigar, ref_start)
    lo, hi, b_lo, ref_lo = map_span(ref, read, run_first, rc, read_len, k, first_event, search)
    g_first, g_end = group_sites(sites, min_separation)
    n = g_first.shape[0]
    first = np.empty(n, np.int64)
    last = np.empty(n, np.int64)
    n_sites = np.empty(n, np.int64)
    ev_first = np.empty(n, np.int64)
    ev_last = np.empty(n, np.int64)
    kept = 0
    bi = bj = b_lo  # the runs where the last window's entries were found: the next look from there on
    for g in range(n):
        s_first = sites[g_first[g]]
        s_last = sites[g_end[g] - 1]
        if s_first - min_separation <= min_separation or s_last - s_first > max_span:
            continue
        ok, e1, e2, bi, bj = events_bounding(
            ref, read, run_first, lo, hi, b_lo, ref_lo, ref_start + s_first - min_separation,
            ref_start + s_last + min_separation, bi, bj, rc, read_len, k, first_event, search,
        )  # fmt: skip
        if not ok or abs(e2 - e1) <= min_event_span or e1 < 0 or e2 < 0:
            continue
        first[kept] = s_first
        last[kept] = s_last
        n_sites[kept] = g_end[g] - g_first[g]
        ev_first[kept] = e1
        ev_last[kept] = e2
        kept += 1
    return first[:kept], last[:kept], n_sites[:kept], ev_first[:kept], ev_last[:kept]
