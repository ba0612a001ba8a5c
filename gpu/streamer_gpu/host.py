"""Host side of the GPU ABEA stage: which read goes where, packing, and merging the answers.

Plain numba on CPU threads, importable without CUDA. The split follows f5c (paper 4.2-4.3):
a read goes to the GPU unless it is ultra-long (set aside, aligned on the CPU after the
rest of the batch), longer than max_lf x the batch's mean read length, has more events per
base than max_epk, or no longer fits the arena (bases, events, band rows or read slots).
Reads the CPU kernel settles at once (already failed, no events, too short, over-segmented)
stay with the CPU so that their statuses come from the one place that sets them.

`assign_reads` and `merge` are numba kernels over flat arrays, hence their long argument lists;
`CudaAbea.align` unpacks the batch record for them once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from streamer.pipeline.abea import transition_log_probs

CPU = 0
GPU = 1
ULTRA = 2
# status given, in a private copy, to reads another worker aligns: the CPU kernel passes them over
NOT_MINE = -1
# read slots are budgeted for reads averaging at least this many bases
MIN_MEAN_READ_LEN = 256
# device bytes of one read slot: 4 int64 offsets, shift and scale, 3 float64 log probabilities,
# 4 int32 (end event, first pair, pairs), a float64 emission sum and a status byte
SLOT_BYTES = 4 * 8 + 2 * 4 + 3 * 8 + 4 * 4 + 8 + 1


@dataclass(frozen=True)
class Capacity:
    """What one batch's GPU reads may take of an arena: X bases, Y events, band rows, read slots."""

    bases: int
    events: int
    rows: int
    reads: int


def bytes_per_base(avg_epk: float, bandwidth: int) -> float:
    """Device bytes one base of a batch takes, with its avg_epk events, band rows and read slot share.

    A read of r bases and e events needs r bases, e events and e + (r - k + 1) + 2 <= r + e band
    rows (k >= 3), so bytes per base are C_R + avg_epk * C_E with C_R = 13 + W + 13 and
    C_E = 4 + W + 13 for band width W (f5c keeps a float score per cell besides the trace byte;
    here scores live in shared memory only).
    """
    per_row = bandwidth + 3 * 4 + 1
    return 13 + per_row + avg_epk * (4 + per_row) + SLOT_BYTES / MIN_MEAN_READ_LEN


