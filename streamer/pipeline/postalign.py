"""After ABEA: the k-mer-to-event map, recalibrated scalings and the read QC.

The event-to-k-mer pairs are folded into a base-to-event map (for each k-mer of
the read, the first and last event aligned to it, -1 if none), which is what
the methylation stage walks. Events that start a new k-mer state (the k-mer
rank differs from the previous event's; f5c's state 'M') then fit shift and
scale by weighted least squares against the model, weight 1/stdv^2, and var is
the RMS of the standardised residuals; all in double, stored as float32.

QC, in f5c's order (each later check only for reads that passed the earlier):
RECALIBRATION_FAILED when fewer than `min_events` M events or var > `max_var`
(the recalibrated values are still written, as f5c does); QC_FAILED when
events per base > `max_events_per_base`.

Events per base (float64 per read) = (last aligned event - first aligned event)
/ number of k-mers: the span of aligned events, not the event count. The
methylation HMM takes its stay probability from it (1 - 1/events_per_base).

The kernel `postalign` takes flat arrays and scalars, its outputs among them, because numba compiles
no Python objects; `recalibrate_batch` takes the batch record and `PostalignParams`, unpacks them once
and allocates the outputs with numpy (huge pages, where the kernel's own would fault in 4 KiB ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from streamer.pore.model import PoreModel
from streamer.pipeline.scaling import F5C_CODES, require_dtype, require_nucleotide
from streamer.skips import Skip


@dataclass(frozen=True)
class PostalignParams:
    """The recalibration's QC thresholds (f5c's defaults), a pore chemistry's."""

    min_events: int = 200
    max_var: float = 2.5
    max_events_per_base: float = 5.0


@numba.njit(nogil=True, cache=True)
def kmer_offsets(seq_off, k):
    """Offsets of per-k-mer arrays: read i owns max(len_i - k + 1, 0) entries."""
    n = len(seq_off) - 1
    off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        off[i + 1] = off[i] + max(seq_off[i + 1] - seq_off[i] - k + 1, 0)
    return off


@numba.njit(nogil=True, cache=True)
def base_to_event_map(aln_kmer, aln_event, a0, a1, b2e_start, b2e_stop, m0, n_kmers):
    """Fill one read's map from its pairs (an event counts only for the first k-mer it pairs with).

    Returns events per base, (max event - min event) / n_kmers. Whether a k-mer has its first event yet
    is a select, not a branch: half the pairs start a k-mer, so a branch there is mispredicted every other pair.
    """
    b2e_start[m0 : m0 + n_kmers] = -1
    b2e_stop[m0 : m0 + n_kmers] = -1
    max_event = 0
    min_event = np.iinfo(np.int32).max
    prev = -1
    for j in range(a0, a1):
        e = aln_event[j]
        if e != prev:
            at = m0 + aln_kmer[j]
            first = b2e_start[at]
            b2e_start[at] = e if first == -1 else first
            b2e_stop[at] = e
        max_event = max(max_event, e)
        min_event = min(min_event, e)
        prev = e
    return np.float64(max_event - min_event) / n_kmers


@numba.njit(nogil=True, cache=True)
def m_events(seq, s0, k, codes, b2e_start, m0, n_kmers, m_rank, m_event):
    """The read's M events, k-mer by k-mer as f5c visits them: the first event of each k-mer with events
    whose rank differs from the last such k-mer's, into m_rank and m_event from m0. Returns their count.

    The ranks roll along the read (a base in, one out), as `kmer_rank` would give them: -1 for a k-mer
    with a letter outside the alphabet.
    """
    if n_kmers <= 0:  # a read shorter than k: nothing to roll over
        return 0
    mask = (1 << (2 * k)) - 1
    r = 0
    bad = -1  # the last position of a letter outside the alphabet
    for i in range(k - 1):
        c = codes[seq[s0 + i]]
        if c < 0:
            bad, c = i, 0
        r = ((r << 2) | c) & mask
    prev_rank = -1
    n_m = 0
    for j in range(n_kmers):
        c = codes[seq[s0 + j + k - 1]]
        if c < 0:
            bad, c = j + k - 1, 0
        r = ((r << 2) | c) & mask
        e = b2e_start[m0 + j]
        if e == -1:
            continue
        rank = r if bad < j else -1
        if rank != prev_rank:
            m_rank[m0 + n_m] = rank
            m_event[m0 + n_m] = e
            n_m += 1
            prev_rank = rank
    return n_m


