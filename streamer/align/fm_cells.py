"""The FM-index's per-element work written once for the CPU kernels (`streamer.align.fmindex`,
`streamer.align.seeds`) and the CUDA kernels (`streamer_gpu.fmindex`): suffix keys, the refinement of
tied suffixes, the BWT's rows and blocks, rank, backward search, locate, and the seeds' order.

`fm_cells(target)` compiles them for a target (`streamer.pipeline.targets`). Everything here is
integer arithmetic, exact on both targets, so the two build the same index bytes and find the same
seeds. Bit operations on the packed BWT keep every operand uint64 (numba and numpy would turn a
uint64 mixed with an int64 into a float), and the popcount is the shift-and-add one, which neither
overflows (the CUDA simulator runs it on numpy scalars) nor needs an intrinsic.

The layout the cells read (`streamer.align.fmindex` says why these sizes):
- text: uint8 codes, A C G T = 0..3 and SEP = 4, one SEP after each run of ACGT (a segment);
- bwt: uint64, 4 words per block of 64 rows: the counts of codes 0-3 before the block (A and C in
  the first word, low and high 32 bits; G and T in the second), then the block's 64 codes, 2 bits
  each, row j of a word in bits 2j..2j+1. A SEP row is stored as code 0 and listed in sep_rows, so
  rank of A subtracts the SEP rows before it;
- ssa: uint32, the suffix array at every row divisible by SA_SAMPLE; a SEP row's own entry is in
  sep_sa (the start of a segment), so locate never steps through a separator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from streamer.align.bases import N_CODE
from streamer.pipeline.targets import Target

SEP = N_CODE  # text code of a separator (contig end, N or any other non-ACGT base: `bases.encode`'s 4)
KEY_SYMBOLS = 21  # symbols in one 63-bit suffix key, 3 bits each
BLOCK_ROWS = 64  # rows per occurrence checkpoint
SA_SAMPLE = 32  # rows per sampled suffix array entry
NOT_LONG = -1  # a match shorter than min_len

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
# the 3-bit key symbol of a text code: past the text's end 0 < SEP 1 < A 2 < C 3 < G 4 < T 5
KEY_SYM = np.array([2, 3, 4, 5, 1], np.uint64)


class FmCells(NamedTuple):
    """The FM-index's per-element work compiled for one target (`fm_cells`)."""

    suffix_key: Callable
    refine_run: Callable
    emit_row: Callable
    pack_block: Callable
    kmer_step: Callable
    window_of: Callable
    end_of: Callable
    match_window: Callable
    locate: Callable
    smem_count: Callable
    fill_smem: Callable
    order_seeds: Callable


