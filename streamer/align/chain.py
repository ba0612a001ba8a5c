"""Chains of seeds: which exact matches of a read belong to one alignment, and which alignments of a
read are its primary, its supplementary parts (a chimera's other pieces) and its secondaries.

Chaining is minimap2's dynamic programme over anchors, written for seeds of any length: the anchors
of one read and strand, in order of their end on the reference, each scored as the best of
starting a chain (its length) or extending one of the `max_lookback` anchors before it (the search
stops after `max_skip` valid ones in a row that do not improve it, like minimap2's skip rule), adding
the bases it brings (min of the two gaps and its length) less a gap cost for the difference of the two
gaps g: `gap_scale * 0.01 * mean anchor length * g + 0.5 * log2(g)`. Two anchors join only on one
contig, in order on both sequences, within `max_gap` bases and with gaps differing by at most
`bandwidth`. Chains are read back best first, each stopping where it meets an anchor already used.
The programme's cells are shared with the GPU (`chain_cells`; `chain(..., target="gpu")` runs it there).

Of a read's chains (both strands), the best is the primary; a later one overlapping a kept
primary on the read by more than `mask_level` of the shorter is its secondary (at most `best_n`,
scoring at least `pri_ratio` of it), else a supplementary part. MAPQ is minimap2's idea: 40 times
(1 - second best / best) times ln(best), lowered for chains of few anchors or low score and for
many near-equal alternatives, between 0 and 60.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from streamer.align.anchors import Seeds
from streamer.align.chain_cells import FAR, JOIN, chain_cells, half_log2_table, table_size
from streamer.pipeline.targets import CPU

PRIMARY, SUPPLEMENTARY, SECONDARY = 0, 1, 2


@dataclass(frozen=True)
class ChainParams:
    """Chaining's settings, minimap2's map-ont values (the module's docstring says how each is used)."""

    max_gap: int = 5000  # bases between two joined anchors, on either sequence
    bandwidth: int = 500  # how far the two gaps may differ
    max_lookback: int = 5000  # anchors an anchor looks back over
    max_skip: int = 25  # valid predecessors in a row that do not improve it before the search stops
    gap_scale: float = 1.0  # weight of the gap cost
    min_score: int = 40  # a chain's least score to be kept
    min_anchors: int = 2  # and its fewest anchors
    mask_level: float = 0.5
    pri_ratio: float = 0.8
    best_n: int = 5


@dataclass(frozen=True)
class Chains:
    """A batch's chains, by read, each read's primary first, then its supplementary parts, then secondaries.

    Query coordinates are on the read as aligned (its reverse complement where `rc`); reference
    coordinates on the contigs laid end to end. Chain `i` owns `anchors[anchor_off[i]:anchor_off[i+1]]`
    (indices into the seeds, in order along the reference).
    """

    read: np.ndarray  # int32
    rc: np.ndarray  # bool
    score: np.ndarray  # int32
    qstart: np.ndarray  # int64
    qend: np.ndarray
    rstart: np.ndarray
    rend: np.ndarray
    contig: np.ndarray  # int32
    role: np.ndarray  # int8: PRIMARY, SUPPLEMENTARY, SECONDARY
    parent: np.ndarray  # int32: the primary or supplementary chain a secondary is under; itself otherwise
    mapq: np.ndarray  # uint8 (0 for secondaries)
    anchors: np.ndarray  # int64
    anchor_off: np.ndarray  # int64[n + 1]

    def __len__(self) -> int:
        return len(self.read)


@dataclass(frozen=True)
class GroupChains:
    """Each group's anchors in chaining's order, and its chains at the start of its slots
    (`chain_cells.read_back`): sorted anchor k is anchor order[k] as given; group g of [a, b) has c_n[g]
    chains, chain k's score, first and count at a + k, its anchors (positions in the group) at
    anchor_out[a + first:]."""

    order: np.ndarray  # int64[n]
    c_score: np.ndarray  # int64[n]
    c_first: np.ndarray
    c_count: np.ndarray
    c_n: np.ndarray  # int64[groups]
    anchor_out: np.ndarray  # int64[n]


REND_BITS = 33  # a reference of up to 2^33 bases (an FM-index holds under 2^32) ...
QEND_BITS = 31  # ... and reads of up to 2^31 (int32 positions): a group's sort key fits 64 bits


@numba.njit(nogil=True, cache=True, parallel=True)
def _order_groups(rend, qend, grp_off, order):
    """order[a:b] of each group [a, b): by end on the reference, then on the read, then as given."""
    for g in numba.prange(len(grp_off) - 1):
        a, b = grp_off[g], grp_off[g + 1]
        if b == a:
            continue
        lo = rend[a:b].min()
        key = np.empty(b - a, np.uint64)
        for k in range(b - a):
            key[k] = (np.uint64(rend[a + k] - lo) << np.uint64(QEND_BITS)) | np.uint64(qend[a + k])
        order[a:b] = a + np.argsort(key, kind="mergesort")


_cells = chain_cells(CPU)
_gap_slope, _candidate, _joined, _step, _read_back = (_cells.gap_slope, _cells.candidate, _cells.joined, _cells.step,
                                                     _cells.read_back)  # fmt: skip


@numba.njit(nogil=True, cache=True, parallel=True)
def _chain_all(qs, rs, ln, ctg, grp_off, max_gap, bandwidth, max_lookback, max_skip, gap_scale, half_log2, min_score,
               min_anchors, f, p, order, used, path, c_score, c_first, c_count, c_n, anchor_out):
    """The programme of every group (one read and strand; `grp_off` into anchors sorted by group, then by
    reference end), a thread per group, the predecessors of each anchor tried one by one."""
    for g in numba.prange(len(grp_off) - 1):
        a, b = grp_off[g], grp_off[g + 1]
        slope = _gap_slope(ln[a:b].sum(), b - a, gap_scale)
        for i in range(a, b):
            best, parent, skipped = np.int64(ln[i]), np.int64(-1), np.int64(0)
            for j in range(i - 1, max(a, i - max_lookback) - 1, -1):
                kind, gap, bases = _candidate(qs[i], rs[i], ln[i], ctg[i], qs[j], rs[j], ln[j], ctg[j], max_gap,
                                              bandwidth)  # fmt: skip
                if kind == FAR:
                    break
                if kind == JOIN:
                    score = _joined(f[j], bases, gap, slope, half_log2[gap])
                    best, parent, skipped, stop = _step(score, j, best, parent, skipped, max_skip)
                    if stop:
                        break
            f[i] = best
            p[i] = parent
        order[a:b] = a + np.argsort(-f[a:b], kind="mergesort")
        c_n[g] = _read_back(f, p, order, used, path, a, b, min_score, min_anchors, c_score, c_first, c_count,
                            anchor_out)


def chain_groups(qpos: np.ndarray, rpos: np.ndarray, length: np.ndarray, grp_off: np.ndarray,
                 contig_offsets: np.ndarray, params: ChainParams) -> GroupChains:
    """Each group's anchors (`Seeds`' arrays, by group: `grp_off`) put in order and chained, on the CPU."""
    n = len(qpos)
    order = np.arange(n, dtype=np.int64)
    _order_groups(rpos + length, qpos + length, grp_off, order)
    ln = length[order].astype(np.int64)
    qs, rs = qpos[order].astype(np.int64), rpos[order].astype(np.int64)
    ctg = (np.searchsorted(contig_offsets, rs, side="right") - 1).astype(np.int64)
    p = params
    out = GroupChains(order, *(np.zeros(n, np.int64) for _ in range(3)), np.zeros(len(grp_off) - 1, np.int64),
                      np.zeros(n, np.int64))  # fmt: skip
    _chain_all(qs, rs, ln, ctg, grp_off, p.max_gap, p.bandwidth, p.max_lookback, p.max_skip, p.gap_scale,
               half_log2_table(table_size(p.max_gap, p.bandwidth)), p.min_score, p.min_anchors, np.empty(n, np.int64),
               np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.bool_), np.empty(n, np.int64),
               out.c_score, out.c_first, out.c_count, out.c_n, out.anchor_out)
    return out


