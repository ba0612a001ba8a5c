"""Seeding: the super-maximal exact matches (SMEMs) of a batch of reads against an FM-index, on the
CPU (here) or the GPU (`streamer_gpu.fmindex`: the same seeds, the same order).

Each read is searched as basecalled and as its reverse complement (a job each: job 2r and 2r + 1),
against the forward strand's index (`streamer.align.fmindex` says why). For every end e of a job,
backward search finds the longest match ending there ([s(e), e), its suffix array interval); s never
decreases with e, so the match is super-maximal exactly when the match ending at e + 1 starts later.
Every end is searched on its own (a GPU thread each), as Ahmed, Bertels and Al-Ars do, rather than by
BWA's bidirectional extension, which is sequential along a read. An SMEM of at least min_len bases
with at most max_occ occurrences gives a seed at each occurrence (the interval located through the
sampled suffix array). min_len defaults to 19, BWA-MEM's: a random 19-mer occurs in a 3 Gb genome
with probability 3e9 / 4^19 = 1%, while a read with 5% errors still has an exact 19-mer about every
50 bases. max_occ defaults to BWA-MEM's 500: more repetitive matches are left out (minimap2's -f).

A batch goes in chunks of at most CHUNK_ENDS read ends (GPU_CHUNK_ENDS on the GPU), each in four
steps over flat arrays: every end's longest match, every end's seed count, the seeds written at
their offsets (counted first, so no buffer overflows), and each read strand's seeds ordered.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numba
import numpy as np

from streamer.align.anchors import Seeds
from streamer.align.fm_cells import fm_cells
from streamer.align.fmindex import FMIndex
from streamer.pipeline.targets import CPU

MIN_LEN = 19
MAX_OCC = 500
CHUNK_ENDS = 1 << 22
GPU_CHUNK_ENDS = 1 << 24  # on the GPU: about 450 MB of device memory with the seeds of a chunk
WINDOW = 64  # read ends a thread searches, from the last: each but the last stops early where it is contained
REACH = WINDOW + 64  # symbols back from a window's last end whose interval sizes a thread keeps

_cells = fm_cells(CPU)
_window_of, _end_of, _match_window = _cells.window_of, _cells.end_of, _cells.match_window
_smem_count, _fill_smem, _order_seeds = _cells.smem_count, _cells.fill_smem, _cells.order_seeds
_COMPLEMENT = np.array([3, 2, 1, 0, 4], np.uint8)


@numba.njit(nogil=True, cache=True)
def both_strands(codes, offsets):
    """(q, job_off): each read's codes, then its reverse complement's (codes above 3 stay as they are)."""
    n = len(offsets) - 1
    job_off = np.empty(2 * n + 1, np.int64)
    job_off[0] = 0
    q = np.empty(2 * (offsets[n] - offsets[0]), np.uint8)
    for r in range(n):
        a, b = offsets[r], offsets[r + 1]
        m = b - a
        o = job_off[2 * r]
        for i in range(m):
            c = codes[a + i]
            q[o + i] = c
            q[o + 2 * m - 1 - i] = _COMPLEMENT[c] if c < 4 else c
        job_off[2 * r + 1] = o + m
        job_off[2 * r + 2] = o + 2 * m
    return q, job_off


def chunks(job_off: np.ndarray, cap: int) -> Iterator[tuple[int, int]]:
    """Runs of jobs [j0, j1) of at most cap ends each (a longer job alone)."""
    n_jobs = len(job_off) - 1
    j0 = 0
    while j0 < n_jobs:
        j1 = int(np.searchsorted(job_off, job_off[j0] + cap, side="right")) - 1
        j1 = min(n_jobs, max(j1, j0 + 1))
        yield j0, j1
        j0 = j1


def window_offsets(job_off: np.ndarray) -> np.ndarray:
    """The running count of the read strands' windows of WINDOW ends (`fm_cells.window_of`)."""
    win_off = np.zeros(len(job_off), np.int64)
    np.cumsum((np.diff(job_off) + WINDOW - 1) // WINDOW, out=win_off[1:])
    return win_off


@numba.njit(nogil=True, cache=True, parallel=True)
def match_windows(bwt, cum, sep_rows, kmer_lo, kmer_hi, k, q, job_off, win_off, min_len, starts, lo, hi):
    """The longest match ending at every end of the read strands (entry g: the end's base), a window of
    WINDOW ends at a time."""
    for w in numba.prange(win_off[-1]):
        sizes = np.empty(REACH, np.int64)
        a, e_lo, e_hi = _window_of(job_off, win_off, w, WINDOW)
        _match_window(bwt, cum, sep_rows, kmer_lo, kmer_hi, k, q, a, e_lo, e_hi, min_len, starts, lo, hi, a, sizes)


@numba.njit(nogil=True, cache=True, parallel=True)
def count_seeds(job_off, starts, lo, hi, max_occ, counts):
    for g in numba.prange(len(counts)):
        _, e, m = _end_of(job_off, g)
        counts[g] = _smem_count(starts, lo, hi, g, e, m, max_occ)


@numba.njit(nogil=True, cache=True, parallel=True)
def fill_seeds(bwt, cum, sep_rows, sep_sa, ssa, seg_text, seg_ref, job_off, j0, starts, lo, hi, at, read, qpos, rpos,
               length, rc):  # fmt: skip
    for g in numba.prange(len(starts)):
        if at[g + 1] > at[g]:
            j, e, _ = _end_of(job_off, g)
            _fill_smem(bwt, cum, sep_rows, sep_sa, ssa, seg_text, seg_ref, starts, lo, hi, g, e, j0 + j, at[g], read,
                       qpos, rpos, length, rc)  # fmt: skip


@numba.njit(nogil=True, cache=True, parallel=True)
def order_jobs(job_off, at, rpos, qpos, keys, perm):
    for j in numba.prange(len(job_off) - 1):
        _order_seeds(rpos, qpos, keys, perm, at[job_off[j]], at[job_off[j + 1]])


def seed_arrays(n: int) -> tuple[np.ndarray, ...]:
    """Empty (read, qpos, rpos, length, rc) for n seeds, in `Seeds`' dtypes."""
    return (np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int64), np.empty(n, np.int32),
            np.empty(n, np.bool_))  # fmt: skip


