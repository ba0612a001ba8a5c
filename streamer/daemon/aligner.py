"""Base-space alignment of basecalls that come without one, with mappy (minimap2's own binding).

Each hit becomes the BAM record minimap2 would write for it (flag, MAPQ, CIGAR with soft
clips on the primary and hard clips on supplementary records), so the same filter and the
same `Alignment` conversion apply as to an aligned BAM, and `streamer call` on a BAM of
these records gives the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mappy
import pysam

from streamer.pipeline.batch import CIGAR_H, CIGAR_S
from streamer.errors import InputError
from streamer.io.alignments import AlignmentFilter
from streamer.daemon.basecall_cache import Record, record_of
from streamer.skips import Skip, Skipped

log = logging.getLogger(__name__)


class ReadAligner:
    """A minimap2 index, built once from the reference (or loaded from a `.mmi`)."""

    def __init__(self, genome: Path, filt: AlignmentFilter, *, index: Path | None = None, preset: str = "map-ont",
                 threads: int = 3):
        source = index or genome
        self._aligner = mappy.Aligner(str(source), preset=preset, n_threads=threads)
        if not self._aligner:
            raise InputError(source, "cannot load or build a minimap2 index")
        self._filt = filt
        self.threads = threads
        names = list(self._aligner.seq_names)
        lengths = [len(self._aligner.seq(n)) for n in names]
        self.header = pysam.AlignmentHeader.from_references(names, lengths)
        log.info("minimap2 index of %s ready (%s, %d sequences)", source, preset, len(names))

    def records(self, read_id: str, seq: str) -> list[pysam.AlignedSegment]:
        """The SAM records of one read: primary first, then supplementary and secondary."""
        out = []
        primary_seen = False
        for hit in self._aligner.map(seq):
            rec = pysam.AlignedSegment(self.header)
            rec.query_name = read_id
            rec.reference_id = self.header.get_tid(hit.ctg)
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
                rec.query_sequence = mappy.revcomp(seq) if reverse else seq
            out.append(rec)
        return out

    def align(self, read_id: str, seq: str) -> tuple[Record, ...]:
        """Each record as the filter judges it; one unmapped record if minimap2 finds no hit."""
        recs = self.records(read_id, seq)
        if not recs:
            return (Skipped(read_id, Skip.UNMAPPED, "minimap2 (mappy) found no alignment"),)
        return tuple(record_of(rec, self._filt, "minimap2 (mappy)") for rec in recs)

    def align_all(self, reads: Sequence[tuple[str, str]]) -> list[tuple[Record, ...]]:
        """`align` over (read id, sequence) pairs on `threads` threads (mappy releases the GIL)."""
        if len(reads) < 2 or self.threads < 2:
            return [self.align(rid, seq) for rid, seq in reads]
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="mappy") as pool:
            return list(pool.map(lambda r: self.align(*r), reads))