@numba.njit(nogil=True, cache=True)
def _select(read, score, fq0, fq1, count, mask_level, pri_ratio, best_n, min_score,
            role, parent, mapq, keep):
    """Roles, parents and MAPQ of chains sorted by (read, score descending); fq0/fq1 the chain's span on
    the read as basecalled. Secondaries beyond `best_n` or under `pri_ratio` of their parent are dropped."""
    n = len(read)
    sub = np.zeros(n, dtype=np.int64)
    n_sub = np.zeros(n, dtype=np.int64)
    n_kept_sec = np.zeros(n, dtype=np.int64)
    start = 0
    while start < n:
        stop = start
        while stop < n and read[stop] == read[start]:
            stop += 1
        tops = np.empty(stop - start, dtype=np.int64)
        n_tops = 0
        for c in range(start, stop):
            parent[c] = c
            for t in range(n_tops):
                top = tops[t]
                ov = min(fq1[c], fq1[top]) - max(fq0[c], fq0[top])
                if ov > mask_level * min(fq1[c] - fq0[c], fq1[top] - fq0[top]):
                    parent[c] = top
                    break
            if parent[c] == c:
                role[c] = PRIMARY if n_tops == 0 else SUPPLEMENTARY
                tops[n_tops] = c
                n_tops += 1
                keep[c] = True
                continue
            top = parent[c]
            role[c] = SECONDARY
            sub[top] = max(sub[top], score[c])
            if score[c] >= pri_ratio * score[top]:
                n_sub[top] += 1
                keep[c] = n_kept_sec[top] < best_n
                n_kept_sec[top] += keep[c]
        start = stop
    for c in range(n):
        if role[c] == SECONDARY:
            mapq[c] = 0
            continue
        s = score[c]
        pen = min(1.0, count[c] / 5.0, s / 100.0)
        x = max(sub[c], min_score) / s
        q = 40.0 * pen * (1.0 - x) * np.log(s) - 4.343 * np.log(n_sub[c] + 1)
        mapq[c] = int(min(60.0, max(0.0, q)))


