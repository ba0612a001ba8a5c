"""Read-to-reference alignments from BAM, filtered the way f5c filters them."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pysam

from streamer.errors import InputError
from streamer.skips import Skip, Skipped


@dataclass(frozen=True)
class AlignmentFilter:
    """Which records go on: mapped, MAPQ >= min_mapq, and primary unless `secondary`."""

    min_mapq: int = 20
    secondary: bool = False

    def verdict(self, rec: pysam.AlignedSegment) -> tuple[Skip, str]:
        """(Skip.OK, "") for a record that goes on, else the reason and a detail for the log."""
        if rec.is_unmapped:
            return Skip.UNMAPPED, "unmapped"
        if rec.mapping_quality < self.min_mapq:
            return Skip.LOW_MAPQ, f"mapping quality {rec.mapping_quality} < {self.min_mapq}"
        if rec.is_secondary and not self.secondary:
            return Skip.SECONDARY, "secondary alignment (use --secondary yes to keep)"
        return Skip.OK, ""


@dataclass(frozen=True)
class AlignmentRecord:
    """The parts of a BAM record the pipeline needs."""

    read_id: str
    ref_name: str
    ref_start: int
    ref_end: int
    rc: bool
    mapq: int
    cigar: np.ndarray  # int32[n_ops, 2] (op, length)

    def __reduce__(self) -> tuple:
        """Pickled with its CIGAR as bytes: an array object per record took two thirds of unpickling a BAM's
        reads, which the daemon's engine thread does for every basecall file a parsing process reads."""
        cigar = bytearray(np.ascontiguousarray(self.cigar, np.int32))
        return _record, (self.read_id, self.ref_name, self.ref_start, self.ref_end, self.rc, self.mapq, cigar)


def _record(read_id: str, ref_name: str, ref_start: int, ref_end: int, rc: bool, mapq: int,
            cigar: bytearray) -> AlignmentRecord:  # fmt: skip
    ops = np.frombuffer(cigar, np.int32).reshape(-1, 2)
    return AlignmentRecord(read_id, ref_name, ref_start, ref_end, rc, mapq, ops)


def alignment_of(rec: pysam.AlignedSegment) -> AlignmentRecord:
    ops = rec.cigartuples or ()
    # fromiter: np.asarray over the list of tuples costs most of reading a record
    cigar = np.fromiter(chain.from_iterable(ops), dtype=np.int32, count=2 * len(ops)).reshape(-1, 2)
    return AlignmentRecord(
        read_id=rec.query_name,
        ref_name=rec.reference_name,
        ref_start=rec.reference_start,
        ref_end=rec.reference_end,
        rc=rec.is_reverse,
        mapq=rec.mapping_quality,
        cigar=cigar,
    )


def iter_alignments(path: str | Path, filt: AlignmentFilter) -> Iterator[AlignmentRecord | Skipped]:
    """Yield every record in file order: an `AlignmentRecord` to process, or a `Skipped` naming the file."""
    path = Path(path)
    try:
        fh = pysam.AlignmentFile(str(path), "rb", check_sq=False)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot open alignments: {exc}") from exc
    with fh:
        try:
            for rec in fh.fetch(until_eof=True):
                verdict, detail = filt.verdict(rec)
                if verdict == Skip.OK:
                    yield alignment_of(rec)
                else:
                    yield Skipped(rec.query_name, verdict, f"{path}: {detail}")
        except OSError as exc:
            raise InputError(path, f"truncated or corrupt BAM: {exc}") from exc


def write_records(src: str | Path, dst: str | Path, read_ids: set[str], filt: AlignmentFilter) -> int:
    """Copy the records of `read_ids` that pass `filt` from BAM `src` to BAM `dst`; returns how many."""
    n = 0
    try:
        with pysam.AlignmentFile(str(src), "rb", check_sq=False) as fin:
            with pysam.AlignmentFile(str(dst), "wb", template=fin) as fout:
                for rec in fin.fetch(until_eof=True):
                    if rec.query_name in read_ids and filt.verdict(rec)[0] == Skip.OK:
                        fout.write(rec)
                        n += 1
    except (OSError, ValueError) as exc:
        raise InputError(dst, f"cannot write the set-aside alignments: {exc}") from exc
    return n
