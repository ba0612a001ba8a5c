"""The daemon's eventalign output: `eventalign.tsv` and the `eventalign` topic.

The rows are `streamer eventalign`'s, computed and printed by the same functions
(`eventalign_batch`, `format_tsv`). They are made by an extra stage of the call pipeline,
after recalibration and before the HMM, so events, scalings and ABEA serve both outputs; with
eventalign off the stage is absent and costs nothing.

The published message carries the TSV's columns under the TSV header's names, split into
messages of whole reads of about `MESSAGE_ROWS` rows; repeated strings (contig, k-mers, read
names) go as codes into small value lists, so a message costs a few array copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamer.batch import ReadBatch
from streamer.config import EventalignConfig
from streamer_plugins.eventalign import EventalignOptions, EventalignRows, eventalign_batch, format_tsv, tsv_header
from streamer.poremodel import NUCLEOTIDE, PoreModel
from streamer.postalign import PostAlign
from streamer.publish.protocol import Categorical

EVENTALIGN_TSV = "eventalign.tsv"
MESSAGE_ROWS = 100_000  # rows per published message, about: a few MB, well inside the publisher's queue

_RANK = np.zeros(256, np.int64)  # the disambiguated reference is ACGT only
for _i, _b in enumerate(b"ACGT"):
    _RANK[_b] = _i


@dataclass(frozen=True)
class EventalignBatch:
    """A batch's eventalign rows, with the batch they index (events, scalings, signal, names)."""

    batch: ReadBatch
    rows: EventalignRows


@dataclass(frozen=True)
class EventalignStage:
    """The pipeline's extra stage: eventalign rows of every read that passed post-alignment QC."""

    scale_events: bool
    name: str = "eventalign"

    def __call__(self, batch: ReadBatch, post: PostAlign, kmer_model: PoreModel) -> EventalignBatch:
        # log var from the double var, as f5c takes it (and `streamer eventalign` does)
        rows = eventalign_batch(batch, kmer_model, post.b2e_start, post.kmer_off, post.events_per_base,
                                self.scale_events, np.log(post.exact[:, 2]))  # fmt: skip
        return EventalignBatch(batch, rows)


def options_of(cfg: EventalignConfig) -> EventalignOptions:
    return EventalignOptions(cfg.print_read_names, cfg.scale_events, cfg.signal_index, cfg.samples)


class EventalignOutput:
    """Turns a batch's rows into TSV text and message columns; `label` names a batch record's read."""

    def __init__(self, options: EventalignOptions):
        self.options = options
        self.header = tsv_header(options)
        self._names = self.header.rstrip("\n").split("\t")

    def labels(self, batch: ReadBatch, numbers: dict[str, int]) -> list[str]:
        """Each record's read column: its read id, or the read's ledger number."""
        if self.options.print_read_names:
            return list(batch.read_ids)
        return [str(numbers[rid]) for rid in batch.read_ids]

    def text(self, ea: EventalignBatch, labels: Sequence[str]) -> str:
        return format_tsv(ea.rows, ea.batch, labels, self.options)

    def messages(self, ea: EventalignBatch, labels: Sequence[str], text: str) -> Iterator[dict[str, Any]]:
        """Column maps of whole reads, about MESSAGE_ROWS rows each; `text` is `self.text`'s (for samples)."""
        rows, batch = ea.rows, ea.batch
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
