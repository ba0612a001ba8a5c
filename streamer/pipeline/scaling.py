"""Method-of-moments shift and scale of each read, the starting point of ABEA.

ABEA needs event levels and model levels on the same footing before it has an
alignment. Matching the first moment gives the shift and the ratio of second
moments gives the scale (no square root), exactly as f5c does, in double
precision and stored as float32; `var` stays 1 until recalibration.
"""

from __future__ import annotations

import numba
import numpy as np

from streamer.pore.model import NUC_CODE, NUCLEOTIDE, PoreModel, kmer_rank
from streamer.skips import Skip

# f5c ranks a letter outside ACGT as A (with a warning) instead of refusing the k-mer;
# the alignment stages use this table so that they score the same k-mers f5c does.
F5C_CODES = np.where(NUC_CODE < 0, 0, NUC_CODE).astype(np.int8)


@numba.njit(nogil=True, cache=True)
def read_kmer_ranks(seq, start, n_kmers, k, codes):
    """Ranks of the read's k-mers (seq[start:] ASCII), base 4 as in the nucleotide model."""
    ranks = np.empty(n_kmers, dtype=np.int32)
    for i in range(n_kmers):
        ranks[i] = kmer_rank(seq, start + i, k, codes, 4)
    return ranks


@numba.njit(nogil=True, cache=True)
def mom_read(seq, s0, n_kmers, ev_mean, e0, n_events, level_mean, k, codes):
    """(shift, scale) of one read in double precision, in f5c's order of summation."""
    event_sum = 0.0
    for i in range(n_events):
        event_sum += np.float64(ev_mean[e0 + i])
    kmer_sum = 0.0
    kmer_sq_sum = 0.0
    for i in range(n_kmers):
        level = np.float64(level_mean[kmer_rank(seq, s0 + i, k, codes, 4)])
        kmer_sum += level
        kmer_sq_sum += level * level
    shift = event_sum / n_events - kmer_sum / n_kmers
    event_sq_sum = 0.0
    for i in range(n_events):
        d = np.float64(ev_mean[e0 + i]) - shift
        event_sq_sum += d * d
    scale = (event_sq_sum / n_events) / (kmer_sq_sum / n_kmers)
    return shift, scale


@numba.njit(nogil=True, cache=True, parallel=True)
def mom_scalings(seq, seq_off, ev_mean, ev_off, status, level_mean, k, codes):
    """Per-read float32 (shift, scale, var=1) for reads whose status is 0.

    Reads without events are marked NO_EVENTS and reads shorter than k SHORT_READ
    (status updated in place); their shift/scale stay 0/1.
    """
    n = len(seq_off) - 1
    shift = np.zeros(n, dtype=np.float32)
    scale = np.ones(n, dtype=np.float32)
    var = np.ones(n, dtype=np.float32)
    for i in numba.prange(n):
        if status[i] != 0:
            continue
        n_events = ev_off[i + 1] - ev_off[i]
        n_kmers = seq_off[i + 1] - seq_off[i] - k + 1
        if n_events <= 0:
            status[i] = Skip.NO_EVENTS
            continue
        if n_kmers <= 0:
            status[i] = Skip.SHORT_READ
            continue
        s, c = mom_read(seq, seq_off[i], n_kmers, ev_mean, ev_off[i], n_events, level_mean, k, codes)
        shift[i] = np.float32(s)
        scale[i] = np.float32(c)
    return shift, scale, var


def require_dtype(name: str, array: np.ndarray, dtype) -> None:
    """Refuse arrays of another dtype: numba would compile a variant with different rounding."""
    if array.dtype != dtype:
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {array.dtype}")


def require_nucleotide(model: PoreModel) -> None:
    """The alignment stages rank k-mers in base 4: only an ACGT model fits."""
    if model.alphabet != NUCLEOTIDE:
        raise ValueError(f"model {model.name} has alphabet {model.alphabet}; alignment needs {NUCLEOTIDE}")


def estimate_scalings(seq, seq_off, ev_mean, ev_off, status, model: PoreModel):
    """Method-of-moments scalings of a batch with the nucleotide model (status updated in place).

    Returns float32 (shift, scale, var) with var = 1.
    """
    require_nucleotide(model)
    require_dtype("ev_mean", ev_mean, np.float32)
    require_dtype("status", status, np.int8)
    return mom_scalings(seq, seq_off, ev_mean, ev_off, status, model.level_mean, model.k, F5C_CODES)