@numba.njit(nogil=True, cache=True)
def recalibrate_read(m_rank, m_event, m0, n_m, ev_mean, e0, level_mean, level_stdv):
    """Weighted least-squares (shift, scale, var) over the read's n_m M events, in double, in their order."""
    a00 = 0.0
    a01 = 0.0
    a11 = 0.0
    b0 = 0.0
    b1 = 0.0
    for i in range(m0, m0 + n_m):
        mu = np.float64(level_mean[m_rank[i]])
        sd = np.float64(level_stdv[m_rank[i]])
        x = np.float64(ev_mean[e0 + m_event[i]])
        inv_var = 1.0 / (sd * sd)
        a00 += inv_var
        a01 += mu * inv_var
        a11 += mu * mu * inv_var
        b0 += x * inv_var
        b1 += mu * x * inv_var
    a10 = a01
    div = a00 * a11 - a01 * a10
    shift = -(a01 * b1 - a11 * b0) / div
    scale = (a00 * b1 - a10 * b0) / div

    var = 0.0
    for i in range(m0, m0 + n_m):
        mu = np.float64(level_mean[m_rank[i]])
        sd = np.float64(level_stdv[m_rank[i]])
        y = np.float64(ev_mean[e0 + m_event[i]]) - shift - scale * mu
        var += y * y / (sd * sd)
    return shift, scale, np.sqrt(var / n_m)


@numba.njit(nogil=True, cache=True, parallel=True)
def postalign(seq, seq_off, ev_mean, ev_off, aln_kmer, aln_event, aln_off, status, shift, scale, var, level_mean,
              level_stdv, k, codes, min_events, max_var, max_events_per_base, kmer_off, out, exact, events_per_base,
              b2e_start, b2e_stop, m_rank, m_event):  # fmt: skip
    """Map, recalibrate and QC every read with status 0 (status updated in place), into the arrays given.

    out[0:3] are (shift, scale, var) as float32, recalibrated where that succeeded; exact the recalibrated
    values as computed (NaN where not); events_per_base (max - min aligned event) / k-mers (0 for reads not
    aligned); b2e_start and b2e_stop the base-to-event map by kmer_off (-1 for k-mers without events and for
    reads not aligned). m_rank and m_event are scratch by kmer_off.
    """
    for i in numba.prange(len(seq_off) - 1):  # each read writes its own entries, whatever befalls it
        out[0, i] = np.float32(shift[i])
        out[1, i] = np.float32(scale[i])
        out[2, i] = np.float32(var[i])
        exact[i, :] = np.nan
        events_per_base[i] = 0.0
        m0 = kmer_off[i]
        n_kmers = kmer_off[i + 1] - m0
        a0, a1 = aln_off[i], aln_off[i + 1]
        if status[i] != 0 or a1 == a0 or n_kmers == 0:
            b2e_start[m0 : m0 + n_kmers] = -1
            b2e_stop[m0 : m0 + n_kmers] = -1
            if status[i] == 0:
                status[i] = Skip.ALIGNMENT_FAILED
            continue
        epb = base_to_event_map(aln_kmer, aln_event, a0, a1, b2e_start, b2e_stop, m0, n_kmers)
        n_m = m_events(seq, seq_off[i], k, codes, b2e_start, m0, n_kmers, m_rank, m_event)
        events_per_base[i] = epb
        if n_m < min_events:
            status[i] = Skip.RECALIBRATION_FAILED
            continue
        s, c, v = recalibrate_read(m_rank, m_event, m0, n_m, ev_mean, ev_off[i], level_mean, level_stdv)
        out[0, i] = np.float32(s)
        out[1, i] = np.float32(c)
        out[2, i] = np.float32(v)
        exact[i, 0] = s
        exact[i, 1] = c
        exact[i, 2] = v
        if out[2, i] > max_var:
            status[i] = Skip.RECALIBRATION_FAILED
            continue
        if epb > max_events_per_base:
            status[i] = Skip.QC_FAILED


class EventMap(NamedTuple):
    """Each read's first event per k-mer and its events per base: what the methylation stage places
    events on the reference with."""

    b2e_start: np.ndarray  # int32, per k-mer of each read: first event, -1 if none
    kmer_off: np.ndarray  # int64[n + 1]: read i owns b2e_start[kmer_off[i]:kmer_off[i + 1]]
    events_per_base: np.ndarray  # float64[n]: aligned event span / k-mers (HMM p_stay), 0 without pairs


