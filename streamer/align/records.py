"""The SAM records of reads' alignments, as minimap2 writes them, whichever engine found them.

An alignment is anything shaped like mappy's `Alignment` (`Hit` here), or a batch's alignments as
flat arrays (`Placed`, the engine's); each becomes the record minimap2 would write for it (flag,
MAPQ, CIGAR with soft clips on the primary and hard clips on supplementary records, NM), so the same
filter and the same `AlignmentRecord` conversion apply as to an aligned BAM. A batch's records are
written as SAM text in one pass over its arrays and parsed by htslib, so that no Python runs per
CIGAR operation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numba
import numpy as np
import pysam

from streamer.daemon.basecall_cache import Record, record_of
from streamer.io.alignments import AlignmentFilter
from streamer.pipeline.batch import CIGAR_H, CIGAR_S
from streamer.skips import Skip, Skipped

if TYPE_CHECKING:
    import mappy

FLAG_REVERSE, FLAG_SECONDARY, FLAG_SUPPLEMENTARY = 16, 256, 2048
_CIGAR_LETTERS = np.frombuffer(b"MIDNSHP=X", dtype=np.uint8)
_COMPLEMENT = np.arange(256, dtype=np.uint8)  # ACGTN complemented, either case; any other letter kept
_COMPLEMENT[np.frombuffer(b"ACGTNacgtn", np.uint8)] = np.frombuffer(b"TGCANtgcan", np.uint8)
_COMPLEMENT.flags.writeable = False
_TAB, _NEWLINE, _STAR = ord("\t"), ord("\n"), ord("*")
_MATES = np.frombuffer(b"\t*\t0\t0\t", dtype=np.uint8)  # RNEXT, PNEXT, TLEN: no mate


@dataclass(frozen=True)
class Hit:
    """One alignment of a read, in mappy's terms: query span on the read as basecalled, reference span
    on the contig, strand +1/-1, `is_primary` false for secondaries, CIGAR as [length, op] pairs in the
    reference's direction. mappy's own `Alignment` has these attributes: `hit_arrays` takes either."""

    ctg: str
    r_st: int
    r_en: int
    q_st: int
    q_en: int
    strand: int
    mapq: int
    is_primary: bool
    cigar: list[tuple[int, int]]
    NM: int


@dataclass(frozen=True)
class Texts:
    """Strings laid end to end as ASCII, one byte a character: string i is `data[off[i]:off[i + 1]]`."""

    data: np.ndarray  # uint8
    off: np.ndarray  # int64[n + 1]

    @classmethod
    def of(cls, strings: Sequence[str]) -> Texts:
        off = np.zeros(len(strings) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, strings), np.int64, len(strings)), out=off[1:])
        return cls(np.frombuffer("".join(strings).encode("ascii", "replace"), dtype=np.uint8), off)


@dataclass(frozen=True)
class Placed:
    """A batch's alignments, `Hit`'s fields as arrays: by read, each read's in output order (primary,
    supplementary parts, secondaries); alignment i's CIGAR is `cigar[cigar_start[i]:cigar_end[i]]`."""

    read: np.ndarray  # int64, non-decreasing: index of the read in the batch
    contig: np.ndarray  # int64: reference id in the header
    r_st: np.ndarray  # int64: start on the contig
    q_st: np.ndarray  # int64: span on the read as basecalled
    q_en: np.ndarray
    reverse: np.ndarray  # bool
    mapq: np.ndarray  # int64
    is_primary: np.ndarray  # bool: false for secondaries
    nm: np.ndarray  # int64
    cigar: np.ndarray  # int32[:, 2] (op, length), in the reference's direction
    cigar_start: np.ndarray  # int64
    cigar_end: np.ndarray


@numba.njit(nogil=True, cache=True)
def _put_int(buf, at, v):
    """The decimal digits of v >= 0 at buf[at:]; returns where they end."""
    end = at + 1
    t = v // 10
    while t > 0:
        end += 1
        t //= 10
    for k in range(end - 1, at - 1, -1):
        buf[k] = 48 + v % 10
        v //= 10
    return end


