"""Reading the two halves of a read, and holding basecalls until their signal lands.

Signal and basecall files of a batch land at different times, and a read may be in a
basecall file before or after its signal file is closed. The ledger pairs them by read id
(it keeps only ids and file numbers, so that side costs no memory). What needs memory is
the basecalls themselves: `BasecallCache` holds those of open reads up to a bound on bases,
drops the oldest past it, and reads a file again for the reads it no longer holds. Reads
whose partner never arrives are reported by the daemon after `join.timeout`, and reopened
(the ledger's `superseded`) if it lands after all.

A file read again may fail (truncated, replaced or removed since it was registered); a read it
no longer gives is then read from its spare FASTQ (`basecalls: auto`), if the run has one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from pathlib import Path

import pysam

from streamer.errors import InputError, one_line
from streamer.io.alignments import AlignmentRecord, AlignmentFilter, alignment_of
from streamer.io.fastx import iter_fastx
from streamer.skips import Skip, Skipped

log = logging.getLogger(__name__)

Record = AlignmentRecord | Skipped  # an alignment record that goes on, or why it does not

SPARE_USED = "%s: %d reads take their basecalls from this FASTQ: %s"  # the spare, how many, the file passed over


@dataclass(frozen=True)
class ReadBasecalls:
    """One read's basecalls and, when its file is an aligned BAM, its alignment records."""

    read_id: str
    seq: str  # as sequenced; "" when no record carries the whole read
    records: tuple[Record, ...] | None  # None: the file has no alignments (FASTQ, unaligned BAM)

    @property
    def n_bases(self) -> int:
        return len(self.seq)


def read_basecall_file(path: Path, fmt: str, filt: AlignmentFilter,
                       wanted: Container[str] | None = None) -> dict[str, ReadBasecalls]:
    """Every read of a FASTQ/FASTA or BAM file (or only the `wanted` ones), keyed by read id."""
    if fmt == "bam":
        return _read_bam(path, filt, wanted)
    return {rid: ReadBasecalls(rid, seq, None) for rid, seq in iter_fastx(path) if wanted is None or rid in wanted}


def _read_bam(path: Path, filt: AlignmentFilter, wanted: Container[str] | None) -> dict[str, ReadBasecalls]:
    """Group a BAM's records by read; the read's sequence comes from its primary record.

    A BAM without reference sequences in its header is unaligned (dorado, MinKNOW without a
    reference): its reads are aligned by the daemon, like FASTQ.

    The reader (htslib through pysam) raises whatever a damaged file provokes: `OSError`,
    `ValueError`, `NotImplementedError` (gzip that is not BGZF), errors again on close. Each is
    turned into an `InputError` naming the file, so that no file can stop the daemon.
    """
    quiet = pysam.set_verbosity(0)  # htslib's own stderr lines name no file: the InputError does
    try:
        return _read_bam_records(path, filt, wanted)
    finally:
        pysam.set_verbosity(quiet)


def _read_bam_records(path: Path, filt: AlignmentFilter, wanted: Container[str] | None) -> dict[str, ReadBasecalls]:
    try:
        fh = pysam.AlignmentFile(str(path), "rb", check_sq=False)
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's
        raise InputError(path, f"cannot open BAM: {one_line(exc)}") from exc
    seqs: dict[str, str] = {}
    records: dict[str, list[Record]] = {}
    failure: Exception | None = None
    try:
        aligned = fh.nreferences > 0
        for rec in fh.fetch(until_eof=True):
            rid = rec.query_name
            if wanted is not None and rid not in wanted:
                continue
            records.setdefault(rid, [])
            if not (rec.is_secondary or rec.is_supplementary) and rec.query_sequence:
                seqs[rid] = rec.get_forward_sequence().upper()
            if aligned:
                records[rid].append(record_of(rec, filt, path))
    except Exception as exc:  # noqa: BLE001 - any reader failure is the file's
        failure = exc
    try:
        fh.close()
    except Exception as exc:  # noqa: BLE001 - a damaged file can fail again on close
        failure = failure or exc
    if failure is not None:
        raise InputError(path, f"truncated or corrupt BAM: {one_line(failure)}") from failure
    return {rid: ReadBasecalls(rid, seqs.get(rid, ""), tuple(recs) if aligned else None)
            for rid, recs in records.items()}


def record_of(rec: pysam.AlignedSegment, filt: AlignmentFilter, source: Path | str) -> Record:
    """The record as `streamer call` takes it: an `AlignmentRecord`, or a `Skipped` naming where it came from."""
    verdict, detail = filt.verdict(rec)
    if verdict == Skip.OK:
        return alignment_of(rec)
    return Skipped(rec.query_name, verdict, f"{source}: {detail}")


