"""The daemon's batches as jobs of the batch driver (`streamer.pipeline.runner`), as `streamer call`'s are.

The engine thread picks the matched reads the ledger says are due, takes their basecalls from
the cache (a read whose basecall file fails when read again from its spare FASTQ), aligns those that came without alignments, and starts reading their signal (and
the next batch's, ahead); `DaemonBatch` is then what the driver assembles (the signal in hand,
the records ready) and runs through the stages, the batch retried read by read if the
pipeline raises on it (`Stages(isolate=True)`). The ledger, the journal and the sinks stay
with the engine (`streamer.daemon.shell`): a batch is committed on the thread that took it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from streamer.daemon.basecall_cache import SPARE_USED, BasecallCache, ReadBasecalls, Record, Wanted
from streamer.daemon.ledger import Ledger, Pick
from streamer.io.reference import Reference
from streamer.daemon.aligner import ReadAligner
from streamer.pipeline.batch import ReadInput
from streamer.io.signal_chunks import SignalChunk, chunk_records
from streamer.pipeline.batching import Pending, assemble_batch, batch_inputs
from streamer.pipeline.steps import Assembled
from streamer.pipeline.signal_pool import SignalBatch
from streamer.skips import Skip, Skipped

log = logging.getLogger(__name__)


class DaemonBatch:
    """One batch of picked reads: their records, and their signal as the reader pool delivers it."""

    def __init__(self, picks: list[Pick], pending: list[Pending], skipped: list[Skipped], records_in: int,
                 signal: SignalBatch, reference: Reference):  # fmt: skip
        self.picks = picks
        self.pending = pending
        self.skipped = skipped
        self.records_in = records_in
        self.signal = signal
        self.reference = reference
        self.input_ids: list[str] = []  # the read of each record that reached the stages, once assembled

    def start(self) -> None:
        """Nothing to begin: the engine started the reads when it picked the batch."""

    def assemble(self) -> Assembled:
        """Packed straight from the readers' columns, as `streamer call`'s batches (a record per read, made
        and packed, held the GIL for a fifth of a second a batch on a GPU box); the records are made only
        for a retry read by read, or where the columns could not be packed (the stages then isolate it)."""
        chunks = self.signal.chunks()
        try:
            batch, unusable = assemble_batch(self.pending, chunks, self.reference)
        except Exception as exc:  # noqa: BLE001 - met again, and handled, where the batch computes
            log.debug("a batch of %d records could not be packed (%s): the stages take the records",
                      len(self.pending), exc)  # fmt: skip
        else:
            if batch is not None:
                self.input_ids = list(batch.read_ids)
                return Assembled([], batch, self.skipped + unusable, self.records_in,
                                 lambda: self._inputs(chunks)[0])  # fmt: skip
        inputs, unusable = self._inputs(chunks)
        self.input_ids = [r.read_id for r in inputs]
        return Assembled(inputs, None, self.skipped + unusable, self.records_in)

    def _inputs(self, chunks: list[SignalChunk]) -> tuple[list[ReadInput], list[Skipped]]:
        return batch_inputs(self.pending, *chunk_records(chunks, self.signal.read_ids), self.reference)


def basecalls_of(picks: list[Pick], cache: BasecallCache, ledger: Ledger
                 ) -> tuple[list[Pick], dict[str, ReadBasecalls], dict[str, str]]:  # fmt: skip
    """The picks' basecalls (as picked: a read taken from its spare FASTQ now names it), and why
    the others have none.

    A read whose basecall file fails when read again takes its spare FASTQ's basecalls: the
    ledger records the switch before the batch runs, so a restart reads the FASTQ and calls it
    once; one line names the file passed over and why. A file that cannot be read at all passes
    all its open reads that have a spare to it at once (those held here dropped: one source a
    read), but not this batch's reads already taken from the file as it was.
    """
    taken = cache.take(Wanted(p.read_id, p.basecall_path, p.basecall_fmt, p.spare_path, p.spare_fmt)
                       for p in picks)
    for po in taken.passed_over:
        ids = set(po.spared)
        if po.whole:
            ids |= ledger.open_reads_of(po.path) - taken.found.keys() - taken.failed.keys()
        cache.discard(ids - po.spared.keys())
        for spare, switched in ledger.take_spares(ids).items():
            log.warning(SPARE_USED, spare, len(switched), f"{po.path} could not be read again ({po.why})")
    spared = {rid for po in taken.passed_over for rid in po.spared}
    picks = [replace(p, basecall_path=p.spare_path, basecall_fmt=p.spare_fmt, spare_path=None, spare_fmt="")
             if p.read_id in spared else p for p in picks]
    return picks, taken.found, taken.failed


def picked(picks: list[Pick], found: dict[str, ReadBasecalls], failed: dict[str, str]
           ) -> tuple[list[Pending], list[Skipped], int]:  # fmt: skip
    """The picks' records that go on to their signal, those that cannot (with why), and how many records in all."""
    pending: list[Pending] = []
    skipped: list[Skipped] = []
    for p in picks:
        bc = found.get(p.read_id)
        if bc is None:
            skipped.append(Skipped(p.read_id, Skip.NO_BASECALL, failed.get(p.read_id, "")))
            continue
        skips = [r for r in bc.records if isinstance(r, Skipped)]
        alns = [r for r in bc.records if not isinstance(r, Skipped)]
        if alns and not bc.seq:
            why = f"{p.basecall_path}: no record with the read's full sequence"
            skipped += skips + [Skipped(p.read_id, Skip.NO_BASECALL, why) for _ in alns]
        else:
            pending += [Pending(a, bc.seq, p.signal_path, p.number) for a in alns]
            skipped += skips
    return pending, skipped, len(pending) + len(skipped)