@numba.njit(nogil=True, cache=True)
def _put_text(buf, at, data, a, b, reverse):
    """data[a:b] at buf[at:], or its reverse complement; returns where it ends."""
    for i in range(b - a):
        buf[at + i] = _COMPLEMENT[data[b - 1 - i]] if reverse else data[a + i]
    return at + b - a


@numba.njit(nogil=True, cache=True)
def _sam_text(fields, cigar, cig_at, texts):
    """The SAM lines, without tags, of alignments `fields` (read, flag, contig's name, 1-based position, MAPQ,
    clipped bases before and after) with CIGAR runs `cigar[cig_at[i, 0]:cig_at[i, 1]]`; `texts` the reads'
    ids and sequences and the contigs' names, each laid end to end with offsets."""
    ids, id_off, seqs, seq_off, names, name_off = texts
    size = 0
    for i in range(len(fields)):
        r, ctg = fields[i, 0], fields[i, 2]
        size += (id_off[r + 1] - id_off[r] + name_off[ctg + 1] - name_off[ctg] + seq_off[r + 1] - seq_off[r]
                 + 12 * (cig_at[i, 1] - cig_at[i, 0] + 2) + 100)
    buf = np.empty(size, np.uint8)
    at = 0
    for i in range(len(fields)):
        r, flag, ctg = fields[i, 0], fields[i, 1], fields[i, 2]
        at = _put_text(buf, at, ids, id_off[r], id_off[r + 1], False)
        buf[at] = _TAB
        at = _put_int(buf, at + 1, flag)
        buf[at] = _TAB
        at = _put_text(buf, at + 1, names, name_off[ctg], name_off[ctg + 1], False)
        buf[at] = _TAB
        at = _put_int(buf, at + 1, fields[i, 3])
        buf[at] = _TAB
        at = _put_int(buf, at + 1, fields[i, 4])
        buf[at] = _TAB
        at += 1
        clip = _CIGAR_LETTERS[CIGAR_H] if flag & FLAG_SUPPLEMENTARY else _CIGAR_LETTERS[CIGAR_S]
        if fields[i, 5] > 0:
            at = _put_int(buf, at, fields[i, 5])
            buf[at] = clip
            at += 1
        for k in range(cig_at[i, 0], cig_at[i, 1]):
            at = _put_int(buf, at, cigar[k, 1])
            buf[at] = _CIGAR_LETTERS[cigar[k, 0]]
            at += 1
        if fields[i, 6] > 0:
            at = _put_int(buf, at, fields[i, 6])
            buf[at] = clip
            at += 1
        at = _put_text(buf, at, _MATES, 0, len(_MATES), False)
        if flag & (FLAG_SECONDARY | FLAG_SUPPLEMENTARY):
            buf[at] = _STAR
            at += 1
        else:
            at = _put_text(buf, at, seqs, seq_off[r], seq_off[r + 1], flag & FLAG_REVERSE)
        buf[at], buf[at + 1], buf[at + 2] = _TAB, _STAR, _NEWLINE
        at += 3
    return buf[:at]


def batch_records(header: pysam.AlignmentHeader, ids: Texts, seqs: Texts, placed: Placed
                  ) -> list[list[pysam.AlignedSegment]]:  # fmt: skip
    """The SAM records of each read of a batch (ids, sequences as basecalled) from its alignments: a read's
    first alignment that is not a secondary is its primary, the others its supplementary records."""
    n_reads = len(ids.off) - 1
    read = placed.read
    if not len(read):
        return [[] for _ in range(n_reads)]
    first = np.searchsorted(read, np.arange(n_reads + 1))  # each read's first alignment
    primaries_before = np.cumsum(placed.is_primary) - placed.is_primary
    supplementary = placed.is_primary & (primaries_before > primaries_before[first[read]])
    flag = (np.where(placed.reverse, FLAG_REVERSE, 0) | np.where(placed.is_primary, 0, FLAG_SECONDARY) |
            np.where(supplementary, FLAG_SUPPLEMENTARY, 0))
    length = np.diff(seqs.off)[read]
    lead = np.where(placed.reverse, length - placed.q_en, placed.q_st)
    trail = np.where(placed.reverse, placed.q_st, length - placed.q_en)
    used, contig = np.unique(placed.contig, return_inverse=True)
    names = Texts.of([header.get_reference_name(int(t)) for t in used])
    fields = np.stack([read, flag, contig.reshape(-1), placed.r_st + 1, np.where(placed.is_primary, placed.mapq, 0),
                       lead, trail], axis=1).astype(np.int64)  # fmt: skip
    text = _sam_text(fields, placed.cigar, np.stack([placed.cigar_start, placed.cigar_end], axis=1),
                     (ids.data, ids.off, seqs.data, seqs.off, names.data, names.off))
    # htslib tokenises each line in place: every line is a bytes object of its own, parsed once
    recs = [pysam.AlignedSegment.fromstring(line, header) for line in text.tobytes().split(b"\n")[:-1]]
    for rec, nm in zip(recs, placed.nm.tolist()):
        rec.set_tag("NM", nm, "i")
    bounds = first.tolist()
    return [recs[a:b] for a, b in zip(bounds, bounds[1:])]


