"""Adaptive banded event alignment (ABEA) on the CPU: events to the k-mers of the read.

The dynamic programme runs along anti-diagonal bands of fixed width; each band
moves right (next k-mer) or down (next event) after the previous band by
Suzuki-Kasahara's rule, so only `bandwidth` cells per band are ever scored.
Band b holds the cells with (e + 1) + (k + 1) = b, and the cell at offset o of
band b is (e, k) = (ll_e[b] - o, ll_k[b] + o) where (ll_e, ll_k) is the band's
lower-left corner; ll_k[b] = b - 2 - ll_e[b], so only ll_e is stored.

Arithmetic is f5c's (align.c) to the bit: emissions in float32, transition log
probabilities in double, each cell score formed in double and rounded to float32,
ties going up over diagonal and left over both. Scores live in a ring of three
bands (all a band needs); the traceback keeps one byte per cell. The per-cell
arithmetic, the band rule, the traceback and the QC are written once
(`streamer.pipeline.abea_cells`) and compiled both here and for CUDA (`streamer_gpu.kernels`),
which therefore agrees to the bit.

The kernels (`abea`, `align_read`) take a dozen or more flat arrays and scalars: numba compiles
no Python objects, so `align_batch` takes the batch record, the model and `AbeaParams` and
unpacks them once (`abea_arrays`, `model_arrays`, which the GPU stage uses too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from streamer.pipeline.abea_cells import FROM_U, abea_cells
from streamer.pore.model import PoreModel
from streamer.pipeline.scaling import F5C_CODES, read_kmer_ranks, require_dtype, require_nucleotide
from streamer.skips import Skip
from streamer.pipeline.targets import CPU

scaled_mean, log_emission, cell_score, moves_right, trimmed, with_trimmed, traceback, failed_qc = abea_cells(CPU)


@dataclass(frozen=True)
class AbeaParams:
    """ABEA's band and QC settings (f5c's defaults): a pore chemistry's, the same on CPU and GPU."""

    bandwidth: int = 100
    trim_prob: float = 0.01
    skip_prob: float = 1e-10
    max_events_per_base: float = 15.0
    min_avg_log_emission: float = -5.0
    max_skip_run: int = 50


@numba.njit(nogil=True, cache=True)
def transition_log_probs(n_events, n_kmers, skip_prob):
    """(lp_skip, lp_stay, lp_step) in double from the read's events per k-mer."""
    events_per_kmer = np.float64(n_events) / n_kmers
    p_stay = 1.0 - 1.0 / (events_per_kmer + 1.0)
    lp_skip = math.log(skip_prob)
    lp_stay = math.log(p_stay)
    lp_step = math.log(1.0 - math.exp(lp_skip) - math.exp(lp_stay))
    return lp_skip, lp_stay, lp_step


