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

from streamer_plugins.modbase import fastcalls, tally
from streamer_plugins.modbase.caller import FAIL, Thresholds, call_positions, hash_order, ignore_code
from streamer_plugins.modbase.motifs import MotifSites
from streamer_plugins.modbase.parsed import SEQ_CODE, offsets, parse_records
from streamer_plugins.modbase.sites import SiteStore
from streamer_plugins.modbase.tags import DEFAULT_IMPLICIT, ModGroup, ModTagError, NoModTags, forward_codes, read_mod_groups

log = logging.getLogger("streamer.pileup")


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
        if region is None:
            self.lo, self.hi = 0, int(self.goff[-1])
        else:
            name, start, end = region
            self.lo, self.hi = int(self.goff[self.tid[name]] + start), int(self.goff[self.tid[name]] + end)
        self.entries: list[tuple[int, str | None]] = []  # (primary base, mod code or None for canonical)
        self._entry_index: dict[tuple[int, str | None], int] = {}
        self.store = SiteStore(self.goff, self.names, sites)
        self.n_reads = 0
        self.n_calls = 0
        self.touched = np.zeros(0, np.int64)  # blocks the last add() reached: rows(touched) are the updated sites
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
            self.store.add_column()
        return idx

    # reads -------------------------------------------------------------------------------------------
    def add(self, records) -> int:
        """Add a batch of (record, source file) pairs; returns the number of calls counted.

        Records that modkit's pileup would not read are passed over; bad tags log one line naming
        the file and read, and that read's bases count as no call. Usual tags are read for the
        whole batch in numba (fastcalls.py), any other form through tags.py.
        """
        self.touched = np.zeros(0, np.int64)
        used = [(rec, source) for rec, source in records if is_used(rec)]
        if not used:
            return 0
        slow: list = []
        n = 0
        if self.options.ignore is None:
            fast = _Batch()
            slow = self._add_fast(fast, used)
            n += self._accumulate(fast.arrays(seq_codes=True))
        else:
            slow = used
        if slow:
            batch = _Batch()
            for rec, source in slow:
                self._add_record(batch, rec, source)
            n += self._accumulate(batch.arrays())
        self.n_reads += len(used)
        self.n_calls += n
        return n

    def _accumulate(self, arrays: dict[str, np.ndarray]) -> int:
        if not len(arrays["gstart"]):
            return 0
        first = arrays["gstart"] >> tally.SHIFT
        last = (arrays["gend"] - 1) >> tally.SHIFT
        blocks = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]))
        lo_b, hi_b = self.lo >> tally.SHIFT, (self.hi - 1) >> tally.SHIFT
        blocks = blocks[(blocks >= lo_b) & (blocks <= hi_b)]
        self.store.allocate(blocks)
        self.touched = np.union1d(self.touched, blocks)
        return int(tally.accumulate(self.store.counts, self.store.masks, *self.store.layout(), self.lo, self.hi,
                                    arrays["gstart"], arrays["rev"], arrays["mask_plus"], arrays["mask_minus"],
                                    arrays["cig_off"], arrays["cig"], arrays["seq_off"], arrays["seq"],
                                    arrays["pc_off"], arrays["pc_q"], arrays["pc_col"],
                                    arrays["nc_off"], arrays["nc_q"], arrays["nc_col"]))

    def _add_fast(self, batch: "_Batch", used: list) -> list:
        """Read the usual tags of `used` in numba into `batch`; returns the records left for tags.py."""
        parsed = parse_records([rec for rec, _ in used])
        g, rev, n_reads = parsed.groups, parsed.rev, len(used)
        tables, g_table, mask_plus, mask_minus = self._fast_tables(g, parsed.codes, rev, used)
        n_seq = len(parsed.seq)
        pc_off, nc_off = np.zeros(n_reads + 1, np.int64), np.zeros(n_reads + 1, np.int64)
        pc_q, pc_col = np.zeros(n_seq, np.int64), np.zeros(n_seq, np.int64)
        nc_q, nc_col = np.zeros(n_seq, np.int64), np.zeros(n_seq, np.int64)
        fastcalls.calls(n_reads, parsed.seq_off, rev, g["read"], g["minus"].astype(np.bool_), g["ncodes"], g["pos_off"],
                        g["pos_end"], g_table, parsed.positions, parsed.probs, *tables,
                        pc_off, pc_q, pc_col, nc_off, nc_q, nc_col)
        keep = parsed.status == fastcalls.OK
        for i in np.flatnonzero(keep).tolist():
            rec = used[i][0]
            batch.add(rec, self.goff[rec.reference_id], (int(mask_plus[i]), int(mask_minus[i])), None,
                      ([pc_q[pc_off[i]:pc_off[i + 1]]], [pc_col[pc_off[i]:pc_off[i + 1]]]),
                      ([nc_q[nc_off[i]:nc_off[i + 1]]], [nc_col[nc_off[i]:nc_off[i + 1]]]), sorted_calls=True)
        batch.seq_parts.append((parsed.seq, parsed.seq_off, keep))
        return [used[i] for i in np.flatnonzero(~keep).tolist()]

    def _fast_tables(self, g: dict, g_codes: np.ndarray, rev: np.ndarray, used: list):
        """Per group: offset into the call tables (-1: read without usable calls), and per-read masks."""
        n_reads = len(rev)
        has_pos = np.zeros(n_reads, np.bool_)
        np.logical_or.at(has_pos, g["read"], g["pos_end"] > g["pos_off"])
        refused = np.zeros(n_reads, np.bool_)
        if not self.options.force_allow_implicit:
            np.logical_or.at(refused, g["read"], g["mode"] == 2)
            if refused.any() and not self._implicit_noted:
                rec, source = used[int(np.flatnonzero(refused & has_pos)[0])] if (refused & has_pos).any() else used[0]
                self._note_implicit(source, rec.query_name)
        active = (has_pos & ~refused)[g["read"]] if len(g["read"]) else np.zeros(0, np.bool_)
        cols, limits, order, known = [], [], [], {}
        g_table = np.full(len(g["read"]), -1, np.int64)
        mask_plus = np.zeros(n_reads, np.uint64)
        mask_minus = np.zeros(n_reads, np.uint64)
        thr = self.options.thresholds
        for i in np.flatnonzero(active).tolist():
            codes = tuple(chr(c) for c in g_codes[i, :g["ncodes"][i]])
            tb = int(g["base"][i]) if not g["minus"][i] else 3 - int(g["base"][i])
            key = (tb, codes)
            entry = known.get(key)
            if entry is None:
                ids = [self.entry(tb, c) for c in codes]
                entry = known[key] = (len(cols), sum(1 << e for e in ids))
                cols += [tally.FIRST_ENTRY + e for e in ids] + [tally.FIRST_ENTRY + self.entry(tb, None), tally.FAIL]
                limits += [thr.for_code(c, tb) for c in codes] + [thr.for_base(tb), 0.0]
                order += list(hash_order(codes)) + [0, 0]
            g_table[i] = entry[0]
            r = g["read"][i]
            if (g["pos_end"][i] > g["pos_off"][i]):
                if bool(g["minus"][i]) == bool(rev[r]):
                    mask_plus[r] |= np.uint64(entry[1])
                else:
                    mask_minus[r] |= np.uint64(entry[1])
        tables = (np.array(cols, np.int64), np.array(limits, np.float32), np.array(order, np.int64))
        return tables, g_table, mask_plus, mask_minus

    def _note_implicit(self, source: str, name: str) -> None:
        log.warning("%s: read %s (and any others like it) has MM entries without '?' or '.'; such reads "
                    "count as no call (modkit's default; --force-allow-implicit reads them as '.')", source, name)
        self._implicit_noted = True

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
                    self._note_implicit(source, rec.query_name)
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
        batch.add(rec, self.goff[rec.reference_id], (mask_plus, mask_minus), SEQ_CODE[np.frombuffer(seq.encode(), np.uint8)],
                  (plus_q, plus_c), (minus_q, minus_c))

    def _columns(self, g: ModGroup, tb: int) -> np.ndarray:
        calls = call_positions(g.probs, g.codes, tb, self.options.thresholds)
        table = np.array([tally.FIRST_ENTRY + self.entry(tb, c) for c in g.codes]
                         + [tally.FIRST_ENTRY + self.entry(tb, None), tally.FAIL], dtype=np.int64)
        return table[np.where(calls == FAIL, len(g.codes) + 1, calls)]

    # rows ------------------------------------------------------------------------------------------
    def rows(self, blocks: np.ndarray | None = None) -> np.ndarray:
        """bedMethyl counts (see tally.decode) of the given blocks, default all, in position order."""
        if blocks is None:
            blocks = self.store.allocated()
        reg_base = np.array([b for b, _ in self.entries], dtype=np.int64)
        reg_canon = np.array([c is None for _, c in self.entries], dtype=np.bool_)
        return self.store.rows(blocks, reg_base, reg_canon, self.options.combine_mods)

    def release_before(self, gpos: int) -> np.ndarray:
        """Rows of every block that ends at or before global position `gpos`; those blocks are freed."""
        blocks = self.store.allocated()
        blocks = blocks[(blocks + 1) * tally.BLOCK <= gpos]
        rows = self.rows(blocks)
        self.store.release(blocks)
        return rows