@dataclass(frozen=True)
class Wanted:
    """A read whose basecalls a batch needs: the file they are in, and the FASTQ that holds them too."""

    read_id: str
    path: Path
    fmt: str
    spare_path: Path | None = None
    spare_fmt: str = ""


@dataclass(frozen=True)
class PassedOver:
    """A basecall file that failed when read again, and the reads that took their spare FASTQ's basecalls."""

    path: Path
    why: str
    whole: bool  # the file could not be read at all (else these reads were no longer in it)
    spared: dict[str, Path]  # read id -> the spare FASTQ its basecalls came from


@dataclass(frozen=True)
class Taken:
    """What `BasecallCache.take` found."""

    found: dict[str, ReadBasecalls]
    failed: dict[str, str]  # read id -> why it has no basecalls
    passed_over: list[PassedOver]


class BasecallCache:
    """Basecalls of open reads, at most `max_bases` of them; the rest are read again when needed, by
    `read` (`read_basecall_file`, here or in a parsing process: `streamer.pipeline.parsing`)."""

    def __init__(self, max_bases: int, filt: AlignmentFilter,
                 read: Callable[..., dict[str, ReadBasecalls]] = read_basecall_file):  # fmt: skip
        self.max_bases = max_bases
        self.read = read
        self._filt = filt
        self._reads: OrderedDict[str, ReadBasecalls] = OrderedDict()
        self._bases = 0
        self.reloads = 0  # files read again for reads that had been dropped (or held before a restart)

    def __len__(self) -> int:
        return len(self._reads)

    @property
    def bases(self) -> int:
        return self._bases

    def add(self, reads: Iterable[ReadBasecalls]) -> None:
        for bc in reads:
            old = self._reads.pop(bc.read_id, None)
            if old is not None:
                self._bases -= old.n_bases
            self._reads[bc.read_id] = bc
            self._bases += bc.n_bases
        while self._bases > self.max_bases and self._reads:
            _, bc = self._reads.popitem(last=False)
            self._bases -= bc.n_bases

    def discard(self, read_ids: Iterable[str]) -> None:
        for rid in read_ids:
            bc = self._reads.pop(rid, None)
            if bc is not None:
                self._bases -= bc.n_bases

    def take(self, wanted: Iterable[Wanted]) -> Taken:
        """Remove and return the basecalls of the reads wanted; files are read again for reads not
        held, and a read its file then fails to give is read from its spare FASTQ, if it has one."""
        taken = Taken({}, {}, [])
        missing: dict[tuple[Path, str], list[Wanted]] = {}
        for w in wanted:
            bc = self._reads.pop(w.read_id, None)
            if bc is None:
                missing.setdefault((w.path, w.fmt), []).append(w)
            else:
                self._bases -= bc.n_bases
                taken.found[w.read_id] = bc
        for (path, fmt), reads in missing.items():
            self.reloads += 1
            try:
                got = self.read(path, fmt, self._filt, {w.read_id for w in reads})
                why, whole = "read no longer in the file", False
            except InputError as exc:
                got, why, whole = {}, exc.reason, True
            taken.found.update(got)
            lost = [w for w in reads if w.read_id not in got]
            spared = self._from_spares([w for w in lost if w.spare_path is not None], f"{path}: {why}", taken)
            if spared:
                taken.passed_over.append(PassedOver(path, why, whole, spared))
            if whole and len(spared) < len(lost):
                log.warning("%s: %s", path, why)
            taken.failed.update({w.read_id: f"{path}: {why}" for w in lost if w.spare_path is None})
        return taken

    def _from_spares(self, lost: list[Wanted], why: str, taken: Taken) -> dict[str, Path]:
        """The `lost` reads (their file failed: `why`) read from their spare FASTQ; read id -> the spare.
        A read its spare cannot give either goes to `taken.failed` with both reasons."""
        by_spare: dict[tuple[Path, str], set[str]] = {}
        for w in lost:
            by_spare.setdefault((w.spare_path, w.spare_fmt), set()).add(w.read_id)
        spared: dict[str, Path] = {}
        for (spare, fmt), ids in by_spare.items():
            self.reloads += 1
            try:
                got = self.read(spare, fmt, self._filt, ids)
                also = "read not in it"
            except InputError as exc:
                got, also = {}, exc.reason
            taken.found.update(got)
            spared.update(dict.fromkeys(got, spare))
            taken.failed.update(dict.fromkeys(ids - got.keys(), f"{why}; its FASTQ {spare}: {also}"))
        return spared
