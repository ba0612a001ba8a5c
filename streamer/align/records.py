"""The SAM records of a read's alignments, as minimap2 writes them, whichever engine found them.

An alignment is anything shaped like mappy's `Alignment` (`Hit` here); each becomes the record
minimap2 would write for it (flag, MAPQ, CIGAR with soft clips on the primary and hard clips on
supplementary records, NM), so the same filter and the same `AlignmentRecord` conversion apply as
to an aligned BAM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pysam

from streamer.daemon.basecall_cache import Record, record_of
from streamer.io.alignments import AlignmentFilter
from streamer.pipeline.batch import CIGAR_H, CIGAR_S
from streamer.skips import Skip, Skipped

if TYPE_CHECKING:
    import mappy

_COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


@dataclass(frozen=True)
class Hit:
    """One alignment of a read, in mappy's terms: query span on the read as basecalled, reference span
    on the contig, strand +1/-1, `is_primary` false for secondaries, CIGAR as [length, op] pairs in the
    reference's direction. mappy's own `Alignment` has these attributes: `sam_records` takes either."""

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


def sam_records(header: pysam.AlignmentHeader, read_id: str, seq: str,
                hits: Iterable[Hit | mappy.Alignment]) -> list[pysam.AlignedSegment]:
    """The SAM records of one read: primary first, then supplementary and secondary."""
    out = []
    primary_seen = False
    for hit in hits:
        rec = pysam.AlignedSegment(header)
        rec.query_name = read_id
        rec.reference_id = header.get_tid(hit.ctg)
        rec.reference_start = hit.r_st
        rec.mapping_quality = hit.mapq if hit.is_primary else 0
        reverse = hit.strand < 0
        supplementary = hit.is_primary and primary_seen
        primary_seen = primary_seen or hit.is_primary
        rec.flag = (16 if reverse else 0) | (0 if hit.is_primary else 256) | (2048 if supplementary else 0)
        lead, trail = (len(seq) - hit.q_en, hit.q_st) if reverse else (hit.q_st, len(seq) - hit.q_en)
        clip = CIGAR_H if supplementary else CIGAR_S
        cigar = [(op, n) for n, op in hit.cigar]
        rec.cigartuples = ([(clip, lead)] if lead else []) + cigar + ([(clip, trail)] if trail else [])
        rec.set_tag("NM", hit.NM, "i")
        if hit.is_primary and not supplementary:
            rec.query_sequence = seq.translate(_COMPLEMENT)[::-1] if reverse else seq
        out.append(rec)
    return out


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
