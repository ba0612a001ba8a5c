"""Base-level alignment of chains: the bases between anchors filled and the ends extended, into CIGARs.

One banded dynamic programme does both, with minimap2's map-ont scores (match 2, mismatch 4, N 1,
two-piece affine gaps costing min(4 + 2l, 24 + l)): global between two anchors (the band covers the
two gaps' difference plus a margin), and from an anchor outwards to the read's end, stopping at the
best-scoring cell (the rest is clipped) and giving up once a row falls `zdrop` below the best so far.
Ties go to the diagonal, which places a gap at its leftmost position, as minimap2 does (the left end,
extended on both sequences reversed, breaks ties the other way for the same result).

Measured against edlib and parasail on the same jobs (`benchmarks/bench_extend.py`), this numba
kernel was chosen: see docs/alignment.md for the numbers.

A batch's chains become one table of jobs (`plan_jobs`: the left end, the gaps between anchors,
the right end of each); the jobs are aligned by the cells of `streamer.align.extend_cells`, on CPU
threads (the kernel releases the GIL) or on the GPU (`streamer_gpu.extend`, the same cells), and
`assemble` turns each chain's jobs and anchors into its CIGAR, laid end to end with offsets, as
(op, length) in pysam's numbering.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

from streamer.align.anchors import Seeds
from streamer.align.chain import Chains
from streamer.align.extend_cells import (BAND, EXTEND, GLOBAL, JOB, MODE, N_RUNS, OP_D, OP_I, OP_M, Q0, Q_USED,
                                         QLEN, QSTEP, R0, R_USED, RESULT, RLEN, RSTEP, SCORE, TIE, NM, extend_cells)
from streamer.pipeline.gpu import GpuExtender
from streamer.pipeline.targets import CPU

_band, _align_job = extend_cells(CPU).band, extend_cells(CPU).align_job


@dataclass(frozen=True)
class ExtendParams:
    """The DP's scores (minimap2's map-ont) and bands."""

    match: int = 2  # score of a matching base
    mismatch: int = 4  # cost of a mismatch
    ambiguous: int = 1  # cost of a base against N
    gap_open: int = 4  # a gap of l bases costs min(gap_open + gap_extend * l, long_gap_open + long_gap_extend * l)
    gap_extend: int = 2
    long_gap_open: int = 24  # the second piece: long gaps cost less per base
    long_gap_extend: int = 1
    band: int = 200  # half-width of the band of an end extension
    gap_band: int = 15  # margin of the band between anchors, beyond the gaps' difference
    zdrop: int = 400
    anchor_trim: int = 8  # bases of each anchor's ends aligned by the DP too


@dataclass(frozen=True)
class Alignments:
    """The base-level alignment of each chain: its span (query on the read as aligned) and CIGAR."""

    qstart: np.ndarray  # int64
    qend: np.ndarray
    rstart: np.ndarray  # on the contigs laid end to end
    rend: np.ndarray
    score: np.ndarray  # int64: the DP score of the whole alignment
    nm: np.ndarray  # int64: mismatches plus inserted and deleted bases
    cigar: np.ndarray  # int32[:, 2] (op, length)
    cigar_off: np.ndarray  # int64[n + 1]


@dataclass(frozen=True)
class JobResults:
    """A batch's DP jobs aligned: each job's results (`extend_cells`' RESULT fields) and runs."""

    res: np.ndarray  # int64[n_jobs, RESULT]
    runs: np.ndarray  # int32: each job's runs, last column first, (length << 2 | op)
    start: np.ndarray  # int64[n_jobs]: where a job's runs begin in `runs`


@numba.njit(nogil=True, cache=True)
def _align(q, r, mode, w, sc, ops, rightmost=False):
    """One job on its own: q aligned to r as `extend_cells`' fill does it, one op per column written into
    `ops` last column first; returns (n ops, query used, reference used, score)."""
    jobs = np.array([[0, 1, len(q), 0, 1, len(r), mode, w, 1 if rightmost else 0]], dtype=np.int64)
    out = _align_jobs(q, r, jobs, np.zeros(1, np.int64), sc)
    res, runs = out[0], out[1]
    k = 0
    for u in range(res[0, N_RUNS]):
        for _ in range(runs[u] >> 2):
            ops[k] = runs[u] & 3
            k += 1
    return k, res[0, Q_USED], res[0, R_USED], res[0, SCORE]


@numba.njit(nogil=True, cache=True)
def job_sizes(jobs):
    """Each job's traceback bytes, entries of each scratch row and most runs, as the cells use them."""
    n_jobs = len(jobs)
    tb, scratch, cap = np.empty(n_jobs, np.int64), np.empty(n_jobs, np.int64), np.empty(n_jobs, np.int64)
    for jb in range(n_jobs):
        n, m = jobs[jb, QLEN], jobs[jb, RLEN]
        _, width = _band(jobs[jb, MODE], jobs[jb, BAND], n, m)
        tb[jb], scratch[jb], cap[jb] = (n + 1) * width, width + 1, n + m + 1
    return tb, scratch, cap


@numba.njit(nogil=True, cache=True)
def _align_jobs(q, genome, jobs, ids, sc):
    """Jobs `ids` of the table aligned one after another; their results, runs and runs' starts (in ids' order)."""
    tb_size, scratch, cap = job_sizes(jobs[ids])
    tb = np.empty(max(1, tb_size.max()) if len(ids) else 1, np.uint8)
    width = max(1, scratch.max()) if len(ids) else 1
    h, f1, f2 = np.empty(width, np.int32), np.empty(width, np.int32), np.empty(width, np.int32)
    runs = np.empty(cap.sum(), np.int32)
    res = np.zeros((len(ids), RESULT), np.int64)
    start = np.zeros(len(ids), np.int64)
    used = 0
    for u in range(len(ids)):
        start[u] = used
        _align_job(q, genome, jobs, ids[u], sc, tb, 0, h, f1, f2, 0, 1, runs, used, res, u)
        used += res[u, N_RUNS]
    return res, runs[:used].copy(), start


def gathered(n_jobs: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> JobResults:
    """Parts (job ids, their results, runs, runs' starts) as one `JobResults` in job order."""
    res = np.zeros((n_jobs, RESULT), np.int64)
    start = np.zeros(n_jobs, np.int64)
    base = 0
    for ids, r, runs, st in parts:
        res[ids] = r
        start[ids] = st + base
        base += len(runs)
    runs = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int32)
    return JobResults(res, runs.astype(np.int32, copy=False), start)


def align_jobs(q: np.ndarray, genome: np.ndarray, jobs: np.ndarray, sc: np.ndarray, threads: int = 1,
               ids: np.ndarray | None = None) -> JobResults:
    """Jobs `ids` (all by default) of the table on the CPU, in chunks over `threads` threads (the
    kernel releases the GIL); jobs not in ids have no results."""
    ids = np.arange(len(jobs), dtype=np.int64) if ids is None else ids
    chunks = [c for c in np.array_split(ids, max(1, min(len(ids), 4 * threads))) if len(c)]

    def run(chunk: np.ndarray) -> tuple[np.ndarray, ...]:
        return (chunk, *_align_jobs(q, genome, jobs, chunk, sc))

    if threads > 1 and len(chunks) > 1:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="extend") as pool:
            parts = list(pool.map(run, chunks))
    else:
        parts = [run(c) for c in chunks]
    return gathered(len(jobs), parts)