@numba.njit(nogil=True, cache=True, parallel=True)
def _event_maps(aln_kmer, aln_event, aln_off, kmer_off, b2e_start, b2e_stop, events_per_base):
    for i in numba.prange(len(kmer_off) - 1):
        m0 = kmer_off[i]
        n_kmers = kmer_off[i + 1] - m0
        if aln_off[i + 1] == aln_off[i] or n_kmers == 0:
            b2e_start[m0 : m0 + n_kmers] = -1
            events_per_base[i] = 0.0
        else:
            events_per_base[i] = base_to_event_map(aln_kmer, aln_event, aln_off[i], aln_off[i + 1], b2e_start,
                                                   b2e_stop, m0, n_kmers)  # fmt: skip


def event_map(seq_off: np.ndarray, aln_kmer: np.ndarray, aln_event: np.ndarray, aln_off: np.ndarray,
              k: int) -> EventMap:  # fmt: skip
    """The map of every read with pairs, whatever its status, for a batch that was not recalibrated (the
    recalibration's is `PostAlign.event_map`)."""
    kmer_off = kmer_offsets(seq_off, k)
    b2e_start, b2e_stop = np.empty(kmer_off[-1], np.int32), np.empty(kmer_off[-1], np.int32)
    events_per_base = np.empty(len(seq_off) - 1)
    _event_maps(aln_kmer, aln_event, aln_off, kmer_off, b2e_start, b2e_stop, events_per_base)
    return EventMap(b2e_start, kmer_off, events_per_base)


class PostAlign(NamedTuple):
    """Recalibrated scalings and what the methylation stage needs from the alignment."""

    shift: np.ndarray  # float32[n]
    scale: np.ndarray  # float32[n]
    var: np.ndarray  # float32[n]
    exact: np.ndarray  # float64[n, 3]: shift, scale, var before rounding (f5c takes log var from var's double)
    events_per_base: np.ndarray  # float64[n]: aligned event span / k-mers (HMM p_stay)
    b2e_start: np.ndarray  # int32, per k-mer of each read: first event, -1 if none
    b2e_stop: np.ndarray  # int32, per k-mer of each read: last event (inclusive), -1 if none
    kmer_off: np.ndarray  # int64[n + 1]: read i owns b2e_*[kmer_off[i]:kmer_off[i + 1]]

    @property
    def event_map(self) -> EventMap:
        return EventMap(self.b2e_start, self.kmer_off, self.events_per_base)


class PostalignReads(NamedTuple):
    """What the recalibration reads of a batch, by `ReadBatch`'s field names (a `ReadBatch` is passed as it
    is; this record is for callers holding the arrays alone)."""

    seq: np.ndarray
    seq_off: np.ndarray
    ev_mean: np.ndarray
    ev_off: np.ndarray
    aln_kmer: np.ndarray
    aln_event: np.ndarray
    aln_off: np.ndarray
    status: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    var: np.ndarray


def recalibrate_batch(reads, model: PoreModel, params: PostalignParams = PostalignParams()) -> PostAlign:
    """Post-alignment stage over a batch (a `ReadBatch` or `PostalignReads`) with the nucleotide model
    (status updated in place). Its arrays are numpy's, which asks the kernel for huge pages."""
    require_nucleotide(model)
    require_dtype("ev_mean", reads.ev_mean, np.float32)
    require_dtype("status", reads.status, np.int8)
    n = len(reads.seq_off) - 1
    kmer_off = kmer_offsets(reads.seq_off, model.k)
    out, exact, events_per_base = np.empty((3, n), np.float32), np.empty((n, 3)), np.empty(n)
    b2e_start, b2e_stop, m_rank, m_event = (np.empty(kmer_off[-1], np.int32) for _ in range(4))
    postalign(*(getattr(reads, name) for name in PostalignReads._fields), model.level_mean, model.level_stdv, model.k,
              F5C_CODES, params.min_events, params.max_var, params.max_events_per_base, kmer_off, out, exact,
              events_per_base, b2e_start, b2e_stop, m_rank, m_event)  # fmt: skip
    return PostAlign(out[0], out[1], out[2], exact, events_per_base, b2e_start, b2e_stop, kmer_off)