def chain(seeds: Seeds, read_lengths: np.ndarray, contig_offsets: np.ndarray,
          params: ChainParams = ChainParams(), target: str = "cpu") -> Chains:
    """Chain a batch's seeds; `read_lengths` per read, `contig_offsets` the contigs' starts laid end to end
    (and the total after the last). The dynamic programme runs on the GPU for target "gpu" (the CPU where
    there is none, said once); the roles and MAPQ after it on the CPU."""
    # the seeds come by read and strand (`Seeds`): then this stable sort is a pass
    strand = seeds.read.astype(np.int64) * 2 + seeds.rc
    by_strand = np.argsort(strand, kind="stable")
    strand = strand[by_strand]
    n = len(strand)
    new = np.ones(n, dtype=bool)
    new[1:] = strand[1:] != strand[:-1]
    grp_off = np.concatenate([np.flatnonzero(new), [n]]).astype(np.int64)
    p = params
    chainer = None
    if target == "gpu":
        from streamer.pipeline.gpu import gpu_package

        chainer = gpu_package().chainer()
    grouped = (chainer.chain_groups if chainer is not None else chain_groups)(
        seeds.qpos[by_strand], seeds.rpos[by_strand], seeds.length[by_strand], grp_off, contig_offsets, p)
    order = by_strand[grouped.order]  # the seeds in chaining's order
    c_score, c_first, c_count, c_n, anchor_out = (grouped.c_score, grouped.c_first, grouped.c_count, grouped.c_n,
                                                  grouped.anchor_out)  # fmt: skip
    read, rc = strand >> 1, strand & 1
    # each group's chains sit at the start of its slots: gather them, and their anchors as batch indices
    grp_of_slot = np.repeat(grp_off[:-1], c_n)
    slot = grp_of_slot + np.arange(len(grp_of_slot)) - np.repeat(np.cumsum(c_n) - c_n, c_n)
    first = grp_of_slot + c_first[slot]
    count = c_count[slot]
    idx = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
    members = grp_of_slot.repeat(count) + anchor_out[idx]  # anchor positions in sorted order
    a_first = np.concatenate([[0], np.cumsum(count)])
    score = c_score[slot]
    c_read = read[grp_of_slot]
    head = order[members[a_first[:-1]]]
    last = order[members[a_first[1:] - 1]]
    qstart, rstart = seeds.qpos[head].astype(np.int64), seeds.rpos[head].astype(np.int64)
    qend = seeds.qpos[last].astype(np.int64) + seeds.length[last]
    rend = seeds.rpos[last].astype(np.int64) + seeds.length[last]
    c_rc = rc[grp_of_slot].astype(bool)
    lens = read_lengths[c_read]
    fq0 = np.where(c_rc, lens - qend, qstart)
    fq1 = np.where(c_rc, lens - qstart, qend)
    by = np.lexsort((-score, c_read))
    m = len(slot)
    role, parent = np.zeros(m, dtype=np.int8), np.zeros(m, dtype=np.int64)
    mapq, keep = np.zeros(m, dtype=np.uint8), np.zeros(m, dtype=bool)
    _select(c_read[by], score[by], fq0[by], fq1[by], count[by], p.mask_level, p.pri_ratio,
            p.best_n, p.min_score, role, parent, mapq, keep)
    # output order: read, then primary, supplementary, secondary, each by score
    out = np.lexsort((np.arange(m), role, c_read[by]))
    out = out[keep[out]]
    ranks = np.full(m, -1, dtype=np.int64)
    ranks[out] = np.arange(len(out))
    sel = by[out]
    anchors_sorted = order[members]  # indices into the caller's seeds
    a_count = count[sel]
    a_idx = np.repeat(a_first[:-1][sel] - np.cumsum(a_count) + a_count, a_count) + np.arange(a_count.sum())
    contig = np.searchsorted(contig_offsets, rstart[sel], side="right") - 1
    return Chains(read=c_read[sel].astype(np.int32), rc=c_rc[sel], score=score[sel].astype(np.int32),
                  qstart=qstart[sel], qend=qend[sel], rstart=rstart[sel], rend=rend[sel],
                  contig=contig.astype(np.int32), role=role[out],
                  parent=ranks[parent[out]].astype(np.int32), mapq=mapq[out], anchors=anchors_sorted[a_idx],
                  anchor_off=np.concatenate([[0], np.cumsum(a_count)]).astype(np.int64))
