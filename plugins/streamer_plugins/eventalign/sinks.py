"""Eventalign's outputs as sinks (`streamer.sinks` entry points `eventalign`, `eventalign-sam`,
`eventalign-summary`): the TSV rows (and the daemon's `eventalign` topic), the event-space
SAM, and the per-read summary.

The rows are `streamer eventalign`'s, made by the eventalign stage (`products["eventalign"]`),
so in the daemon, events, scalings and ABEA serve both the calls and eventalign.

The published message carries the TSV's columns under the TSV header's names, split into
messages of whole reads of about `MESSAGE_ROWS` rows; repeated strings (contig, k-mers, read
names) go as codes into small value lists, so a message costs a few array copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import os
from pathlib import Path

import pysam

from streamer.io.signal import signal_format
from streamer.pipeline.batch import ReadBatch
from streamer.pore.model import NUCLEOTIDE
from streamer.sinks import BaseSink, Result, SinkContext
from streamer_plugins.eventalign import (
    SUMMARY_HEADER,
    EventalignOptions,
    EventalignRows,
    EventalignStage,
    f5c_ss_tags,
    format_tsv,
    sam_records,
    summary_lines,
    tsv_header,
)

EVENTALIGN_TSV = "eventalign.tsv"
EVENTALIGN = EventalignStage.name  # the stage's key in `batch.products`
MESSAGE_ROWS = 100_000  # rows per published message, about: a few MB, well inside the publisher's queue

_RANK = np.zeros(256, np.int64)  # the disambiguated reference is ACGT only
for _i, _b in enumerate(b"ACGT"):
    _RANK[_b] = _i


class EventalignTsv(BaseSink):
    """The eventalign TSV rows, and the same rows as message columns (`messages`)."""

    journal = EVENTALIGN_TSV
    needs_events = True  # each row's event

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> EventalignTsv | None:
        ea = config.eventalign
        if not ea.enabled:
            return None
        return cls(ea.print_read_names, ea.scale_events, ea.signal_index, ea.samples)

    def __init__(self, print_read_names: bool = False, scale_events: bool = False, signal_index: bool = False,
                 samples: bool = False):  # fmt: skip
        self.options = EventalignOptions(print_read_names, scale_events, signal_index, samples)
        self.needs_signal = samples  # each event's samples
        self.header = tsv_header(self.options)
        self._names = self.header.rstrip("\n").split("\t")

    def render(self, result: Result) -> str:
        batch = result.batch
        return self.text(result.products[EVENTALIGN], batch, self.labels(batch))

    def count(self, result: Result) -> int:
        return len(result.products[EVENTALIGN])

    def labels(self, batch: ReadBatch) -> list[str]:
        """Each record's read column: its read id, or its number (BAM record index, ledger read number)."""
        if self.options.print_read_names:
            return list(batch.read_ids)
        return [str(n) for n in batch.numbers.tolist()]

    def text(self, rows: EventalignRows, batch: ReadBatch, labels: Sequence[str]) -> str:
        return format_tsv(rows, batch, labels, self.options)

    def messages(self, rows: EventalignRows, batch: ReadBatch, labels: Sequence[str],
                 text: str) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Column maps of whole reads, about MESSAGE_ROWS rows each; `text` is `self.text`'s (for samples)."""
        from streamer.publish.protocol import Categorical  # with ZeroMQ: only where a daemon publishes

        n = len(rows)
        if not n:
            return
        k = rows.k
        ref_rank = np.zeros(n, np.int64)
        for j in range(k):
            ref_rank = ref_rank * 4 + _RANK[rows.ref[rows.kmer_at + j]]
        model_rank = np.where(rows.model_rank < 0, 4**k, rows.model_rank)
        kmers = _kmer_names(k)
        samples = [line.rsplit("\t", 1)[1] for line in text.splitlines()] if self.options.samples else None
        labels = list(labels)
        numeric_labels = None if self.options.print_read_names else np.asarray(labels, dtype=np.int64)
        contigs = list(batch.ref_names)
        for a, b in _chunks(rows.row_off, MESSAGE_ROWS):
            read = rows.read[a:b]
            cols: dict[str, Any] = {
                "contig": Categorical(contigs, read),
                "position": rows.position[a:b],
                "reference_kmer": Categorical(kmers, ref_rank[a:b]),
                self._names[3]: Categorical(labels, read) if numeric_labels is None else numeric_labels[read],
                "strand": Categorical(["t"], np.zeros(b - a, np.uint32)),
                "event_index": rows.event_index[a:b],
                "event_level_mean": rows.event_level_mean[a:b],
                "event_stdv": rows.event_stdv[a:b],
                "event_length": rows.event_length[a:b],
                "model_kmer": Categorical(kmers, model_rank[a:b]),
                "model_mean": rows.model_mean[a:b],
                "model_stdv": rows.model_stdv[a:b],
                "standardized_level": rows.standardized_level[a:b],
            }
            if self.options.signal_index:
                cols["start_idx"] = rows.start_idx[a:b]
                cols["end_idx"] = rows.end_idx[a:b]
            if samples is not None:
                cols["samples"] = samples[a:b]
            yield cols


