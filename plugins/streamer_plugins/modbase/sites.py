"""Where per-site tallies live: rows of a count pool, allocated per block of reference positions.

A block gets its rows when a read first reaches it and gives them back when released (sorted
input), so memory follows the covered part of the genome. Without motifs a block has two rows
per position; with motifs, one per motif site and allowed strand (see tally.py).
"""

from __future__ import annotations

import numpy as np

from streamer_plugins.modbase import tally
from streamer_plugins.modbase.motifs import MotifSites


class SiteStore:
    """Count rows per site and strand over the contigs laid end to end (each from a block boundary)."""

    def __init__(self, goff: np.ndarray, names: list[str], sites: dict[str, MotifSites] | None):
        n_blocks = int(goff[-1] // tally.BLOCK) + 1
        self.block_row = np.full(n_blocks, -1, np.int64)
        self.dense = sites is None
        if self.dense:
            self.site_off = np.zeros(n_blocks + 1, np.int64)
            self.site_rel = self.site_bits = self.site_row = np.zeros(0, np.int64)
            self.block_rows = np.full(n_blocks, 2 * tally.BLOCK, np.int64)
        else:
            gpos = np.concatenate([goff[i] + sites[n].positions for i, n in enumerate(names) if n in sites] or [[]])
            bits = np.concatenate([sites[n].bit_values for n in names if n in sites] or [[]]).astype(np.int64)
            gpos = gpos.astype(np.int64)
            self.site_off = np.searchsorted(gpos, np.arange(n_blocks + 1) * tally.BLOCK).astype(np.int64)
            self.site_rel = (gpos & (tally.BLOCK - 1)).astype(np.int16)
            self.site_bits = bits.astype(np.uint8)
            cum = np.concatenate([[0], np.cumsum((bits & 1) + (bits >> 1 & 1))]).astype(np.int64)
            first = cum[self.site_off[:-1]]  # rows before each block's first site
            # a site's first row within its block (at most 2 * BLOCK rows a block)
            self.site_row = (cum[:-1] - first[gpos >> tally.SHIFT]).astype(np.int16)
            self.block_rows = cum[self.site_off[1:]] - first
        self.counts = np.zeros((0, tally.FIRST_ENTRY), np.uint32)
        self.masks = np.zeros(0, np.uint64)
        self._top = 0
        self._free: dict[int, list[int]] = {}

    def layout(self) -> tuple:
        """The kernels' view of where rows are."""
        return self.block_row, self.dense, self.site_off, self.site_rel, self.site_bits, self.site_row

    def add_column(self) -> None:
        self.counts = np.concatenate([self.counts, np.zeros((len(self.counts), 1), np.uint32)], axis=1)

    def allocate(self, blocks: np.ndarray) -> None:
        """Give rows to the blocks that have none (blocks without a site get none)."""
        for b in blocks[self.block_row[blocks] < 0].tolist():
            n = int(self.block_rows[b])
            if n == 0:
                continue
            spare = self._free.get(n)
            start = spare.pop() if spare else self._bump(n)
            self.counts[start:start + n] = 0
            self.masks[start:start + n] = 0
            self.block_row[b] = start

    def _bump(self, n: int) -> int:
        if self._top + n > len(self.counts):
            grow = max(self._top + n, 2 * len(self.counts), 1 << 16) - len(self.counts)
            self.counts = np.concatenate([self.counts, np.zeros((grow, self.counts.shape[1]), np.uint32)])
            self.masks = np.concatenate([self.masks, np.zeros(grow, np.uint64)])
        self._top += n
        return self._top - n

    def allocated(self) -> np.ndarray:
        return np.flatnonzero(self.block_row >= 0)

    def release(self, blocks: np.ndarray) -> None:
        for b in blocks.tolist():
            self._free.setdefault(int(self.block_rows[b]), []).append(int(self.block_row[b]))
        self.block_row[blocks] = -1

    def rows(self, blocks: np.ndarray, reg_base: np.ndarray, reg_canon: np.ndarray, combine: bool) -> np.ndarray:
        """bedMethyl counts of the blocks (tally.decode's columns), in position order."""
        args = (self.counts, self.masks, blocks, *self.layout(), reg_base, reg_canon, combine)
        n = tally.decode(*args, np.zeros((0, 11), np.int64))
        out = np.zeros((n, 11), np.int64)
        tally.decode(*args, out)
        return out