def hit_arrays(header: pysam.AlignmentHeader, hits: Iterable[Hit | mappy.Alignment]) -> tuple[np.ndarray, np.ndarray]:
    """One read's alignments (mappy's or `Hit`s, in output order) as arrays, taken as they come so that
    mappy's objects do not outlive the read: int64[n, 9] (contig id, r_st, q_st, q_en, reverse, mapq,
    is_primary, NM, CIGAR runs) and int32[runs, 2] (length, op)."""
    rows, cigars = [], []
    for h in hits:
        rows.append((header.get_tid(h.ctg), h.r_st, h.q_st, h.q_en, h.strand < 0, h.mapq, h.is_primary, h.NM,
                     len(h.cigar)))  # fmt: skip
        cigars.append(h.cigar)
    runs = sum(row[8] for row in rows)
    return (np.array(rows, dtype=np.int64).reshape(-1, 9),
            np.fromiter(chain.from_iterable(chain.from_iterable(cigars)), np.int32, 2 * runs).reshape(-1, 2))


def sam_records(header: pysam.AlignmentHeader, reads: Sequence[tuple[str, str]],
                arrays: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[list[pysam.AlignedSegment]]:
    """The SAM records of each (read id, sequence) from its alignments' `hit_arrays`, made for the reads at once."""
    cols = np.concatenate([rows for rows, _ in arrays]) if arrays else np.zeros((0, 9), np.int64)
    runs = np.concatenate([c for _, c in arrays]) if arrays else np.zeros((0, 2), np.int32)
    ends = np.cumsum(cols[:, 8])
    placed = Placed(np.repeat(np.arange(len(arrays)), [len(rows) for rows, _ in arrays]), cols[:, 0], cols[:, 1],
                    cols[:, 2], cols[:, 3], cols[:, 4] > 0, cols[:, 5], cols[:, 6] > 0, cols[:, 7],
                    np.ascontiguousarray(runs[:, ::-1]), ends - cols[:, 8], ends)
    return batch_records(header, Texts.of([rid for rid, _ in reads]), Texts.of([seq for _, seq in reads]), placed)


def judged(read_id: str, recs: list[pysam.AlignedSegment], filt: AlignmentFilter, source: str) -> tuple[Record, ...]:
    """Each record as the filter judges it; one unmapped record if there is none."""
    if not recs:
        return (Skipped(read_id, Skip.UNMAPPED, f"{source} found no alignment"),)
    return tuple(record_of(rec, filt, source) for rec in recs)


def primary_of(recs: Sequence[pysam.AlignedSegment]) -> pysam.AlignedSegment | None:
    """A read's primary record (not secondary, not supplementary), if it has one."""
    return next((r for r in recs if not r.is_secondary and not r.is_supplementary), None)


def agree(a: pysam.AlignedSegment, b: pysam.AlignedSegment) -> bool:
    """Two alignments agree (the rule the alignment benchmark and tests share): same contig and strand,
    overlapping by at least 90% of the shorter reference span."""
    overlap = min(a.reference_end, b.reference_end) - max(a.reference_start, b.reference_start)
    return a.reference_name == b.reference_name and a.is_reverse == b.is_reverse and \
        overlap >= 0.9 * min(a.reference_length, b.reference_length)