def _kmer_names(k: int) -> list[str]:
    """Every nucleotide k-mer in rank order, then k N's (a bad event's model k-mer)."""
    names = [""]
    for _ in range(k):
        names = [p + c for p in names for c in NUCLEOTIDE]
    return names + ["N" * k]


def _chunks(row_off: np.ndarray, size: int) -> Iterator[tuple[int, int]]:
    """Row ranges of consecutive whole reads, each reaching at least `size` rows unless it is the last."""
    start = 0
    total = int(row_off[-1])
    while start < total:
        i = int(np.searchsorted(row_off, start + size, side="left"))
        end = int(row_off[min(i, len(row_off) - 1)])
        yield start, end
        start = end


class EventalignSam(BaseSink):
    """`--sam`, the header taken from `template_bam`; "-" is stdout. Version 1 (the default): event-space
    records (nanopolish's, f5c 1.1's); version 2 (`sam_out_version`, f5c 1.6's default): each input record
    of a read with rows, as it is, with f5c's `si`, `ss`, `sc` and `sh` tags appended."""

    needs_events = True  # the rows' events, as the TSV's

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> EventalignSam | None:
        path = context.files.get("eventalign-sam")
        if path is None:
            return None
        return cls(path, context.files["template_bam"], context.options.get("sam_out_version", 1))

    def __init__(self, path: Path | str, template_bam: Path, version: int = 1):
        self.version = version
        self.bam = pysam.AlignmentFile(str(template_bam), "rb", check_sq=False)
        self.sam = pysam.AlignmentFile(str(path), "w", template=self.bam)
        self.records = enumerate(self.bam.fetch(until_eof=True))  # version 2: the inputs, met in file order

    def on_batch(self, result: Result) -> None:
        batch, rows = result.batch, result.products[EVENTALIGN]
        if self.version == 1:
            for rec in sam_records(rows, batch, batch.mapq.tolist(), self.sam.header):
                self.sam.write(rec)
            return
        for i in np.flatnonzero(np.diff(rows.row_off)).tolist():
            rec = self._record(int(batch.numbers[i]))
            a, b = rows.row_off[i], rows.row_off[i + 1]
            si, ss = f5c_ss_tags(rows.position[a:b], rows.start_idx[a:b], rows.end_idx[a:b], bool(batch.rc[i]),
                                 rows.molecule == "rna")  # fmt: skip
            for tag, value, kind in (("si", si, "Z"), ("ss", ss, "Z"), ("sc", float(batch.scale[i]), "f"),
                                     ("sh", float(batch.shift[i]), "f")):  # fmt: skip
                rec.set_tag(tag, value, kind)
            self.sam.write(rec)

    def _record(self, number: int) -> pysam.AlignedSegment:
        """The input record of that number (records come in file order, batch after batch)."""
        for n, rec in self.records:
            if n == number:
                return rec
        raise ValueError(f"record {number} is not in the input BAM")

    def close(self) -> None:
        self.sam.close()
        self.bam.close()


class EventalignSummary(BaseSink):
    """One line per read (`--summary`), signal files named relative to the working directory; under
    `compat` f5c a SLOW5/BLOW5 file is `slow5`, as f5c 1.6 names its signal."""

    needs_events = True  # each read's samples, summed from its events' lengths

    @classmethod
    def open(cls, config: Any, context: SinkContext) -> EventalignSummary | None:
        path = context.files.get("eventalign-summary")
        return cls(path, context.options.get("compat", "f5c")) if path is not None else None

    def __init__(self, path: Path, compat: str = "f5c"):
        self.fh = open(path, "w")
        self.fh.write(SUMMARY_HEADER)
        self.slow5_named = compat == "f5c"
        self.labels: dict[str, str] = {}  # by signal file

    def on_batch(self, result: Result) -> None:
        batch = result.batch
        paths = [self._label(p) for p in batch.signal_paths]
        self.fh.write(summary_lines(result.products[EVENTALIGN], batch, batch.numbers.tolist(), paths))

    def _label(self, path: str) -> str:
        if path not in self.labels:
            slow5 = self.slow5_named and signal_format(Path(path)) in ("slow5", "blow5")
            self.labels[path] = "slow5" if slow5 else _display_path(path)
        return self.labels[path]

    def close(self) -> None:
        self.fh.close()


def _display_path(path: str) -> str:
    """The signal file relative to the working directory when it lies below it (as f5c's index names it)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