def arena_capacity(n_bytes: int, avg_epk: float, bandwidth: int) -> Capacity:
    """f5c's heuristic partition (paper eqs. 3-4): X = n_bytes / (C_R + avg_epk C_E), Y = avg_epk X."""
    bases = max(int(n_bytes // bytes_per_base(avg_epk, bandwidth)), 1)
    events = max(int(math.floor(avg_epk * bases)), 1)
    return Capacity(bases, events, bases + events, bases // MIN_MEAN_READ_LEN + 1)


@numba.njit(nogil=True, cache=True)
def assign_reads(
    seq_off, ev_off, status, k, max_events_per_base, max_lf, max_epk, ultra_thresh, cap_bases, cap_events, cap_rows,
    cap_reads,
):
    """Owner (CPU, GPU, ULTRA) of every read, in batch order, as f5c fills its arrays.

    Returns (owner int8[n], counts int64[6]) with counts = (n_memout, n_long, n_events,
    bases, events, rows) where the last three are what the GPU reads take of the arena.
    """
    n = len(seq_off) - 1
    owner = np.zeros(n, dtype=np.int8)
    counts = np.zeros(6, dtype=np.int64)
    if n == 0:
        return owner, counts
    mean_len = (seq_off[n] - seq_off[0]) / n
    n_gpu = 0
    for i in range(n):
        read_len = seq_off[i + 1] - seq_off[i]
        n_events = ev_off[i + 1] - ev_off[i]
        n_kmers = read_len - k + 1
        if status[i] != 0 or n_events <= 0 or n_kmers <= 0:
            continue
        if np.float32(n_events) / np.float32(read_len) >= np.float32(max_events_per_base):
            continue
        if read_len > ultra_thresh:
            owner[i] = ULTRA
            continue
        if read_len > max_lf * mean_len:
            counts[1] += 1
            continue
        if n_events / read_len > max_epk:
            counts[2] += 1
            continue
        rows = n_events + n_kmers + 2
        if (
            counts[3] + read_len > cap_bases
            or counts[4] + n_events > cap_events
            or counts[5] + rows > cap_rows
            or n_gpu >= cap_reads
        ):
            counts[0] += 1
            continue
        owner[i] = GPU
        n_gpu += 1
        counts[3] += read_len
        counts[4] += n_events
        counts[5] += rows
    return owner, counts


@numba.njit(nogil=True, cache=True)
def read_params(seq_off, ev_off, idx, k, skip_prob):
    """Offsets of the chosen reads in the packed arrays and their transition log probabilities.

    The log probabilities come from the CPU helper itself (double-precision libm), so the
    device never evaluates log/exp, whose last bits differ between libm and libdevice.
    Returns (base_off, ev_off, row_off, lp[n, 3] = (lp_skip, lp_stay, lp_step)).
    """
    n = len(idx)
    base_o = np.zeros(n + 1, dtype=np.int64)
    ev_o = np.zeros(n + 1, dtype=np.int64)
    row_o = np.zeros(n + 1, dtype=np.int64)
    lp = np.empty((n, 3), dtype=np.float64)
    for j in range(n):
        i = idx[j]
        read_len = seq_off[i + 1] - seq_off[i]
        n_events = ev_off[i + 1] - ev_off[i]
        n_kmers = read_len - k + 1
        base_o[j + 1] = base_o[j] + read_len
        ev_o[j + 1] = ev_o[j] + n_events
        row_o[j + 1] = row_o[j] + n_events + n_kmers + 2
        lp[j, 0], lp[j, 1], lp[j, 2] = transition_log_probs(n_events, n_kmers, skip_prob)
    return base_o, ev_o, row_o, lp


@numba.njit(nogil=True, cache=True, parallel=True)
def gather(src, src_off, idx, dst_off, dst):
    """dst[dst_off[j]:dst_off[j+1]] = src[src_off[idx[j]]:...]: the chosen reads, packed.

    Runs before the CPU reads start, so it has numba's parallel workers to itself.
    """
    for j in numba.prange(len(idx)):
        s = src_off[idx[j]]
        d = dst_off[j]
        for t in range(dst_off[j + 1] - d):
            dst[d + t] = src[s + t]


@numba.njit(nogil=True, cache=True, parallel=True)
def merge(owner, gpu_pos, cpu_off, cpu_kmer, cpu_event, ult_off, ult_kmer, ult_event, gpu_off, first_kmer,
          first_event, steps):  # fmt: skip
    """One batch's pairs, in batch order, from the three workers' outputs.

    cpu_* and ult_* are full-batch outputs of the CPU kernel (zero pairs for reads it did
    not own); the GPU reads' pairs are decoded here from their first pair and steps (bit 0:
    next k-mer, bit 1: next event), straight into their place: one pass over the pairs.
    gpu_pos[i] is read i's place among the GPU reads.
    """
    n = len(owner)
    aln_off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        if owner[i] == GPU:
            c = gpu_off[gpu_pos[i] + 1] - gpu_off[gpu_pos[i]]
        elif owner[i] == ULTRA:
            c = ult_off[i + 1] - ult_off[i]
        else:
            c = cpu_off[i + 1] - cpu_off[i]
        aln_off[i + 1] = aln_off[i] + c
    aln_kmer = np.empty(aln_off[n], dtype=np.int32)
    aln_event = np.empty(aln_off[n], dtype=np.int32)
    for i in numba.prange(n):
        d = aln_off[i]
        m = aln_off[i + 1] - d
        if m == 0:
            continue
        if owner[i] == GPU:
            g = gpu_pos[i]
            s = gpu_off[g]
            km = first_kmer[g]
            ev = first_event[g]
            aln_kmer[d] = km
            aln_event[d] = ev
            for t in range(1, m):
                step = steps[s + t]
                km += step & 1
                ev += step >> 1
                aln_kmer[d + t] = km
                aln_event[d + t] = ev
        else:
            src_k = ult_kmer if owner[i] == ULTRA else cpu_kmer
            src_e = ult_event if owner[i] == ULTRA else cpu_event
            s = ult_off[i] if owner[i] == ULTRA else cpu_off[i]
            for t in range(m):
                aln_kmer[d + t] = src_k[s + t]
                aln_event[d + t] = src_e[s + t]
    return aln_off, aln_kmer, aln_event


@numba.njit(nogil=True, cache=True)
def log_trim(trim_prob):
    """ln(trim_prob) compiled as the CPU kernel compiles it."""
    return math.log(trim_prob)