@numba.njit(nogil=True, cache=True, error_model="numpy")
def align_read(
    ranks,
    ev_mean,
    e0,
    n_events,
    shift,
    scale,
    level_mean,
    level_stdv,
    level_log_stdv,
    out_kmer,
    out_event,
    out0,
    bandwidth,
    trim_prob,
    skip_prob,
):
    """Align one read; write its pairs in ascending order at out[out0:].

    Returns (n_pairs, sum of log emissions, longest run of skips, whether the
    traceback stayed inside the band). n_pairs is 0 only if the traceback left the band.
    """
    n_kmers = len(ranks)
    w = bandwidth
    lp_skip, lp_stay, lp_step = transition_log_probs(n_events, n_kmers, skip_prob)
    lp_trim = math.log(trim_prob)
    n_bands = n_events + n_kmers + 2
    ninf = np.float32(-np.inf)

    # per k-mer of the read: its model level scaled to this read, stdv and log stdv
    k_mean = np.empty(n_kmers, dtype=np.float32)
    k_stdv = np.empty(n_kmers, dtype=np.float32)
    k_log = np.empty(n_kmers, dtype=np.float32)
    for kk in range(n_kmers):
        r = ranks[kk]
        k_mean[kk] = scaled_mean(scale, level_mean[r], shift)
        k_stdv[kk] = level_stdv[r]
        k_log[kk] = level_log_stdv[r]

    ev_rev = ev_mean[e0 : e0 + n_events][::-1].copy()  # the read's events, last first

    # three bands of scores, each padded by a -inf cell at both ends so that the
    # neighbours of any cell (offsets o-1..o+1 in the previous two bands) need no bounds test
    row = w + 2
    ll_e = np.empty(n_bands, dtype=np.int64)
    trace = np.empty(n_bands * w, dtype=np.uint8)
    ring = np.full(3 * row, ninf, dtype=np.float32)

    half = w // 2
    ll_e[0] = half - 1
    ll_e[1] = half
    # band 0 holds only the start cell (-1, -1); band 1 the first trimmed event (0, -1)
    ring[0 * row + 1 + half] = np.float32(0.0)
    ring[1 * row + 1 + half] = np.float32(lp_trim)
    trace[1 * w + half] = FROM_U

    best_end = ninf
    end_event = 0
    last_k = n_kmers - 1
    for b in range(2, n_bands):
        cur = (b % 3) * row + 1
        prev = ((b - 1) % 3) * row + 1
        prev2 = ((b - 2) % 3) * row + 1
        ll_e[b] = ll_e[b - 1] if moves_right(ring[prev], ring[prev + w - 1], b) else ll_e[b - 1] + 1
        lle = ll_e[b]
        llk = b - 2 - lle
        # offsets of the up, left and diagonal neighbours relative to o: each in -1..1
        d_up = ll_e[b - 1] - lle + 1
        d_left = llk - ((b - 1) - 2 - ll_e[b - 1]) - 1
        d_diag = llk - ((b - 2) - 2 - ll_e[b - 2]) - 1
        for o in range(w):
            ring[cur + o] = ninf

        trim_o = -1 - llk
        if 0 <= trim_o < w:
            e = lle - trim_o
            if 0 <= e < n_events:
                ring[cur + trim_o] = trimmed(lp_trim, e + 1)
                trace[b * w + trim_o] = FROM_U

        lo = max(max(-llk, lle - (n_events - 1)), 0)
        hi = min(min(n_kmers - llk, lle + 1), w)
        # the band's cells o = lo..hi-1 through unsigned offsets (never negative: no wraparound test),
        # so that the compiler runs them in SIMD lanes; events in ascending order from the reversed copy
        cells = np.uint64(max(hi - lo, 0))
        at_cur, at_trace = np.uint64(cur + lo), np.uint64(b * w + lo)
        at_diag, at_up, at_left = np.uint64(prev2 + lo + d_diag), np.uint64(prev + lo + d_up), np.uint64(prev + lo + d_left)
        at_ev, at_k = np.uint64(n_events - 1 - lle + lo), np.uint64(llk + lo)
        for j in range(cells):
            kk = at_k + j
            em = log_emission(ev_rev[at_ev + j], k_mean[kk], k_stdv[kk], k_log[kk])
            score, move = cell_score(ring[at_diag + j], ring[at_up + j], ring[at_left + j], em, lp_step, lp_stay,
                                     lp_skip)  # fmt: skip
            ring[at_cur + j] = score
            trace[at_trace + j] = move

        # candidate end cell (e, last k-mer) with the remaining events trimmed; bands
        # come in ascending event order, so the first best is kept as in f5c
        o_end = last_k - llk
        if 0 <= o_end < w:
            e = lle - o_end
            if 0 <= e < n_events:
                s = with_trimmed(ring[cur + o_end], n_events - e, lp_trim)
                if s > best_end:
                    best_end = s
                    end_event = e

    n, sum_emission, max_gap, inside = traceback(
        trace, ll_e, 0, w, ev_mean, e0, k_mean, k_stdv, k_log, 0, end_event, last_k, out_kmer, out_event, out0
    )
    if not inside:
        return 0, sum_emission, max_gap, False
    i = out0
    j = out0 + n - 1
    while i < j:
        out_kmer[i], out_kmer[j] = out_kmer[j], out_kmer[i]
        out_event[i], out_event[j] = out_event[j], out_event[i]
        i += 1
        j -= 1
    return n, sum_emission, max_gap, True


