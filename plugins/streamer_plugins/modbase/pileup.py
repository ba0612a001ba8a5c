"""Incremental per-site counts of modified-base calls: the state behind `streamer pileup`.

`PileupCounts.add(records)` takes any batch of BAM records (sorted or not) and adds what each
primary alignment contributes to its sites; counts only ever add up, so a batch is counted
once however the batches are cut. `rows()` turns the current counts into bedMethyl rows at
any time (a live snapshot); `release_before()` hands over and frees the sites no later read
of a coordinate-sorted input can reach.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import pysam

from streamer_plugins.modbase import tally
from streamer_plugins.modbase.caller import FAIL, Thresholds, call_positions, ignore_code
from streamer_plugins.modbase.motifs import MotifSites
from streamer_plugins.modbase.tags import DEFAULT_IMPLICIT, ModGroup, ModTagError, NoModTags, forward_codes, read_mod_groups

log = logging.getLogger("streamer.pileup")
_SEQ_CODE = np.full(256, 4, dtype=np.uint8)
for _i, _b in enumerate("ACGT"):
    _SEQ_CODE[ord(_b)] = _i


@dataclass(frozen=True)
class CallOptions:
    """How a read's probabilities become calls and rows (modkit's options of the same names)."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    ignore: str | None = None
    combine_mods: bool = False
    force_allow_implicit: bool = False


def is_used(rec: pysam.AlignedSegment) -> bool:
    """Primary, mapped, not a duplicate, with a sequence: the records modkit's pileup reads."""
    return not (rec.is_unmapped or rec.is_secondary or rec.is_supplementary or rec.is_duplicate
                or rec.reference_id < 0 or not rec.query_length)


def usable_groups(rec: pysam.AlignedSegment, fseq: np.ndarray, ignore: str | None) -> tuple[list[ModGroup], str]:
    """The record's call groups after `--ignore`, and read_mod_groups' note on extra ML values.

    Raises ModTagError when modkit would not use the record's calls.
    """
    groups, note = read_mod_groups(rec, fseq)
    if all(len(g.positions) == 0 for g in groups):
        raise NoModTags("no modified-base calls")
    if ignore is not None:
        for g in groups:
            g.codes, g.probs = ignore_code(g.codes, g.probs, ignore)
    return groups, note


