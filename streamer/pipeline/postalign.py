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

The kernel `postalign` takes its eighteen flat arrays and scalars because numba compiles no
Python objects; `recalibrate_batch` takes the batch record and `PostalignParams` and unpacks them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from streamer.pore.model import PoreModel
from streamer.pipeline.scaling import F5C_CODES, read_kmer_ranks, require_dtype, require_nucleotide
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

    Returns events per base, (max event - min event) / n_kmers.
    """
    for j in range(n_kmers):
        b2e_start[m0 + j] = -1
        b2e_stop[m0 + j] = -1
    max_event = 0
    min_event = np.iinfo(np.int32).max
    prev = -1
    for j in range(a0, a1):
        kk = aln_kmer[j]
        e = aln_event[j]
        if e != prev:
            if b2e_start[m0 + kk] == -1:
                b2e_start[m0 + kk] = e
            b2e_stop[m0 + kk] = e
        max_event = max(max_event, e)
        min_event = min(min_event, e)
        prev = e
    return np.float64(max_event - min_event) / n_kmers


@numba.njit(nogil=True, cache=True)
def _m_events(ranks, b2e_start, b2e_stop, m0):
    """(rank, event) of the read's M events, k-mer by k-mer as f5c visits them: an event counts
    where the k-mer's rank differs from the one before."""
    n = 0
    for j in range(len(ranks)):
        if b2e_start[m0 + j] != -1:
            n += b2e_stop[m0 + j] - b2e_start[m0 + j] + 1
    rank = np.empty(n, np.int64)
    event = np.empty(n, np.int64)
    m = 0
    prev_rank = -1
    for j in range(len(ranks)):
        start = b2e_start[m0 + j]
        if start == -1:
            continue
        r = ranks[j]
        for e in range(start, b2e_stop[m0 + j] + 1):
            if r != prev_rank:
                rank[m] = r
                event[m] = e
                m += 1
            prev_rank = r
    return rank[:m], event[:m]


@numba.njit(nogil=True, cache=True)
def recalibrate_read(ranks, b2e_start, b2e_stop, m0, ev_mean, e0, level_mean, level_stdv, min_events):
    """Weighted least-squares (shift, scale, var) over the read's M events, in double.

    Returns (recalibrated, shift, scale, var); not recalibrated when fewer than
    min_events M events. Events are visited k-mer by k-mer, as f5c orders them.
    """
    rank, event = _m_events(ranks, b2e_start, b2e_stop, m0)
    n_m = len(rank)
    a00 = 0.0
    a01 = 0.0
    a11 = 0.0
    b0 = 0.0
    b1 = 0.0
    for i in range(n_m):
        mu = np.float64(level_mean[rank[i]])
        sd = np.float64(level_stdv[rank[i]])
        x = np.float64(ev_mean[e0 + event[i]])
        inv_var = 1.0 / (sd * sd)
        a00 += inv_var
        a01 += mu * inv_var
        a11 += mu * mu * inv_var
        b0 += x * inv_var
        b1 += mu * x * inv_var
    if n_m < min_events:
        return False, 0.0, 0.0, 0.0
    a10 = a01
    div = a00 * a11 - a01 * a10
    shift = -(a01 * b1 - a11 * b0) / div
    scale = (a00 * b1 - a10 * b0) / div

    var = 0.0
    for i in range(n_m):
        mu = np.float64(level_mean[rank[i]])
        sd = np.float64(level_stdv[rank[i]])
        y = np.float64(ev_mean[e0 + event[i]]) - shift - scale * mu
        var += y * y / (sd * sd)
    var = np.sqrt(var / n_m)
    return True, shift, scale, var


@numba.njit(nogil=True, cache=True, parallel=True)
def postalign(
    seq,
    seq_off,
    ev_mean,
    ev_off,
    aln_kmer,
    aln_event,
    aln_off,
    status,
    shift,
    scale,
    var,
    level_mean,
    level_stdv,
    k,
    codes,
    min_events=200,
    max_var=2.5,
    max_events_per_base=5.0,
):
    """Map, recalibrate and QC every read with status 0 (status updated in place).

    Returns (shift, scale, var) float32 copies with recalibrated values written, the
    recalibrated values as computed (float64[n, 3], NaN where not recalibrated),
    events_per_base float64[n] (0 for reads not aligned), and the base-to-event
    map b2e_start, b2e_stop int32 with offsets kmer_off int64[n + 1] (-1 for
    k-mers without events and for reads not aligned).
    """
    n = len(seq_off) - 1
    new_shift = shift.astype(np.float32)
    new_scale = scale.astype(np.float32)
    new_var = var.astype(np.float32)
    exact = np.full((n, 3), np.nan)
    events_per_base = np.zeros(n, dtype=np.float64)
    kmer_off = kmer_offsets(seq_off, k)
    b2e_start = np.full(kmer_off[n], -1, dtype=np.int32)
    b2e_stop = np.full(kmer_off[n], -1, dtype=np.int32)
    for i in numba.prange(n):
        if status[i] != 0:
            continue
        n_kmers = kmer_off[i + 1] - kmer_off[i]
        if aln_off[i + 1] == aln_off[i] or n_kmers == 0:
            status[i] = Skip.ALIGNMENT_FAILED
            continue
        epb = base_to_event_map(
            aln_kmer, aln_event, aln_off[i], aln_off[i + 1], b2e_start, b2e_stop, kmer_off[i], n_kmers
        )
        events_per_base[i] = epb
        ranks = read_kmer_ranks(seq, seq_off[i], n_kmers, k, codes)
        ok, s, c, v = recalibrate_read(
            ranks, b2e_start, b2e_stop, kmer_off[i], ev_mean, ev_off[i], level_mean, level_stdv, min_events
        )
        if not ok:
            status[i] = Skip.RECALIBRATION_FAILED
            continue
        new_shift[i] = np.float32(s)
        new_scale[i] = np.float32(c)
        new_var[i] = np.float32(v)
        exact[i, 0] = s
        exact[i, 1] = c
        exact[i, 2] = v
        if new_var[i] > max_var:
            status[i] = Skip.RECALIBRATION_FAILED
            continue
        if epb > max_events_per_base:
            status[i] = Skip.QC_FAILED
    return new_shift, new_scale, new_var, exact, events_per_base, b2e_start, b2e_stop, kmer_off


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
    (status updated in place)."""
    require_nucleotide(model)
    require_dtype("ev_mean", reads.ev_mean, np.float32)
    require_dtype("status", reads.status, np.int8)
    arrays = (getattr(reads, name) for name in PostalignReads._fields)
    return PostAlign(*postalign(*arrays, model.level_mean, model.level_stdv, model.k, F5C_CODES, params.min_events,
                                params.max_var, params.max_events_per_base))  # fmt: skip