def chunk_seeds(index: FMIndex, q: np.ndarray, job_off: np.ndarray, j0: int, j1: int, min_len: int,
                max_occ: int) -> tuple[np.ndarray, ...]:  # fmt: skip
    """The seeds of read strands j0..j1-1 on the CPU, as (read, qpos, rpos, length, rc), ordered."""
    ix = index
    off = job_off[j0 : j1 + 1] - job_off[j0]
    q = q[job_off[j0] : job_off[j1]]
    n_ends = int(off[-1])
    starts, lo, hi = np.empty(n_ends, np.int32), np.empty(n_ends, np.uint32), np.empty(n_ends, np.uint32)
    match_windows(ix.bwt, ix.cum, ix.sep_rows, ix.kmer_lo, ix.kmer_hi, ix.kmer_len, q, off, window_offsets(off),
                  min_len, starts, lo, hi)  # fmt: skip
    counts = np.empty(n_ends, np.int64)
    count_seeds(off, starts, lo, hi, max_occ, counts)
    at = np.zeros(n_ends + 1, np.int64)
    np.cumsum(counts, out=at[1:])
    out = seed_arrays(int(at[-1]))
    fill_seeds(ix.bwt, ix.cum, ix.sep_rows, ix.sep_sa, ix.ssa, ix.seg_text, ix.seg_ref, off, j0, starts, lo, hi, at,
               *out)  # fmt: skip
    keys, perm = np.empty(len(out[0]), np.int64), np.empty(len(out[0]), np.int64)
    order_jobs(off, at, out[2], out[1], keys, perm)
    return tuple(a[perm] for a in out)


def find_seeds(index: FMIndex, codes: np.ndarray, offsets: np.ndarray, *, min_len: int = MIN_LEN,
               max_occ: int = MAX_OCC, target: str = "cpu", chunk_ends: int | None = None) -> Seeds:
    """The seeds of reads `codes[offsets[i]:offsets[i+1]]` (`bases.encode`'s codes: A C G T 0-3, any
    other base ends a match) on both strands, as one `Seeds` record; on the GPU for target "gpu" (the
    CPU where there is none, said once)."""  # fmt: skip
    if min_len < 1 or max_occ < 1:
        raise ValueError(f"min_len and max_occ must be at least 1, not {min_len} and {max_occ}")
    if len(offsets) > 1 and int(np.max(np.diff(offsets))) >= 1 << 29:
        raise ValueError("reads of 2^29 bases or more cannot be seeded")
    q, job_off = both_strands(np.asarray(codes, np.uint8), np.asarray(offsets, np.int64))
    seeder = None
    if target == "gpu":
        from streamer.pipeline.gpu import gpu_package

        seeder = gpu_package().fm_seeder(index)
    run = seeder.chunk_seeds if seeder is not None else functools.partial(chunk_seeds, index)
    if chunk_ends is None:
        chunk_ends = CHUNK_ENDS if seeder is None else GPU_CHUNK_ENDS
    parts = [run(q, job_off, j0, j1, min_len, max_occ) for j0, j1 in chunks(job_off, chunk_ends)]
    if not parts:
        return Seeds(*seed_arrays(0))
    return Seeds(*(np.concatenate([p[i] for p in parts]) for i in range(5)))