@numba.njit(nogil=True, cache=True, parallel=True)
def abea(
    seq,
    seq_off,
    ev_mean,
    ev_off,
    status,
    shift,
    scale,
    level_mean,
    level_stdv,
    level_log_stdv,
    k,
    codes,
    bandwidth=100,
    trim_prob=0.01,
    skip_prob=1e-10,
    max_events_per_base=15.0,
    min_avg_log_emission=-5.0,
    max_skip_run=50,
):
    """Align every read with status 0; returns (aln_off, aln_kmer, aln_event, sum_emission, n_aligned).

    status is updated in place: OVERSEGMENTED when float32(events) / float32(bases)
    >= max_events_per_base (read not aligned); ALIGNMENT_FAILED when the average log
    emission is below min_avg_log_emission, the pairs do not span the first and
    last k-mer, the longest run of skipped k-mers exceeds max_skip_run, or the
    traceback leaves the band (where f5c would read outside its matrix). Failed
    reads keep no pairs but do keep their emission statistics (sum_emission
    float64, n_aligned int64 = pairs traced).
    """
    n = len(seq_off) - 1
    cap_off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        n_kmers = max(seq_off[i + 1] - seq_off[i] - k + 1, 0)
        cap_off[i + 1] = cap_off[i] + (ev_off[i + 1] - ev_off[i]) + n_kmers
    cap_kmer = np.empty(cap_off[n], dtype=np.int32)
    cap_event = np.empty(cap_off[n], dtype=np.int32)
    counts = np.zeros(n, dtype=np.int64)
    sum_emission = np.zeros(n, dtype=np.float64)
    n_aligned = np.zeros(n, dtype=np.int64)

    for i in numba.prange(n):
        if status[i] != 0:
            continue
        read_len = seq_off[i + 1] - seq_off[i]
        n_events = ev_off[i + 1] - ev_off[i]
        n_kmers = read_len - k + 1
        if n_events <= 0 or n_kmers <= 0:
            status[i] = Skip.ALIGNMENT_FAILED
            continue
        if np.float32(n_events) / np.float32(read_len) >= np.float32(max_events_per_base):
            status[i] = Skip.OVERSEGMENTED
            continue
        ranks = read_kmer_ranks(seq, seq_off[i], n_kmers, k, codes)
        m, s, max_gap, inside = align_read(
            ranks,
            ev_mean,
            ev_off[i],
            n_events,
            shift[i],
            scale[i],
            level_mean,
            level_stdv,
            level_log_stdv,
            cap_kmer,
            cap_event,
            cap_off[i],
            bandwidth,
            trim_prob,
            skip_prob,
        )
        sum_emission[i] = s
        n_aligned[i] = m
        c0 = cap_off[i]
        first = last = -1
        if inside:  # ascending: the pair of the first k-mer leads
            first = cap_kmer[c0]
            last = cap_kmer[c0 + m - 1]
        if failed_qc(m, s, max_gap, inside, first, last, n_kmers, min_avg_log_emission, max_skip_run):
            status[i] = Skip.ALIGNMENT_FAILED
            continue
        counts[i] = m

    aln_off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        aln_off[i + 1] = aln_off[i] + counts[i]
    aln_kmer = np.empty(aln_off[n], dtype=np.int32)
    aln_event = np.empty(aln_off[n], dtype=np.int32)
    for i in numba.prange(n):
        c0 = cap_off[i]
        a0 = aln_off[i]
        for j in range(counts[i]):
            aln_kmer[a0 + j] = cap_kmer[c0 + j]
            aln_event[a0 + j] = cap_event[c0 + j]
    return aln_off, aln_kmer, aln_event, sum_emission, n_aligned


class Alignment(NamedTuple):
    """ABEA output of a batch: pairs per read (flat, ascending) and the emission statistic."""

    aln_off: np.ndarray  # int64[n + 1]
    aln_kmer: np.ndarray  # int32: k-mer index in the read as sequenced
    aln_event: np.ndarray  # int32: event index in the read
    sum_emission: np.ndarray  # float64[n]: sum of log emissions over the traced pairs
    n_aligned: np.ndarray  # int64[n]: pairs traced (before the QC that may drop them)

    @property
    def avg_log_emission(self) -> np.ndarray:
        """f5c's adaptive-alignment QC statistic (nan for reads never aligned)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.sum_emission / self.n_aligned


class AbeaReads(NamedTuple):
    """What ABEA reads of a batch, by `ReadBatch`'s field names (a `ReadBatch` is passed as it is; this
    record is for callers holding the arrays alone)."""

    seq: np.ndarray
    seq_off: np.ndarray
    ev_mean: np.ndarray
    ev_off: np.ndarray
    status: np.ndarray
    shift: np.ndarray
    scale: np.ndarray


def abea_arrays(reads) -> AbeaReads:
    """The arrays of `AbeaReads`'s fields from a batch, checked for the dtypes the kernels take."""
    for name in ("ev_mean", "shift", "scale"):
        require_dtype(name, getattr(reads, name), np.float32)
    require_dtype("status", reads.status, np.int8)
    return AbeaReads(*(getattr(reads, name) for name in AbeaReads._fields))


def model_arrays(model: PoreModel, params: AbeaParams) -> tuple:
    """The kernels' arguments after the reads' arrays: the model's levels, k, the codes, the settings."""
    return (model.level_mean, model.level_stdv, model.level_log_stdv, model.k, F5C_CODES, params.bandwidth,
            params.trim_prob, params.skip_prob, params.max_events_per_base, params.min_avg_log_emission,
            params.max_skip_run)  # fmt: skip


def align_batch(reads, model: PoreModel, params: AbeaParams = AbeaParams()) -> Alignment:
    """ABEA over a batch (a `ReadBatch` or `AbeaReads`) with the nucleotide model (status updated in place)."""
    require_nucleotide(model)
    return Alignment(*abea(*abea_arrays(reads), *model_arrays(model, params)))
