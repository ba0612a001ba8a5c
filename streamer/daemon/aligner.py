"""Base-space alignment of basecalls that come without one, with mappy (minimap2's own binding).

Each hit becomes the BAM record minimap2 would write for it (`streamer.align.records`), so the
same filter and the same `Alignment` conversion apply as to an aligned BAM, and `streamer call`
on a BAM of these records gives the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mappy
import pysam

from streamer.align.records import judged, sam_records
from streamer.align.engine import SeedAligner, fm_aligner
from streamer.errors import InputError, UsageError
from streamer.io.alignments import AlignmentFilter
from streamer.daemon.basecall_cache import Record

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
        return sam_records(self.header, read_id, seq, self._aligner.map(seq))

    def align(self, read_id: str, seq: str) -> tuple[Record, ...]:
        """Each record as the filter judges it; one unmapped record if minimap2 finds no hit."""
        return judged(read_id, self.records(read_id, seq), self._filt, "minimap2 (mappy)")

    def records_all(self, reads: Sequence[tuple[str, str]]) -> list[list[pysam.AlignedSegment]]:
        """`records` over (read id, sequence) pairs on `threads` threads (mappy releases the GIL)."""
        if len(reads) < 2 or self.threads < 2:
            return [self.records(rid, seq) for rid, seq in reads]
        with ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="mappy") as pool:
            return list(pool.map(lambda r: self.records(*r), reads))

    def align_all(self, reads: Sequence[tuple[str, str]]) -> list[tuple[Record, ...]]:
        """`align` over (read id, sequence) pairs on `threads` threads."""
        return [judged(rid, recs, self._filt, "minimap2 (mappy)")
                for (rid, _), recs in zip(reads, self.records_all(reads))]


def open_aligner(engine: str, genome: Path, filt: AlignmentFilter, *, index: Path | None = None,
                 preset: str = "map-ont", threads: int = 3) -> ReadAligner | SeedAligner:
    """The aligner of `alignment.engine`: mappy (`index`, `preset`), or the FM-index engine seeding on the
    `gpu` or the `cpu`."""
    if engine == "mappy":
        return ReadAligner(genome, filt, index=index, preset=preset, threads=threads)
    try:
        return fm_aligner(genome, filt, target=engine, threads=threads)
    except ImportError as exc:
        raise UsageError(f"the {engine} alignment engine cannot start: {exc} (use the mappy engine)") from None