@functools.cache
def fm_cells(t: Target) -> FmCells:
    """The index's and the seeding's shared cells, compiled for target t."""
    key_sym = KEY_SYM

    @t.jit
    def popcount(x):
        x = x - ((x >> _ONE) & _M1)
        x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
        x = (x + (x >> np.uint64(4))) & _M4
        x = x + (x >> np.uint64(8))
        x = x + (x >> np.uint64(16))
        x = x + (x >> np.uint64(32))
        return np.int64(x & np.uint64(0x7F))

    @t.jit
    def count_code(word, c, r):
        """Codes equal to c among the first r (0-32) rows of a packed word."""
        x = word ^ (np.uint64(c) * _M1)
        hits = ~(x | (x >> _ONE)) & _M1
        if r < 32:
            hits &= (_ONE << np.uint64(2 * r)) - _ONE
        return popcount(hits)

    @t.jit
    def lower_bound(a, x):
        """The first index of sorted int64 a holding a value >= x."""
        lo = 0
        hi = len(a)
        while lo < hi:
            mid = (lo + hi) >> 1
            if a[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return lo

    @t.jit
    def suffix_key(text, n, p):
        """The 63-bit key of text[p:p+21]: 3 bits a symbol, the first highest, 0 past the end."""
        key = np.uint64(0)
        for j in range(KEY_SYMBOLS):
            q = p + j
            s = key_sym[text[q]] if q < n else np.uint64(0)
            key = (key << np.uint64(3)) | s
        return key

    @t.jit
    def heapsort(keys, vals, a, b):
        """Sort keys[a:b] ascending in place, vals[a:b] along (no scratch: a GPU thread can run it)."""
        m = b - a
        start = m // 2 - 1
        end = m
        while end > 1:
            if start >= 0:
                root = start
                start -= 1
            else:
                end -= 1
                k, v = keys[a], vals[a]
                keys[a], vals[a] = keys[a + end], vals[a + end]
                keys[a + end], vals[a + end] = k, v
                root = 0
            while True:
                child = 2 * root + 1
                if child >= end:
                    break
                if child + 1 < end and keys[a + child + 1] > keys[a + child]:
                    child += 1
                if keys[a + root] < keys[a + child]:
                    k, v = keys[a + root], vals[a + root]
                    keys[a + root], vals[a + root] = keys[a + child], vals[a + child]
                    keys[a + child], vals[a + child] = k, v
                    root = child
                else:
                    break

    @t.jit
    def refine_run(text, n, pos, keys, brk, a, b, depth):
        """Order the suffixes pos[a:b], which share their first `depth` symbols, completely.

        brk[i] is 1 where row i starts a new run of suffixes still tied; every round the runs of
        more than one are sorted by their next 21 symbols and split where those differ, until each
        suffix stands alone (two suffixes differ by the time the shorter one ends)."""
        more = True
        while more:
            more = False
            i = a
            while i < b:
                j = i + 1
                while j < b and brk[j] == 0:
                    j += 1
                if j - i > 1:
                    more = True
                    for r in range(i, j):
                        keys[r] = suffix_key(text, n, pos[r] + depth)
                    heapsort(keys, pos, i, j)
                    for r in range(i + 1, j):
                        if keys[r] != keys[r - 1]:
                            brk[r] = 1
                i = j
            depth += KEY_SYMBOLS

    @t.jit
    def emit_row(text, n, seg_text, p, row, codes, ssa, seg_row):
        """Row `row` of the suffix array is text position p: its BWT code (the text before p; before 0,
        the last code, a SEP), its sampled entry, and, for a SEP, the row of the segment p starts."""
        c = text[p - 1] if p > 0 else text[n - 1]
        codes[row] = c
        if row % SA_SAMPLE == 0:
            ssa[row // SA_SAMPLE] = p
        if c == SEP:
            seg_row[lower_bound(seg_text, p + 1) - 1] = row

    @t.jit
    def pack_block(codes, n, blk, bwt):
        """Pack rows blk*64.. of codes into bwt's block blk (SEP as code 0); returns how many of each
        code 0-3 the block holds (SEP counted as 0) as (a, c, g, t)."""
        r0 = blk * BLOCK_ROWS
        counts_a = 0
        counts_c = 0
        counts_g = 0
        counts_t = 0
        for w in range(2):
            word = np.uint64(0)
            for j in range(32):
                r = r0 + 32 * w + j
                if r < n:
                    c = codes[r]
                    if c == SEP:
                        c = 0
                    word |= np.uint64(c) << np.uint64(2 * j)
                    if c == 0:
                        counts_a += 1
                    elif c == 1:
                        counts_c += 1
                    elif c == 2:
                        counts_g += 1
                    else:
                        counts_t += 1
            bwt[4 * blk + 2 + w] = word
        return counts_a, counts_c, counts_g, counts_t

    @t.jit
    def occ(bwt, sep_rows, c, i):
        """Rows before row i whose BWT code is c (a SEP is not an A)."""
        base = 4 * (i >> 6)
        r = i & 63
        word = bwt[base + (c >> 1)]
        if c & 1:
            word >>= np.uint64(32)
        cnt = np.int64(word & _LOW32)
        if r >= 32:
            cnt += count_code(bwt[base + 2], c, 32) + count_code(bwt[base + 3], c, r - 32)
        else:
            cnt += count_code(bwt[base + 2], c, r)
        if c == 0 and len(sep_rows) > 0:
            cnt -= lower_bound(sep_rows, i)
        return cnt

    @t.jit
    def extend(bwt, cum, sep_rows, lo, hi, c):
        """The suffix array interval [lo, hi) of a string with code c put before it (empty: lo >= hi)."""
        return cum[c] + occ(bwt, sep_rows, c, lo), cum[c] + occ(bwt, sep_rows, c, hi)

    @t.jit
    def kmer_step(bwt, cum, sep_rows, prev_lo, prev_hi, nxt_lo, nxt_hi, level, x):
        """Entry x of the (level+1)-mer table from the level-mer table: code x >> 2 level before k-mer
        x's low part. The 0-mer table is the whole interval [0, n)."""
        c = x >> (2 * level)
        w = x & ((1 << (2 * level)) - 1)
        lo = np.int64(prev_lo[w])
        hi = np.int64(prev_hi[w])
        if lo < hi:
            lo, hi = extend(bwt, cum, sep_rows, lo, hi, c)
        if lo >= hi:
            lo = 0
            hi = 0
        nxt_lo[x] = lo
        nxt_hi[x] = hi

    @t.jit
    def window_of(job_off, win_off, w, window):
        """Window w of the read strands: its strand's start a and its ends (e_lo, e_hi]; a strand of m
        ends has ceil(m / window) windows (win_off: their running count), taken from its last end."""
        j = lower_bound(win_off, w + 1) - 1
        a = job_off[j]
        e_hi = job_off[j + 1] - a - window * (w - win_off[j])
        e_lo = e_hi - window if e_hi > window else 0  # (CUDA's max of two ints does not compile here)
        return a, e_lo, e_hi

    @t.jit
    def end_of(job_off, g):
        """Entry g's read strand j, its end e (1..m) and the strand's length m."""
        j = lower_bound(job_off, g + 1) - 1
        return j, g - job_off[j] + 1, job_off[j + 1] - job_off[j]

    @t.jit
    def match_window(bwt, cum, sep_rows, kmer_lo, kmer_hi, k, q, a, e_lo, e_hi, min_len, starts, lo, hi, g0, sizes):
        """The longest match ending at each end e of the read strand q[a:] from e_hi down to e_lo + 1,
        reaching back no further than q[a]: its start relative to a into starts[g0 + e - 1] and its
        suffix array interval into lo/hi there; NOT_LONG (interval 0, 0) when shorter than min_len.

        Backward search from e, its last k symbols looked up in the k-mer table when k <= min_len (a
        k-mer that does not occur leaves the match shorter than min_len). `sizes` (scratch, its length
        the reach) keeps the interval sizes of the strings q[j:e'] that the ends e' > e of the window
        searched: once q[j:e] occurs as often as q[j:e'], every occurrence of it is followed by
        q[e:e'], so it extends left exactly as far as the match ending at e + 1 does, which contains it
        (its start is copied, and it is no seed). Most searches stop there, a few symbols in, instead
        of at the end of their match."""
        reach = len(sizes)
        for i in range(reach):
            sizes[i] = -1
        for e in range(e_hi, e_lo, -1):
            g = g0 + e - 1
            lo_ = np.int64(0)
            hi_ = cum[4]
            j = e
            contained = False
            if 0 < k <= min_len and e >= k:
                x = 0
                for p in range(e - k, e):
                    c = q[a + p]
                    if c > 3:
                        x = -1
                        break
                    x = 4 * x + c
                if x >= 0:
                    lo_ = np.int64(kmer_lo[x])
                    hi_ = np.int64(kmer_hi[x])
                    j = e - k
                    if lo_ >= hi_:
                        starts[g] = NOT_LONG
                        lo[g] = 0
                        hi[g] = 0
                        continue
                    t = e_hi - j
                    if t < reach:
                        contained = sizes[t] == hi_ - lo_
                        sizes[t] = hi_ - lo_
            while j > 0 and not contained:
                c = q[a + j - 1]
                if c > 3:
                    break
                nlo, nhi = extend(bwt, cum, sep_rows, lo_, hi_, c)
                if nlo >= nhi:
                    break
                lo_ = nlo
                hi_ = nhi
                j -= 1
                t = e_hi - j
                if t < reach:
                    contained = sizes[t] == hi_ - lo_
                    sizes[t] = hi_ - lo_
            if contained:
                starts[g] = starts[g + 1]
                lo_ = 0
                hi_ = 0
            elif e - j < min_len:
                starts[g] = NOT_LONG
                lo_ = 0
                hi_ = 0
            else:
                starts[g] = j
            lo[g] = lo_
            hi[g] = hi_

    @t.jit
    def locate(bwt, cum, sep_rows, sep_sa, ssa, row):
        """The text position of row's suffix: LF steps to a sampled row, or to a SEP row (a segment's start)."""
        steps = 0
        while True:
            if row % SA_SAMPLE == 0:
                return np.int64(ssa[row // SA_SAMPLE]) + steps
            blk = 4 * (row >> 6)
            r = row & 63
            word = bwt[blk + 2 + (r >> 5)]
            c = np.int64((word >> np.uint64(2 * (r & 31))) & np.uint64(3))
            if c == 0 and len(sep_rows) > 0:
                j = lower_bound(sep_rows, row)
                if j < len(sep_rows) and sep_rows[j] == row:
                    return sep_sa[j] + steps
            row = cum[c] + occ(bwt, sep_rows, c, row)
            steps += 1

    @t.jit
    def text_to_ref(seg_text, seg_ref, p):
        """A text position as a position in the contigs laid end to end."""
        s = lower_bound(seg_text, p + 1) - 1
        return seg_ref[s] + (p - seg_text[s])

    @t.jit
    def seed_key(rpos, qpos):
        """The order of a read strand's seeds, (rpos - qpos, qpos), as one int64 (reads < 2^29 bases)."""
        return ((rpos - qpos + (np.int64(1) << 31)) << 29) | qpos

    @t.jit
    def smem_count(starts, lo, hi, g, e, m, max_occ):
        """The seeds of the match ending at e (entry g of a read strand of m bases): its occurrences when
        it is long, super-maximal and occurs at most max_occ times, else 0.

        It is super-maximal when the match ending at e + 1 (entry g + 1) starts later or is short, or e
        is the end: longest matches' starts never decrease, so one that starts no later contains it."""
        s = starts[g]
        if s == NOT_LONG:
            return 0
        if e < m:
            nxt = starts[g + 1]
            if nxt != NOT_LONG and nxt <= s:
                return 0
        n_occ = np.int64(hi[g]) - np.int64(lo[g])
        return n_occ if n_occ <= max_occ else 0

    @t.jit
    def fill_smem(bwt, cum, sep_rows, sep_sa, ssa, seg_text, seg_ref, starts, lo, hi, g, e, job, at, read, qpos,
                  rpos, length, rc):  # fmt: skip
        """The seeds of the match ending at e (entry g) of job (read job >> 1, reverse complement when
        odd), one an occurrence, written from `at`."""
        s = starts[g]
        for row in range(np.int64(lo[g]), np.int64(hi[g])):
            rpos[at] = text_to_ref(seg_text, seg_ref, locate(bwt, cum, sep_rows, sep_sa, ssa, row))
            read[at] = job >> 1
            qpos[at] = s
            length[at] = e - s
            rc[at] = (job & 1) == 1
            at += 1

    @t.jit
    def order_seeds(rpos, qpos, keys, perm, a, b):
        """perm[a:b]: seeds a..b-1 (one read strand's) in the order (rpos - qpos, qpos); no two tie."""
        for i in range(a, b):
            keys[i] = seed_key(np.int64(rpos[i]), np.int64(qpos[i]))
            perm[i] = i
        heapsort(keys, perm, a, b)

    return FmCells(suffix_key, refine_run, emit_row, pack_block, kmer_step, window_of, end_of, match_window, locate,
                   smem_count, fill_smem, order_seeds)
