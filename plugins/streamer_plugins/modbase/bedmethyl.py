"""modkit 0.4.4's bedMethyl rows from pileup counts: motif labels, strand combining, order, text.

Rows are ordered by contig (header order), position, then strand (`+`, `-`, `.`) and mod code
(letters before ChEBI numbers), motifs in command-line order within a code; combined strands
order motifs before codes, as modkit does. Column 11 is Nmod / Nvalid_cov * 100 in float32
printed with two decimals. Columns 1-10 are tab-separated; 10-18 by tabs, or by single spaces
with `--mixed-delim`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamer_plugins.modbase.motifs import Motif, MotifSites
from streamer_plugins.modbase.pileup import PileupCounts
from streamer_plugins.modbase.rowtext import render_text

# columns of PileupCounts.rows()
POS, STRAND, ENTRY, COV, NMOD, NCAN, NOTHER, NDEL, NFAIL, NDIFF, NNOCALL = range(11)


@dataclass(frozen=True)
class Layout:
    """What shapes the rows: motifs (with their sites per contig), combined strands, delimiters."""

    motifs: tuple[Motif, ...] = ()
    sites: dict[str, MotifSites] | None = None
    combine_strands: bool = False
    mixed_delim: bool = False


def _code_key(code: str) -> tuple[int, int]:
    return (1, int(code)) if code.isdigit() else (0, ord(code))


@dataclass
class Table:
    """Rows expanded per motif, with combined-strand rows moved to their `+` position (strand 2)."""

    gpos: np.ndarray
    tid: np.ndarray
    pos: np.ndarray
    strand: np.ndarray
    motif: np.ndarray
    entry: np.ndarray
    values: np.ndarray  # Nvalid_cov .. Nnocall

    def take(self, sel) -> "Table":
        return Table(*(getattr(self, f)[sel] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(a: "Table", b: "Table") -> "Table":
        return Table(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in a.__dataclass_fields__))


def expand(rows: np.ndarray, counts: PileupCounts, layout: Layout) -> Table:
    """Rows of PileupCounts.rows() as a Table: per motif id, and moved to the `+` site when combining strands."""
    tid = np.searchsorted(counts.goff, rows[:, POS], side="right") - 1
    pos = rows[:, POS] - counts.goff[tid]
    strand = rows[:, STRAND].copy()
    motif = np.zeros(len(rows), np.int64)
    if layout.sites is not None:
        rows, tid, pos, strand, motif = _with_motifs(rows, tid, pos, strand, counts, layout.sites)
    if layout.combine_strands:
        shift = np.array([m.rc_offset - m.offset for m in layout.motifs], dtype=np.int64)
        pos = np.where(strand == 1, pos - shift[motif], pos)
        strand = np.full(len(rows), 2, np.int64)
    return Table(counts.goff[tid] + pos, tid, pos, strand, motif, rows[:, ENTRY].copy(), rows[:, COV:].copy())


def _codes(counts: PileupCounts) -> list[str]:
    if counts.options.combine_mods:
        return list("ACGT")
    return [c if c is not None else "~" for _, c in counts.entries]  # canonical entries never name a row


def render(table: Table, counts: PileupCounts, layout: Layout) -> str:
    """bedMethyl text of a Table, in modkit's order; combined strands are summed here."""
    if not len(table.gpos):
        return ""
    codes = _codes(counts)
    rank = np.zeros(len(codes), np.int64)
    rank[sorted(range(len(codes)), key=lambda i: _code_key(codes[i]))] = np.arange(len(codes))
    if layout.combine_strands:
        key = np.stack([table.tid, table.pos, table.motif, rank[table.entry], table.entry], axis=1)
        key, inverse = np.unique(key, axis=0, return_inverse=True)
        summed = np.zeros((len(key), table.values.shape[1]), np.int64)
        np.add.at(summed, inverse.ravel(), table.values)
        table = Table(key[:, 0], key[:, 0], key[:, 1], np.full(len(key), 2, np.int64), key[:, 2], key[:, 4], summed)
        order = np.arange(len(key))
    else:
        order = np.lexsort((table.motif, rank[table.entry], table.strand, table.pos, table.tid))
    values = table.values[order]
    percent = values[:, 1].astype(np.float32) / values[:, 0].astype(np.float32) * np.float32(100)
    entry, motif = table.entry[order], table.motif[order]
    if len(layout.motifs) >= 2:
        pairs, name = np.unique(np.stack([entry, motif], axis=1), axis=0, return_inverse=True)
        labels = [f"{codes[e]},{layout.motifs[m].label}" for e, m in pairs.tolist()]
    else:
        labels, name = codes, entry
    return render_text(table.tid[order], table.pos[order], name.ravel(), table.strand[order], values, percent,
                       labels, counts.names, layout.mixed_delim)


class BedMethylWriter:
    """Writes rows as their sites are released; keeps back what the next release may still add to."""

    def __init__(self, out, counts: PileupCounts, layout: Layout):
        self.out = out
        self.counts = counts
        self.layout = layout
        self.pending: Table | None = None
        self.margin = max((m.rc_offset - m.offset for m in layout.motifs), default=0) if layout.combine_strands else 0

    def write(self, rows: np.ndarray, boundary: int | None = None) -> None:
        """Rows released below global position `boundary` (None: the last rows)."""
        table = expand(rows, self.counts, self.layout)
        if self.pending is not None:
            table = Table.concat(self.pending, table)
        if boundary is None:
            ready, self.pending = table, None
        else:
            keep = table.gpos >= boundary - self.margin
            ready, self.pending = table.take(~keep), table.take(keep)
        self.out.write(render(ready, self.counts, self.layout))


def _with_motifs(rows, tid, pos, strand, counts: PileupCounts, sites: dict[str, MotifSites]):
    """One row per motif id at each row's site and strand; rows at no motif site are dropped."""
    parts = []
    for t in np.unique(tid).tolist():
        sel = np.flatnonzero(tid == t)
        s = sites.get(counts.names[t])
        if s is None:
            continue
        key = pos[sel] * 2 + strand[sel]
        a = np.searchsorted(s.keys, key, side="left")
        b = np.searchsorted(s.keys, key, side="right")
        n = b - a
        idx = np.repeat(sel, n)
        starts = np.repeat(a - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
        parts.append((idx, s.ids[starts + np.arange(len(idx))]))
    if not parts:
        empty = np.zeros(0, np.int64)
        return rows[:0], empty, empty, empty, empty
    idx = np.concatenate([p[0] for p in parts])
    ids = np.concatenate([p[1] for p in parts])
    return rows[idx], tid[idx], pos[idx], strand[idx], ids