def signal_wanted(picks: list[Pick], found: dict[str, ReadBasecalls] | None = None) -> dict[Path, list[str]]:
    """The reads to load from each signal file: of `found`, those whose basecalls let them reach the
    pipeline (an alignment and the full sequence); without it, every pick (a later batch's, read ahead)."""
    wanted: dict[Path, list[str]] = {}
    for p in picks:
        if found is None or (p.read_id in found and _needs_signal(found[p.read_id])):
            wanted.setdefault(p.signal_path, []).append(p.read_id)
    return wanted


def _needs_signal(bc: ReadBasecalls) -> bool:
    return bool(bc.seq) and any(not isinstance(r, Skipped) for r in bc.records)


class Aligning:
    """Alignment records for basecalls that came without (FASTQ, unaligned BAM): the aligner of
    `alignment.engine`, its index built when first needed, or at start-up (`build`) where such
    basecalls are expected."""

    def __init__(self, make_aligner: Callable[[], ReadAligner] | None):
        self._make = make_aligner
        self._aligner: ReadAligner | None = None

    def build(self) -> None:
        if self._make is not None and self._aligner is None:
            self._aligner = self._make()

    def choice(self) -> dict[str, Any] | None:
        """Which engine aligns and why (`streamer.align.agreement.EngineChoice`) once one is built, for summary.json."""
        choice = getattr(self._aligner, "choice", None)
        return choice.as_dict() if choice is not None else None

    def align(self, reads: list[tuple[str, str]]) -> dict[str, tuple[Record, ...]]:
        """(read id, sequence) -> the read's records, or its skip."""
        out = {rid: (Skipped(rid, Skip.NO_BASECALL, "its basecall record has no sequence"),)
               for rid, seq in reads if not seq}
        reads = [(rid, seq) for rid, seq in reads if seq]
        if not reads:
            return out
        if self._aligner is None:
            if self._make is None:
                why = "basecalls without alignments, and no reference index to align them"
                return out | {rid: (Skipped(rid, Skip.UNMAPPED, why),) for rid, _ in reads}
            log.info("basecalls without alignments: building the aligner's index")
            self.build()
        return out | dict(zip((rid for rid, _ in reads), self._aligner.align_all(reads)))


def eventalign_of(rendered: list[tuple[str, Any]], results: list[Any], labels: Callable[[Any], list[str]],
                  stage: str) -> list[tuple[Any, Any, list[str], str]]:  # fmt: skip
    """Each result's eventalign rows, batch, read labels and TSV text (`rendered`: (calls, eventalign) text)."""
    out = []
    for r, (_, text) in zip(results, rendered):
        rows = r.products.get(stage)
        if rows is None:
            raise TypeError("eventalign is on but the pipeline has no eventalign stage")
        out.append((rows, r.batch, labels(r.batch), text))
    return out