@numba.njit(nogil=True, cache=True)
def _add_job(jobs, nj, q0, qs, n, r0, rs, m, mode, w, tie):
    jobs[nj, Q0], jobs[nj, QSTEP], jobs[nj, QLEN] = q0, qs, n
    jobs[nj, R0], jobs[nj, RSTEP], jobs[nj, RLEN] = r0, rs, m
    jobs[nj, MODE], jobs[nj, BAND], jobs[nj, TIE] = mode, w, tie
    return nj + 1


@numba.njit(nogil=True, cache=True)
def plan_jobs(q_start, q_end, ctg_start, ctg_end, a_qs, a_rs, a_ln, a_off, w, gap_band, trim):
    """Each chain c's anchors (query `q_start[c]:q_end[c]` of the strands, anchors `a_*[a_off[c]:a_off[c+1]]`)
    trimmed, and its DP jobs: the left end (reversed), the gaps between anchors with bases on both
    sides, the right end. Returns the jobs, their offsets by chain, the trimmed anchors (query
    positions relative to the chain's query) and their offsets."""
    n_chains = len(q_start)
    total = a_off[n_chains]
    tq, tr, tl = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.int64)
    t_off = np.zeros(n_chains + 1, np.int64)
    jobs = np.zeros((total + n_chains, JOB), np.int64)
    job_off = np.zeros(n_chains + 1, np.int64)
    nt, nj = 0, 0
    for c in range(n_chains):
        base = nt
        # anchors trimmed so that none overlaps the one before on either sequence
        for t in range(a_off[c], a_off[c + 1]):
            s_q, s_r, s_l = np.int64(a_qs[t]), np.int64(a_rs[t]), np.int64(a_ln[t])
            if nt > base:
                over = max(tq[nt - 1] + tl[nt - 1] - s_q, tr[nt - 1] + tl[nt - 1] - s_r, 0)
                if over >= s_l:
                    continue
                s_q, s_r, s_l = s_q + over, s_r + over, s_l - over
            tq[nt], tr[nt], tl[nt] = s_q, s_r, s_l
            nt += 1
        # anchors split the work, not the alignment: all but their middle bases go to the DP, so that a
        # gap at an anchor's edge may move left as the scores' ties place it
        for t in range(base, nt):
            cut = min(trim, (tl[t] - 1) // 2)
            tq[t], tr[t], tl[t] = tq[t] + cut, tr[t] + cut, tl[t] - 2 * cut
        qa = q_start[c]
        left_q, r_first = tq[base], tr[base]
        lr = min(r_first - ctg_start[c], left_q + w)
        nj = _add_job(jobs, nj, qa + left_q - 1, -1, left_q, r_first - 1, -1, lr, EXTEND, w, 1)
        for t in range(base + 1, nt):
            gq0, gr0 = tq[t - 1] + tl[t - 1], tr[t - 1] + tl[t - 1]
            if tq[t] > gq0 and tr[t] > gr0:
                nj = _add_job(jobs, nj, qa + gq0, 1, tq[t] - gq0, gr0, 1, tr[t] - gr0, GLOBAL, gap_band, 0)
        e_q, e_r = tq[nt - 1] + tl[nt - 1], tr[nt - 1] + tl[nt - 1]
        right_q = q_end[c] - q_start[c] - e_q
        nj = _add_job(jobs, nj, qa + e_q, 1, right_q, e_r, 1, min(ctg_end[c] - e_r, right_q + w), EXTEND, w, 0)
        t_off[c + 1], job_off[c + 1] = nt, nj
    return jobs[:nj].copy(), job_off, tq[:nt].copy(), tr[:nt].copy(), tl[:nt].copy(), t_off


@numba.njit(nogil=True, cache=True)
def _emit(cig, first, nc, op, length):
    """Append (op, length) to the run-length CIGAR `cig` whose runs start at `first` (merging with the last
    run); returns the new count."""
    if length <= 0:
        return nc
    if nc > first and cig[nc - 1, 0] == op:
        cig[nc - 1, 1] += length
        return nc
    cig[nc, 0] = op
    cig[nc, 1] = length
    return nc + 1


@numba.njit(nogil=True, cache=True)
def _emit_runs(cig, first, nc, runs, at, k, forwards):
    """Append k runs from runs[at]: in their order (forwards) or reversed (a job's runs come last first)."""
    for u in range(k):
        v = runs[at + u] if forwards else runs[at + k - 1 - u]
        nc = _emit(cig, first, nc, v & 3, v >> 2)
    return nc


@numba.njit(nogil=True, cache=True)
def assemble(job_off, tq, tr, tl, t_off, res, runs, start, sc, out_q0, out_q1, out_r0, out_r1, out_score, out_nm):
    """Each chain's CIGAR from its jobs' runs and its anchors, its span, score and NM; returns the CIGARs laid
    end to end and their offsets."""
    n_chains = len(job_off) - 1
    cig = np.zeros((res[:, N_RUNS].sum() + 3 * len(tq) + 2 * n_chains + 1, 2), np.int32)
    cig_off = np.zeros(n_chains + 1, np.int64)
    nc = 0
    for c in range(n_chains):
        first, jb, base = nc, job_off[c], t_off[c]
        # left end: aligned reversed, so its runs, last column first, run forwards here
        out_q0[c], out_r0[c] = tq[base] - res[jb, Q_USED], tr[base] - res[jb, R_USED]
        nc = _emit_runs(cig, first, nc, runs, start[jb], res[jb, N_RUNS], True)
        score, nm = res[jb, SCORE], res[jb, NM]
        for t in range(base, t_off[c + 1]):
            if t > base:
                ql, rl = tq[t] - tq[t - 1] - tl[t - 1], tr[t] - tr[t - 1] - tl[t - 1]
                if ql > 0 and rl > 0:
                    jb += 1
                    nc = _emit_runs(cig, first, nc, runs, start[jb], res[jb, N_RUNS], False)
                    score += res[jb, SCORE]
                    nm += res[jb, NM]
                else:
                    nc = _emit(cig, first, nc, OP_I, ql)
                    nc = _emit(cig, first, nc, OP_D, rl)
                    gl = max(ql, rl)
                    if gl > 0:
                        score -= min(sc[3] + sc[4] * gl, sc[5] + sc[6] * gl)
                        nm += gl
            nc = _emit(cig, first, nc, OP_M, tl[t])
            score += sc[0] * tl[t]
        jb += 1
        last = t_off[c + 1] - 1
        nc = _emit_runs(cig, first, nc, runs, start[jb], res[jb, N_RUNS], False)
        out_q1[c], out_r1[c] = tq[last] + tl[last] + res[jb, Q_USED], tr[last] + tl[last] + res[jb, R_USED]
        out_score[c], out_nm[c] = score + res[jb, SCORE], nm + res[jb, NM]
        cig_off[c + 1] = nc
    return cig[:nc].copy(), cig_off


@numba.njit(nogil=True, cache=True)
def both_strands(codes, offsets):
    """The reads' codes, then each read's reverse complement where the read is, shifted by len(codes)."""
    n = len(codes)
    out = np.empty(2 * n, np.uint8)
    out[:n] = codes
    for read in range(len(offsets) - 1):
        a, b = offsets[read], offsets[read + 1]
        for i in range(a, b):
            c = codes[a + b - 1 - i]
            out[n + i] = 3 - c if c < 4 else c
    return out


def _scores(p: ExtendParams) -> np.ndarray:
    return np.array([p.match, p.mismatch, p.ambiguous, p.gap_open, p.gap_extend, p.long_gap_open,
                     p.long_gap_extend, p.zdrop, p.anchor_trim], dtype=np.int64)


def extend(chains: Chains, seeds: Seeds, codes: np.ndarray, offsets: np.ndarray, genome: np.ndarray,
           contig_offsets: np.ndarray, params: ExtendParams = ExtendParams(), threads: int = 1,
           gpu: GpuExtender | None = None) -> Alignments:
    """Base-level alignments of the chains of reads `codes`/`offsets` (as basecalled) on `genome` (the
    contigs' codes laid end to end): the DP's jobs on `gpu` when given (holding the same genome), else
    in chunks over `threads` threads."""
    n = len(chains)
    strands = both_strands(codes, offsets)
    read = chains.read.astype(np.int64)
    q_start = offsets[read] + np.where(chains.rc, len(codes), 0)
    q_end = q_start + np.diff(offsets)[read]
    ctg = chains.contig.astype(np.int64)
    a = chains.anchors
    a_qs, a_rs, a_ln = seeds.qpos[a].astype(np.int64), seeds.rpos[a].astype(np.int64), seeds.length[a].astype(np.int64)
    sc = _scores(params)
    jobs, job_off, tq, tr, tl, t_off = plan_jobs(q_start, q_end, contig_offsets[ctg], contig_offsets[ctg + 1], a_qs,
                                                 a_rs, a_ln, chains.anchor_off.astype(np.int64), params.band,
                                                 params.gap_band, params.anchor_trim)
    done = gpu.align_jobs(strands, jobs, sc, threads) if gpu is not None else align_jobs(strands, genome, jobs, sc,
                                                                                         threads)
    fields = [np.zeros(n, dtype=np.int64) for _ in range(6)]
    cigar, cigar_off = assemble(job_off, tq, tr, tl, t_off, done.res, done.runs, done.start, sc, *fields)
    return Alignments(*fields, cigar, cigar_off)
