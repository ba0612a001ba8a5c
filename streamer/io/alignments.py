"""Read-to-reference alignments from BAM, filtered the way f5c filters them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pysam

from streamer.errors import InputError
from streamer.skips import Skip


@dataclass(frozen=True)
class AlignmentFilter:
    """Which records go on: mapped, MAPQ >= min_mapq, and primary unless `secondary`."""

    min_mapq: int = 20
    secondary: bool = False

    def verdict(self, rec: pysam.AlignedSegment) -> Skip:
        if rec.is_unmapped:
            return Skip.UNMAPPED
        if rec.mapping_quality < self.min_mapq:
            return Skip.LOW_MAPQ
        if rec.is_secondary and not self.secondary:
            return Skip.SECONDARY
        return Skip.OK


@dataclass(frozen=True)
class Alignment:
    """The parts of a BAM record the pipeline needs."""

    read_id: str
    ref_name: str
    ref_start: int
    ref_end: int
    rc: bool
    mapq: int
    cigar: np.ndarray  # int32[n_ops, 2] (op, length)


def alignment_of(rec: pysam.AlignedSegment) -> Alignment:
    return Alignment(
        read_id=rec.query_name,
        ref_name=rec.reference_name,
        ref_start=rec.reference_start,
        ref_end=rec.reference_end,
        rc=rec.is_reverse,
        mapq=rec.mapping_quality,
        cigar=np.asarray(rec.cigartuples, dtype=np.int32).reshape(-1, 2),
    )


def iter_alignments(path: str | Path, filt: AlignmentFilter) -> Iterator[tuple[str, Alignment | None, Skip]]:
    """Yield (read_id, alignment or None, verdict) for every record, in file order."""
    path = Path(path)
    try:
        fh = pysam.AlignmentFile(str(path), "rb", check_sq=False)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot open alignments: {exc}") from exc
    with fh:
        try:
            for rec in fh.fetch(until_eof=True):
                verdict = filt.verdict(rec)
                yield rec.query_name, (alignment_of(rec) if verdict == Skip.OK else None), verdict
        except OSError as exc:
            raise InputError(path, f"truncated or corrupt BAM: {exc}") from exc
