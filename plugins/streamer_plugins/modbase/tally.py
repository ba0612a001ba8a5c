"""numba kernels: per-site tallies from a batch of reads, and bedMethyl counts from the tallies.

Sites live in blocks of BLOCK reference positions. A site row (one per position and strand
that can have rows) holds uint32 counts in columns DELETE, FAIL, NOCALL+base (A C G T) and one
column per (primary base, class) of the registry, and a uint64 mask of the mod codes the
covering reads declare (bit = registry entry). Without motifs every position of a block has
two rows ('+' then '-'); with motifs only the motif sites have rows, one per strand their rule
allows (`Layout`), so a CpG-only pileup of a human genome holds ~56 M rows, not 6 G. Every
aligned or deleted reference position of a read adds exactly what modkit's pileup adds there,
so tallies of read batches simply add up.
The kernels take the store's and the batch's flat arrays, a dozen or more, as numba needs;
`PileupCounts` (`pileup.py`) and the site table (`sites.py`) unpack them once per batch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SHIFT = 12
BLOCK = 1 << SHIFT
DELETE, FAIL, NOCALL = 0, 1, 2
FIRST_ENTRY = 6  # column of registry entry 0


@njit(nogil=True, cache=True)
def _rows_at(gp, block_row, dense, site_off, site_rel, site_bits, site_row):
    """(row of '+', row of '-') at global position gp; -1 where the site has no such row."""
    base = block_row[gp >> SHIFT]
    if base < 0:
        return -1, -1
    rel = gp & (BLOCK - 1)
    if dense:
        return base + 2 * rel, base + 2 * rel + 1
    lo = site_off[gp >> SHIFT]
    hi = site_off[(gp >> SHIFT) + 1]
    lo += np.searchsorted(site_rel[lo:hi], rel)
    if lo >= hi or site_rel[lo] != rel:
        return -1, -1
    bits = site_bits[lo]
    first = base + site_row[lo]
    plus = first if bits & 1 else -1
    minus = (first + 1 if bits & 1 else first) if bits & 2 else -1
    return plus, minus


@njit(nogil=True, cache=True)
def accumulate(counts, masks, block_row, dense, site_off, site_rel, site_bits, site_row, lo, hi, gstart, rev,
               mask_plus, mask_minus, cig_off, cig, seq_off, seq, pc_off, pc_q, pc_col, nc_off, nc_q, nc_col):
    """Add a batch of reads to the tallies; returns the number of calls counted.

    Per read: global reference start, reverse flag, the mod-code masks its covered sites get
    on the + and - strand, CIGAR (op, length) rows, SEQ as codes 0..3 (4 other) in SEQ order,
    and its calls sorted by SEQ index: `pc_*` from MM '+' entries (counted on the alignment
    strand), `nc_*` from MM '-' entries (the opposite strand), as column numbers.
    """
    n_calls = 0
    for r in range(len(gstart)):
        g = gstart[r]
        q = 0
        astrand = 1 if rev[r] else 0
        pi, pe = pc_off[r], pc_off[r + 1]
        ni, ne = nc_off[r], nc_off[r + 1]
        s0 = seq_off[r]
        for k in range(cig_off[r], cig_off[r + 1]):
            op, ln = cig[k, 0], cig[k, 1]
            if op == 0 or op == 7 or op == 8 or op == 2:
                for j in range(ln):
                    gp = g + j
                    qq = q + j
                    if op != 2:
                        while pi < pe and pc_q[pi] < qq:
                            pi += 1
                        while ni < ne and nc_q[ni] < qq:
                            ni += 1
                    if gp < lo or gp >= hi:
                        continue
                    plus, minus = _rows_at(gp, block_row, dense, site_off, site_rel, site_bits, site_row)
                    if plus < 0 and minus < 0:
                        continue
                    if plus >= 0:
                        masks[plus] |= mask_plus[r]
                    if minus >= 0:
                        masks[minus] |= mask_minus[r]
                    own = minus if astrand else plus
                    if op == 2:
                        if own >= 0:
                            counts[own, DELETE] += 1
                        continue
                    b = seq[s0 + qq]
                    if b > 3:
                        continue
                    has_p = pi < pe and pc_q[pi] == qq
                    has_n = ni < ne and nc_q[ni] == qq
                    if not has_p and not has_n:
                        if own >= 0:
                            counts[own, NOCALL + (b if astrand == 0 else 3 - b)] += 1
                        continue
                    if has_p and own >= 0:
                        counts[own, pc_col[pi]] += 1
                        n_calls += 1
                    opposite = plus if astrand else minus
                    if has_n and opposite >= 0:
                        counts[opposite, nc_col[ni]] += 1
                        n_calls += 1
                g += ln
                if op != 2:
                    q += ln
            elif op == 3:
                g += ln
            elif op == 1 or op == 4:
                q += ln
    return n_calls


@njit(nogil=True, cache=True)
def _site_rows(c, mask, reg_base, reg_canon, combine, out, row, gpos, strand):
    """Rows of one site and strand; writes them at `row` when `out` has room, returns the new row."""
    nreg = len(reg_base)
    tot = np.zeros(4, np.int64)
    mods = np.zeros(4, np.int64)
    for e in range(nreg):
        v = c[FIRST_ENTRY + e]
        tot[reg_base[e]] += v
        if not reg_canon[e]:
            mods[reg_base[e]] += v
    for p in range(4):
        if tot[p] == 0:
            continue
        diff = 0
        for b in range(4):
            if b != p:
                diff += c[NOCALL + b] + tot[b]
        for e in range(-1, nreg):
            if combine:
                if e >= 0:
                    break
                nmod = mods[p]
                entry = p
            else:
                if e < 0 or reg_base[e] != p or reg_canon[e] or not (mask >> np.uint64(e)) & np.uint64(1):
                    continue
                nmod = c[FIRST_ENTRY + e]
                entry = e
            if row < out.shape[0]:
                out[row, 0] = gpos
                out[row, 1] = strand
                out[row, 2] = entry
                out[row, 3] = tot[p]
                out[row, 4] = nmod
                out[row, 5] = tot[p] - mods[p]
                out[row, 6] = mods[p] - nmod
                out[row, 7] = c[DELETE]
                out[row, 8] = c[FAIL]
                out[row, 9] = diff
                out[row, 10] = c[NOCALL + p]
            row += 1
    return row


@njit(nogil=True, cache=True)
def decode(counts, masks, blocks, block_row, dense, site_off, site_rel, site_bits, site_row, reg_base, reg_canon,
           combine, out):
    """bedMethyl counts of the given blocks, in position then strand order.

    Columns of `out`: global position, strand, entry (registry entry, or the primary base
    with `combine`), Nvalid_cov, Nmod, Ncanonical, Nother_mod, Ndelete, Nfail, Ndiff,
    Nnocall. Returns the number of rows; when `out` is too small, only that number is right.
    """
    row = 0
    for i in range(len(blocks)):
        b = blocks[i]
        base = block_row[b]
        n_pos = BLOCK if dense else site_off[b + 1] - site_off[b]
        for k in range(n_pos):
            if dense:
                rel, r0, bits = k, base + 2 * k, 3
            else:
                s = site_off[b] + k
                rel, r0, bits = site_rel[s], base + site_row[s], site_bits[s]
            for strand in range(2):
                if not bits & (1 << strand):
                    continue
                r = r0 + (1 if strand == 1 and bits & 1 else 0)
                c = counts[r]
                called = False
                for e in range(len(reg_base)):
                    if c[FIRST_ENTRY + e] > 0:
                        called = True
                        break
                if called:
                    row = _site_rows(c, masks[r], reg_base, reg_canon, combine, out, row, b * BLOCK + rel, strand)
    return row
