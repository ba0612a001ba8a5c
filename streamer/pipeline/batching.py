"""From alignment records to batch inputs: planning, signal loading, and the one join.

Batches are capped by K reads and B bases, counted over the records that go on, as f5c
does. Every command goes through here: `streamer call` and `streamer eventalign` plan their
batches from the BAM in file order without reading signal (`plan_batches`), so that reader
workers can load it (`streamer.io.signal_chunks.load_chunk`, one task, handed back as columns);
the daemon's batches come from its ledger. All of them join their `Pending` records with the loaded signal and the
reference in one place (`_join`: the records that go on, the others skipped with their reasons):
`assemble_batch` packs them straight from the reader tasks' columns (`streamer call`,
`eventalign`), `batch_inputs` makes `ReadInput`s of them, which the daemon keeps for its
read-by-read retry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from streamer.pipeline.batch import ReadBatch, ReadInput, RefBases, Samples, offsets_of, pack_records
from streamer.errors import InputError
from streamer.io.alignments import AlignmentRecord
from streamer.io.index import SignalIndex
from streamer.io.reference import Reference
from streamer.io.signal_chunks import SignalChunk, load_signals
from streamer.io.signal_record import SignalRecord
from streamer.skips import Skip, Skipped


RAMP = 2  # `streamer call`'s and `eventalign`'s first batches hold B/4 and B/2 bases (`plan_batches`)


@dataclass(frozen=True)
class BatchLimits:
    """K: most alignment records per batch; B: most read bases per batch."""

    max_reads: int = 512
    max_bases: int = 5_000_000


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
    ramp: int = 0,
) -> Iterator[tuple[list[Pending], list[Skipped]]]:
    """Yield (records to load, skipped) per batch from BAM records in file order; no signal is read.

    With `ultra`, reads longer than its threshold are set aside: batched after all the others
    (so they do not hold up a batch of ordinary reads), or skipped and listed for writing out.
    The first `ramp` batches hold at most B/2, B/4... bases (the first B/2**ramp): the stages wait for
    the first batch to be read, packed and through its events, so a small one lets them begin sooner.
    """
    pending: list[Pending] = []
    skipped: list[Skipped] = []
    deferred: list[Pending] = []
    bases = 0
    batch = 0

    def full() -> bool:
        return len(pending) >= limits.max_reads or bases >= limits.max_bases >> max(0, ramp - batch)
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
        if full():
            yield pending, skipped
            pending, skipped, bases, batch = [], [], 0, batch + 1
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


class _Joined(NamedTuple):
    """A batch's records that go on (their places in it, their reference bases) and those that cannot."""

    kept: list[int]
    ref: RefBases
    skipped: list[Skipped]


def _join(pending: Sequence[Pending], held: Container[str], errors: Mapping[str, str], ref: Reference) -> _Joined:
    """The records whose signal is `held` and whose reference span can be read, with their bases (each
    span read with the base after it, as nanopolish and f5c fetch it: `ReadInput.ref_next`; a contig's
    spans in a few windows); the others skipped with why, in the order given."""
    why: dict[int, Skipped] = {}
    by_contig: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(pending):
        if p.aln.read_id in held:
            by_contig[p.aln.ref_name].append(i)
        else:
            reason = errors.get(p.aln.read_id) or f"{p.signal_path}: read not found in this signal file"
            why[i] = Skipped(p.aln.read_id, Skip.BAD_SIGNAL_FILE, reason)
    at, length = np.zeros(len(pending), np.int64), np.zeros(len(pending), np.int64)
    texts, base = [], 0
    for name, rows in by_contig.items():
        start = np.fromiter((pending[i].aln.ref_start for i in rows), np.int64, len(rows))
        end = np.fromiter((pending[i].aln.ref_end for i in rows), np.int64, len(rows))
        try:
            spans = ref.spans(name, start, end + 1)
        except InputError as exc:
            why.update((i, Skipped(pending[i].aln.read_id, Skip.ALIGNMENT_FAILED, str(exc))) for i in rows)
            continue
        at[rows], length[rows] = spans.at + base, spans.length
        texts.append(spans.text)
        base += len(spans.text)
    kept = [i for i in range(len(pending)) if i not in why]
    text = np.concatenate(texts) if texts else np.zeros(0, np.uint8)
    n = np.fromiter((pending[i].aln.ref_end - pending[i].aln.ref_start for i in kept), np.int64, len(kept))
    at, length = at[kept], length[kept]
    after = np.zeros(len(kept), np.uint8)
    has_next = length > n
    after[has_next] = text[(at + n)[has_next]]
    return _Joined(kept, RefBases(text, at, np.minimum(length, n), after), [why[i] for i in sorted(why)])


def batch_inputs(pending: Sequence[Pending], signals: Mapping[str, SignalRecord], errors: Mapping[str, str],
                 ref: Reference) -> tuple[list[ReadInput], list[Skipped]]:  # fmt: skip
    """The records ready for the stages as `ReadInput`s (what a read-by-read retry needs), in the order
    given, and those that are not, with why.

    `signals` holds the records' loaded signal by read id, `errors` why a read's did not load.
    """
    j = _join(pending, signals, errors, ref)
    reads = []
    for k, i in enumerate(j.kept):
        p, aln = pending[i], pending[i].aln
        a, n = j.ref.at[k], j.ref.length[k]
        reads.append(ReadInput(read_id=aln.read_id, seq=p.seq, signal=signals[aln.read_id], ref_name=aln.ref_name,
                               ref_start=aln.ref_start, ref_end=aln.ref_end, rc=aln.rc, cigar=aln.cigar,
                               ref_seq=j.ref.text[a : a + n].tobytes().decode("ascii"),
                               ref_next=chr(j.ref.next[k]) if j.ref.next[k] else "", signal_path=str(p.signal_path),
                               number=p.number, mapq=aln.mapq))  # fmt: skip
    return reads, j.skipped


def assemble_batch(pending: Sequence[Pending], chunks: Sequence[SignalChunk], ref: Reference
                   ) -> tuple[ReadBatch | None, list[Skipped]]:  # fmt: skip
    """The records ready for the stages packed straight from the reader tasks' columns (no object per
    read between them), in the order given, and those that are not, with why."""
    where: dict[str, tuple[int, int]] = {}
    errors: dict[str, str] = {}
    for k, c in enumerate(chunks):
        where.update((rid, (k, j)) for j, rid in enumerate(c.read_ids))
        errors.update(c.errors)
    j = _join(pending, where, errors, ref)
    if not j.kept:
        return None, j.skipped
    source, row = np.array([where[pending[i].aln.read_id] for i in j.kept], np.int64).reshape(-1, 2).T
    flat = offsets_of(np.fromiter((len(c.read_ids) for c in chunks), np.int64, len(chunks)))[source] + row
    samples = Samples.calibrated([c.raw for c in chunks], source, np.concatenate([c.start for c in chunks])[flat],
                                 np.concatenate([c.length for c in chunks])[flat],
                                 np.concatenate([c.calibration for c in chunks])[flat])  # fmt: skip
    kept = [pending[i] for i in j.kept]
    batch = pack_records([p.aln for p in kept], [p.seq for p in kept], samples, j.ref,
                         np.fromiter((p.number for p in kept), np.int64, len(kept)),
                         [str(p.signal_path) for p in kept])  # fmt: skip
    return batch, j.skipped


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
