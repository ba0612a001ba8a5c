"""Slow reference for adaptive banded event alignment: the whole band matrix, one band at a time.

Written from the algorithm's description (Suzuki-Kasahara's adaptive band as f5c's align.c
applies it to events and k-mers), not from the kernels: every band of the read is kept, cells
are addressed by their (event, k-mer) coordinates, neighbours are looked up by coordinates in
the bands where they lie, and the traceback reads the kept matrix. The cells of a band depend
only on the two bands before it, so each band is one NumPy expression over its width.

The arithmetic is the tools' precision, so the kernels must equal it bit for bit: k-mer levels
scaled and emissions taken in float32, transition log probabilities in double, each move's
score formed in double and rounded once to float32, ties going up over diagonal and left over
both; the emission sum in double, from the last pair to the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

F32 = np.float32
F64 = np.float64
DIAG, UP, LEFT = 0, 1, 2  # the move into a cell: next k-mer and event, next event, next k-mer
BASES = str.maketrans("ACGT", "0123")


@dataclass
class Result:
    pairs: list[tuple[int, int]]  # (k-mer, event), ascending; empty when the read failed
    sum_emission: float  # over the traced pairs
    n_aligned: int  # pairs traced (0 when the traceback left the band)
    failed: bool  # the QC's verdict (or over-segmented)
    oversegmented: bool


def kmer_levels(seq: str, k: int, shift, scale, level_mean, level_stdv, level_log_stdv):
    """float32 (mean scaled to the read, stdv, log stdv) of each k-mer of seq."""
    ranks = np.array([int(seq[i : i + k].translate(BASES), 4) for i in range(len(seq) - k + 1)])
    mean = F32(scale) * level_mean[ranks].astype(F32) + F32(shift)
    return mean, level_stdv[ranks].astype(F32), level_log_stdv[ranks].astype(F32)


def log_emission(level, mean, stdv, log_stdv):
    """ln N(level; mean, stdv), float32, f5c's constant and order (vectorised)."""
    a = (F32(level) - mean) / stdv
    return (F32(-0.918938) - log_stdv) + (F32(-0.5) * a) * a


def align(seq: str, events: np.ndarray, shift: float, scale: float, model, k: int = 6, bandwidth: int = 100,
          trim_prob: float = 0.01, skip_prob: float = 1e-10, max_events_per_base: float = 15.0,
          min_avg_log_emission: float = -5.0, max_skip_run: int = 50) -> Result:  # fmt: skip
    """Align one read's events (float32 means) to its k-mers; `model` has level_mean/stdv/log_stdv."""
    events = np.asarray(events, F32)
    n_events, n_kmers, w = len(events), len(seq) - k + 1, bandwidth
    if F32(n_events) / F32(len(seq)) >= F32(max_events_per_base):
        return Result([], 0.0, 0, True, True)
    mean, stdv, log_stdv = kmer_levels(seq, k, shift, scale, model.level_mean, model.level_stdv,
                                       model.level_log_stdv)  # fmt: skip
    lp_skip = math.log(skip_prob)
    lp_stay = math.log(1.0 - 1.0 / (F64(n_events) / n_kmers + 1.0))
    lp_step = math.log(1.0 - math.exp(lp_skip) - math.exp(lp_stay))
    lp_trim = math.log(trim_prob)

    # band b holds the cells with (e + 1) + (kmer + 1) = b; cell o of band b is (ll_e[b] - o, ll_k[b] + o)
    n_bands = n_events + n_kmers + 2
    score = np.full((n_bands, w), -np.inf, F32)
    move = np.zeros((n_bands, w), np.uint8)
    ll_e = np.zeros(n_bands, np.int64)
    ll_k = np.zeros(n_bands, np.int64)
    o = np.arange(w)

    def lookup(b, e, kmer):
        """Scores of cells (e, kmer) in band b; -inf outside the band."""
        off = ll_e[b] - e
        inside = (off >= 0) & (off < w) & (ll_k[b] + off == kmer)
        return np.where(inside, score[b, np.clip(off, 0, w - 1)], F32(-np.inf))

    # the start (-1, -1) and the first event trimmed (0, -1), each in the middle of its band
    ll_e[0], ll_k[0] = w // 2 - 1, -1 - w // 2
    ll_e[1], ll_k[1] = w // 2, -1 - w // 2
    score[0, w // 2] = 0.0
    score[1, w // 2] = F32(lp_trim)
    move[1, w // 2] = UP
    for b in range(2, n_bands):
        first, last = score[b - 1, 0], score[b - 1, w - 1]
        if first == -np.inf and last == -np.inf:
            right = b % 2 == 1  # no information: alternate
        else:
            right = first < last  # towards the better end
        ll_e[b] = ll_e[b - 1] if right else ll_e[b - 1] + 1
        ll_k[b] = ll_k[b - 1] + 1 if right else ll_k[b - 1]
        e, kmer = ll_e[b] - o, ll_k[b] + o
        cell = (e >= 0) & (e < n_events) & (kmer >= 0) & (kmer < n_kmers)
        ki, ei = np.clip(kmer, 0, n_kmers - 1), np.clip(e, 0, n_events - 1)
        em = log_emission(events[ei], mean[ki], stdv[ki], log_stdv[ki]).astype(F64)
        d = (lookup(b - 2, e - 1, kmer - 1).astype(F64) + lp_step + em).astype(F32)
        u = (lookup(b - 1, e - 1, kmer).astype(F64) + lp_stay + em).astype(F32)
        lf = (lookup(b - 1, e, kmer - 1).astype(F64) + lp_skip).astype(F32)
        best = np.maximum(d, u)  # u wins ties with d
        best_move = np.where(u >= d, UP, DIAG)
        best_move = np.where(lf >= best, LEFT, best_move)  # left wins ties with both
        best = np.maximum(best, lf)
        score[b] = np.where(cell, best, F32(-np.inf))
        move[b] = np.where(cell, best_move, 0)
        trim = (kmer == -1) & (e >= 0) & (e < n_events)  # events before the first k-mer, trimmed
        score[b] = np.where(trim, (lp_trim * (e + 1).astype(F64)).astype(F32), score[b])
        move[b] = np.where(trim, UP, move[b])

    # the end: the last k-mer at the event that scores best with the events after it trimmed
    best_end, end_e = F32(-np.inf), 0
    for e in range(n_events):
        b = e + (n_kmers - 1) + 2
        s = lookup(b, np.array([e]), np.array([n_kmers - 1]))[0]
        s = F32(F64(s) + F64(n_events - e) * lp_trim)
        if s > best_end:  # the first best
            best_end, end_e = s, e

    pairs, total, gap, max_gap = [], 0.0, 0, 0
    e, kmer = end_e, n_kmers - 1
    while e >= 0 and kmer >= 0:
        b = e + kmer + 2
        off = ll_e[b] - e
        if not 0 <= off < w:
            return Result([], total, 0, True, False)
        pairs.append((kmer, e))
        total += F64(log_emission(events[e], mean[kmer], stdv[kmer], log_stdv[kmer]))
        m = move[b, off]
        e -= m in (DIAG, UP)
        kmer -= m in (DIAG, LEFT)
        gap = gap + 1 if m == LEFT else 0
        max_gap = max(max_gap, gap)
    pairs.reverse()
    spanned = pairs[0][0] == 0 and pairs[-1][0] == n_kmers - 1
    failed = total / len(pairs) < min_avg_log_emission or not spanned or max_gap > max_skip_run
    return Result([] if failed else pairs, total, len(pairs), failed, False)