class PileupCounts:
    """Per-site tallies over the contigs of one BAM header, optionally restricted to motif sites and a region."""

    def __init__(self, contigs: list[tuple[str, int]], options: CallOptions,
                 sites: dict[str, MotifSites] | None = None, region: tuple[str, int, int] | None = None):
        self.names = [n for n, _ in contigs]
        self.tid = {n: i for i, n in enumerate(self.names)}
        lengths = np.array([ln for _, ln in contigs], dtype=np.int64)
        # contigs start on block boundaries, so a block belongs to one contig
        padded = (lengths + tally.BLOCK - 1) // tally.BLOCK * tally.BLOCK
        self.goff = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
        self.options = options
        self.sites = sites
        if region is None:
            self.lo, self.hi = 0, int(self.goff[-1])
        else:
            name, start, end = region
            self.lo, self.hi = int(self.goff[self.tid[name]] + start), int(self.goff[self.tid[name]] + end)
        self.entries: list[tuple[int, str | None]] = []  # (primary base, mod code or None for canonical)
        self._entry_index: dict[tuple[int, str | None], int] = {}
        self.block_slot = np.full(int(self.goff[-1] // tally.BLOCK) + 1, -1, dtype=np.int64)
        self._free: list[int] = []
        self._used = 0
        self.counts = np.zeros((0, 2 * tally.BLOCK, tally.FIRST_ENTRY), np.uint32)
        self.masks = np.zeros((0, 2 * tally.BLOCK), np.uint64)
        self.focus = np.zeros((0, tally.BLOCK), np.uint8)
        self.n_reads = 0
        self.n_calls = 0
        self._implicit_noted = False

    # registry of (primary base, class) columns ---------------------------------------------------
    def entry(self, base: int, code: str | None) -> int:
        key = (base, code)
        idx = self._entry_index.get(key)
        if idx is None:
            idx = len(self.entries)
            if idx >= 64:
                raise ModTagError("more than 64 (base, modification) classes in one pileup")
            self.entries.append(key)
            self._entry_index[key] = idx
            self.counts = np.concatenate([self.counts, np.zeros(self.counts.shape[:2] + (1,), np.uint32)], axis=2)
        return idx

    # blocks -----------------------------------------------------------------------------------------
    def _ensure_blocks(self, block_ids: np.ndarray) -> None:
        missing = block_ids[self.block_slot[block_ids] < 0]
        for b in missing.tolist():
            slot = self._free.pop() if self._free else self._new_slot()
            self.block_slot[b] = slot
            self.counts[slot] = 0
            self.masks[slot] = 0
            self.focus[slot] = self._block_focus(b)

    def _new_slot(self) -> int:
        if self._used == len(self.counts):
            grow = max(64, len(self.counts))
            self.counts = np.concatenate([self.counts, np.zeros((grow,) + self.counts.shape[1:], np.uint32)])
            self.masks = np.concatenate([self.masks, np.zeros((grow,) + self.masks.shape[1:], np.uint64)])
            self.focus = np.concatenate([self.focus, np.zeros((grow,) + self.focus.shape[1:], np.uint8)])
        self._used += 1
        return self._used - 1

    def _block_focus(self, block: int) -> np.ndarray:
        if self.sites is None:
            return np.full(tally.BLOCK, 3, np.uint8)
        start = block * tally.BLOCK
        tid = int(np.searchsorted(self.goff, start, side="right") - 1)
        out = np.zeros(tally.BLOCK, np.uint8)
        sites = self.sites.get(self.names[tid])
        if sites is not None:
            local = start - self.goff[tid]
            pos, bits = sites.positions, sites.bit_values
            a, b = np.searchsorted(pos, [local, local + tally.BLOCK])
            out[pos[a:b] - local] = bits[a:b]
        return out

    # reads -------------------------------------------------------------------------------------------
    def add(self, records) -> int:
        """Add a batch of (record, source file) pairs; returns the number of calls counted.

        Records that modkit's pileup would not read are passed over; bad tags log one line naming
        the file and read, and that read's bases count as no call.
        """
        batch = _Batch()
        for rec, source in records:
            if is_used(rec):
                self._add_record(batch, rec, source)
        if not batch.gstart:
            return 0
        arrays = batch.arrays()
        first = arrays["gstart"] >> tally.SHIFT
        last = (arrays["gend"] - 1) >> tally.SHIFT
        blocks = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
        lo_b, hi_b = self.lo >> tally.SHIFT, (self.hi - 1) >> tally.SHIFT
        self._ensure_blocks(blocks[(blocks >= lo_b) & (blocks <= hi_b)])
        n = tally.accumulate(self.counts, self.masks, self.focus, self.block_slot, self.lo, self.hi,
                             arrays["gstart"], arrays["rev"], arrays["mask_plus"], arrays["mask_minus"],
                             arrays["cig_off"], arrays["cig"], arrays["seq_off"], arrays["seq"],
                             arrays["pc_off"], arrays["pc_q"], arrays["pc_col"],
                             arrays["nc_off"], arrays["nc_q"], arrays["nc_col"])
        self.n_reads += len(batch.gstart)
        self.n_calls += int(n)
        return int(n)

    def _add_record(self, batch: "_Batch", rec: pysam.AlignedSegment, source: str) -> None:
        seq = rec.query_sequence
        fseq = forward_codes(rec)
        length = len(seq)
        plus_q, plus_c, minus_q, minus_c = [], [], [], []
        mask_plus = mask_minus = 0
        try:
            groups, note = usable_groups(rec, fseq, self.options.ignore)
            if note:
                log.warning("%s: read %s: %s", source, rec.query_name, note)
            if not self.options.force_allow_implicit and any(g.mode == DEFAULT_IMPLICIT for g in groups):
                if not self._implicit_noted:
                    log.warning("%s: read %s (and any others like it) has MM entries without '?' or '.'; such reads "
                                "count as no call (modkit's default; --force-allow-implicit reads them as '.')",
                                source, rec.query_name)
                    self._implicit_noted = True
                groups = []
        except NoModTags:
            groups = []
        except ModTagError as exc:
            log.warning("%s: read %s: %s; its bases count as no call", source, rec.query_name, exc)
            groups = []
        for g in groups:
            tb = g.threshold_base
            bit = 0
            for j, code in enumerate(g.codes):
                if (~np.isnan(g.probs[:, j])).any():
                    bit |= 1 << self.entry(tb, code)
            cols = self._columns(g, tb)
            q = g.positions if not rec.is_reverse else length - 1 - g.positions
            if g.minus:
                minus_q.append(q)
                minus_c.append(cols)
            else:
                plus_q.append(q)
                plus_c.append(cols)
            if g.minus == rec.is_reverse:
                mask_plus |= bit
            else:
                mask_minus |= bit
        batch.add(self.goff[rec.reference_id] + rec.reference_start, self.goff[rec.reference_id] + rec.reference_end,
                  rec.is_reverse, mask_plus, mask_minus, rec.cigartuples,
                  _SEQ_CODE[np.frombuffer(seq.encode(), np.uint8)], plus_q, plus_c, minus_q, minus_c)

    def _columns(self, g: ModGroup, tb: int) -> np.ndarray:
        calls = call_positions(g.probs, g.codes, tb, self.options.thresholds)
        table = np.array([tally.FIRST_ENTRY + self.entry(tb, c) for c in g.codes]
                         + [tally.FIRST_ENTRY + self.entry(tb, None), tally.FAIL], dtype=np.int64)
        return table[np.where(calls == FAIL, len(g.codes) + 1, calls)]

    # rows ------------------------------------------------------------------------------------------
    def rows(self, blocks: np.ndarray | None = None) -> np.ndarray:
        """bedMethyl counts (see tally.decode) of the given blocks, default all, in position order."""
        if blocks is None:
            blocks = np.flatnonzero(self.block_slot >= 0)
        slots = self.block_slot[blocks]
        reg_base = np.array([b for b, _ in self.entries], dtype=np.int64)
        reg_canon = np.array([c is None for _, c in self.entries], dtype=np.bool_)
        out = np.zeros((0, 11), np.int64)
        n = tally.decode(self.counts, self.masks, slots, blocks, reg_base, reg_canon, self.options.combine_mods, out)
        out = np.zeros((n, 11), np.int64)
        tally.decode(self.counts, self.masks, slots, blocks, reg_base, reg_canon, self.options.combine_mods, out)
        return out

    def release_before(self, gpos: int) -> np.ndarray:
        """Rows of every block that ends at or before global position `gpos`; those blocks are freed."""
        blocks = np.flatnonzero(self.block_slot >= 0)
        blocks = blocks[(blocks + 1) * tally.BLOCK <= gpos]
        rows = self.rows(blocks)
        self._free.extend(self.block_slot[blocks].tolist())
        self.block_slot[blocks] = -1
        return rows


class _Batch:
    """Per-read arrays gathered in Python lists, flattened once per batch for the kernel."""

    def __init__(self):
        self.gstart, self.gend, self.rev, self.mplus, self.mminus = [], [], [], [], []
        self.cigars, self.seqs, self.pq, self.pc, self.nq, self.nc = [], [], [], [], [], []

    def add(self, gstart, gend, rev, mplus, mminus, cigar, seq, plus_q, plus_c, minus_q, minus_c):
        self.gstart.append(gstart)
        self.gend.append(gend)
        self.rev.append(rev)
        self.mplus.append(mplus)
        self.mminus.append(mminus)
        self.cigars.append(cigar)
        self.seqs.append(seq)
        for qs, cs, q_out, c_out in ((plus_q, plus_c, self.pq, self.pc), (minus_q, minus_c, self.nq, self.nc)):
            q = np.concatenate(qs) if qs else np.zeros(0, np.int64)
            c = np.concatenate(cs) if cs else np.zeros(0, np.int64)
            order = np.argsort(q, kind="stable")
            q_out.append(q[order])
            c_out.append(c[order])

    def arrays(self) -> dict[str, np.ndarray]:
        cig_len = np.array([len(c) for c in self.cigars], dtype=np.int64)
        return {
            "gstart": np.array(self.gstart, np.int64), "gend": np.array(self.gend, np.int64),
            "rev": np.array(self.rev, np.bool_),
            "mask_plus": np.array(self.mplus, np.uint64), "mask_minus": np.array(self.mminus, np.uint64),
            "cig_off": _offsets(cig_len),
            "cig": np.fromiter(chain.from_iterable(chain.from_iterable(self.cigars)), np.int64,
                               count=2 * int(cig_len.sum())).reshape(-1, 2),
            "seq_off": _offsets(np.array([len(s) for s in self.seqs], np.int64)),
            "seq": np.concatenate(self.seqs),
            "pc_off": _offsets(np.array([len(q) for q in self.pq], np.int64)),
            "pc_q": np.concatenate(self.pq).astype(np.int64), "pc_col": np.concatenate(self.pc).astype(np.int64),
            "nc_off": _offsets(np.array([len(q) for q in self.nq], np.int64)),
            "nc_q": np.concatenate(self.nq).astype(np.int64), "nc_col": np.concatenate(self.nc).astype(np.int64),
        }


def _offsets(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
