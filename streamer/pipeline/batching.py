"""From alignment records to batch inputs: planning, signal loading, and the one join.

Batches are capped by K reads and B bases, counted over the records that go on, as f5c
does. Every command goes through here: `streamer call` and `streamer eventalign` plan their
batches from the BAM in file order without reading signal (`plan_batches`), so that reader
workers can load it (`load_chunk`, one task); the daemon's batches come from its ledger.
All of them hand their `Pending` records and the loaded signal to `batch_inputs`, the one
function that makes batch inputs (or skips, each with its reason) of them, and its reads to
`streamer.pipeline.batch.pack`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import defaultdict
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from typing import NamedTuple

from streamer.pipeline.batch import ReadInput
from streamer.errors import InputError
from streamer.io.alignments import AlignmentRecord
from streamer.io.fast5 import SignalRecord
from streamer.io.index import SignalIndex
from streamer.io.reference import Reference
from streamer.io.signal import read_signal, read_signals
from streamer.skips import Skip, Skipped


@dataclass(frozen=True)
class BatchLimits:
    """K: most alignment records per batch; B: most read bases per batch."""

    max_reads: int = 512
    max_bases: int = 5_000_000


def load_signals(wanted: Mapping[Path, list[str]]) -> tuple[dict[str, SignalRecord], dict[str, str]]:
    """Signals of the wanted reads, opening each file once; reads that fail get the error text."""
    got: dict[str, SignalRecord] = {}
    errors: dict[str, str] = {}
    for path, ids in wanted.items():
        try:
            for rec in read_signals(path, ids):
                got[rec.read_id] = rec
        except InputError:
            # find out which reads the damage touches, one at a time
            for rid in ids:
                if rid not in got:
                    try:
                        got[rid] = read_signal(path, rid)
                    except InputError as exc:
                        errors[rid] = str(exc)
        for rid in ids:
            if rid not in got and rid not in errors:
                errors[rid] = f"{path}: read not found in this signal file"
    return got, errors


class Pending(NamedTuple):
    """An alignment record whose signal is still to be read."""

    aln: AlignmentRecord
    seq: str  # the read's basecalls, as sequenced
    signal_path: Path
    number: int = -1  # its number where it came from (BAM record index, the ledger's read number)


@dataclass
class UltraLong:
    """Reads longer than `threshold` bases: batched last, or skipped and written to `skip_to`."""

    threshold: int
    skip_to: Path | None = None
    skipped_ids: set[str] = field(default_factory=set)


def plan_batches(
    records: Iterable[AlignmentRecord | Skipped],
    basecalls: Mapping[str, str],
    index: SignalIndex,
    limits: BatchLimits,
    reads_path: str = "the reads file",
    ultra: UltraLong | None = None,
) -> Iterator[tuple[list[Pending], list[Skipped]]]:
    """Yield (records to load, skipped) per batch from BAM records in file order; no signal is read.

    With `ultra`, reads longer than its threshold are set aside: batched after all the others
    (so they do not hold up a batch of ordinary reads), or skipped and listed for writing out.
    """
    pending: list[Pending] = []
    skipped: list[Skipped] = []
    deferred: list[Pending] = []
    bases = 0
    for number, aln in enumerate(records):
        if isinstance(aln, Skipped):
            skipped.append(aln)
            continue
        read_id = aln.read_id
        seq = basecalls.get(read_id)
        if seq is None:
            skipped.append(Skipped(read_id, Skip.NO_BASECALL, f"not in {reads_path}"))
            continue
        path = index.lookup(read_id)
        if path is None:
            skipped.append(Skipped(read_id, Skip.NO_SIGNAL, f"not found in the signal files indexed for {reads_path}"))
            continue
        if ultra is not None and len(seq) > ultra.threshold:
            if ultra.skip_to is None:
                deferred.append(Pending(aln, seq, path, number))
            else:
                ultra.skipped_ids.add(read_id)
                skipped.append(Skipped(read_id, Skip.ULTRA_LONG, f"{len(seq)} bases, written to {ultra.skip_to}"))
            continue
        pending.append(Pending(aln, seq, path, number))
        bases += len(seq)
        if len(pending) >= limits.max_reads or bases >= limits.max_bases:
            yield pending, skipped
            pending, skipped, bases = [], [], 0
    for item in deferred:
        if pending and (len(pending) >= limits.max_reads or bases + len(item.seq) > limits.max_bases):
            yield pending, skipped
            pending, skipped, bases = [], [], 0
        pending.append(item)
        bases += len(item.seq)
    if pending or skipped:
        yield pending, skipped


def signal_requests(pending: list[Pending]) -> dict[Path, list[str]]:
    """The read ids to load from each signal file, files in first-use order."""
    wanted: dict[Path, list[str]] = defaultdict(list)
    for p in pending:
        wanted[p.signal_path].append(p.aln.read_id)
    return wanted


def batch_inputs(pending: Iterable[Pending], signals: Mapping[str, SignalRecord], errors: Mapping[str, str],
                 ref: Reference) -> tuple[list[ReadInput], list[Skipped]]:  # fmt: skip
    """The records ready for the stages, in the order given, and those that are not, with why.

    `signals` holds the records' loaded signal by read id, `errors` why a read's did not load.
    """
    reads: list[ReadInput] = []
    skipped: list[Skipped] = []
    for p in pending:
        aln = p.aln
        sig = signals.get(aln.read_id)
        if sig is None:
            why = errors.get(aln.read_id) or f"{p.signal_path}: read not found in this signal file"
            skipped.append(Skipped(aln.read_id, Skip.BAD_SIGNAL_FILE, why))
            continue
        try:  # with the base after the span, as nanopolish and f5c fetch it (`ReadInput.ref_next`)
            span = ref.fetch(aln.ref_name, aln.ref_start, aln.ref_end + 1)
        except InputError as exc:
            skipped.append(Skipped(aln.read_id, Skip.ALIGNMENT_FAILED, str(exc)))
            continue
        n = aln.ref_end - aln.ref_start
        reads.append(ReadInput(read_id=aln.read_id, seq=p.seq, signal=sig, ref_name=aln.ref_name,
                               ref_start=aln.ref_start, ref_end=aln.ref_end, rc=aln.rc, cigar=aln.cigar,
                               ref_seq=span[:n], ref_next=span[n:], signal_path=str(p.signal_path), number=p.number,
                               mapq=aln.mapq))  # fmt: skip
    return reads, skipped


_NO_SAMPLES = np.zeros(0, np.int16)


@dataclass
class SignalChunk:
    """One reader task's reads: records with their samples moved to `raw`, where each read's are, failures."""

    records: dict[str, SignalRecord]  # raw left empty
    where: dict[str, tuple[int, int]]  # read id -> (start, length) in raw
    raw: np.ndarray  # int16
    errors: dict[str, str]
    seconds: float  # busy time of the task
    started: float = 0.0  # perf_counter at its start (the system's monotonic clock: comparable across processes)
    worker: str = ""  # the process and thread that ran it


def load_chunk(wanted: Mapping[Path, list[str]]) -> SignalChunk:
    """`load_signals` as a reader task (a worker process or thread), the samples laid end to end."""
    t0 = time.perf_counter()
    signals, errors = load_signals(wanted)
    where: dict[str, tuple[int, int]] = {}
    at = 0
    for rid, rec in signals.items():
        where[rid] = (at, len(rec.raw))
        at += len(rec.raw)
    raw = np.concatenate([rec.raw for rec in signals.values()]) if signals else _NO_SAMPLES
    records = {rid: dataclasses.replace(rec, raw=_NO_SAMPLES) for rid, rec in signals.items()}
    return SignalChunk(records, where, raw.astype(np.int16, copy=False), errors, time.perf_counter() - t0, t0,
                       f"{os.getpid()} {threading.current_thread().name}")


def chunk_records(chunks: Iterable[SignalChunk], read_ids: Container[str] | None = None
                  ) -> tuple[dict[str, SignalRecord], dict[str, str]]:  # fmt: skip
    """The reader tasks' records (their samples views of the task's array) and failures, of `read_ids` or all."""
    records: dict[str, SignalRecord] = {}
    errors: dict[str, str] = {}
    for c in chunks:
        for rid, (s, n) in c.where.items():
            if read_ids is None or rid in read_ids:
                records[rid] = dataclasses.replace(c.records[rid], raw=c.raw[s : s + n])
        errors.update((rid, why) for rid, why in c.errors.items() if read_ids is None or rid in read_ids)
    return records, errors


def offline_batches(
    records: Iterable[AlignmentRecord | Skipped],
    basecalls: Mapping[str, str],
    index: SignalIndex,
    ref: Reference,
    limits: BatchLimits,
    reads_path: str = "the reads file",
) -> Iterator[tuple[list[ReadInput], list[Skipped]]]:
    """Yield (reads, skipped) per batch from BAM records in file order, reading signal as it goes."""
    for pending, skipped in plan_batches(records, basecalls, index, limits, reads_path):
        signals, errors = load_signals(signal_requests(pending))
        reads, failed = batch_inputs(pending, signals, errors, ref)
        yield reads, skipped + failed