class _Batch:
    """Per-read arrays gathered in Python lists, flattened once per batch for the kernel."""

    def __init__(self):
        self.gstart, self.gend, self.rev, self.mplus, self.mminus = [], [], [], [], []
        self.cigars, self.seqs, self.pq, self.pc, self.nq, self.nc = [], [], [], [], [], []
        self.seq_parts: list = []  # (codes, offsets, kept reads) of a batch read whole by the fast path

    def add(self, rec, offset: int, masks: tuple[int, int], seq, plus: tuple[list, list], minus: tuple[list, list],
            sorted_calls: bool = False) -> None:
        """One record at genome offset `offset` of its contig: its (+, -) call masks, sequence codes (None when
        `seq_parts` holds them) and the (query positions, table columns) of its calls on each strand."""
        self.gstart.append(offset + rec.reference_start)
        self.gend.append(offset + rec.reference_end)
        self.rev.append(rec.is_reverse)
        self.mplus.append(masks[0])
        self.mminus.append(masks[1])
        self.cigars.append(rec.cigartuples)
        self.seqs.append(seq)
        for (qs, cs), q_out, c_out in ((plus, self.pq, self.pc), (minus, self.nq, self.nc)):
            q = np.concatenate(qs) if qs else np.zeros(0, np.int64)
            c = np.concatenate(cs) if cs else np.zeros(0, np.int64)
            if not sorted_calls:
                order = np.argsort(q, kind="stable")
                q, c = q[order], c[order]
            q_out.append(q)
            c_out.append(c)

    def arrays(self, seq_codes: bool = False) -> dict[str, np.ndarray]:
        cig_len = np.array([len(c) for c in self.cigars], dtype=np.int64)
        if seq_codes:
            codes, seq_offsets, keep = self.seq_parts[0]
            lengths = np.diff(seq_offsets)
            seq = codes[np.repeat(keep, lengths)]
            seq_off = offsets(lengths[keep])
        else:
            seq = np.concatenate(self.seqs) if self.seqs else np.zeros(0, np.uint8)
            seq_off = offsets(np.array([len(s) for s in self.seqs], np.int64))
        return {
            "gstart": np.array(self.gstart, np.int64), "gend": np.array(self.gend, np.int64),
            "rev": np.array(self.rev, np.bool_),
            "mask_plus": np.array(self.mplus, np.uint64), "mask_minus": np.array(self.mminus, np.uint64),
            "cig_off": offsets(cig_len),
            "cig": np.fromiter(chain.from_iterable(chain.from_iterable(self.cigars)), np.int64,
                               count=2 * int(cig_len.sum())).reshape(-1, 2),
            "seq_off": seq_off, "seq": seq,
            "pc_off": offsets(np.array([len(q) for q in self.pq], np.int64)),
            "pc_q": _cat(self.pq), "pc_col": _cat(self.pc),
            "nc_off": offsets(np.array([len(q) for q in self.nq], np.int64)),
            "nc_q": _cat(self.nq), "nc_col": _cat(self.nc),
        }


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

