"""Eventalign rows of a batch (`eventalign_batch`), nanopolish's scalings, and the stage that
makes them after recalibration."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamer.pipeline.batch import ReadBatch
from streamer_plugins.cpg.hmm_model import HmmParams, NanopolishScaling, nanopolish_scaling, pack_model, pack_scalings
from streamer_plugins.cpg.lookup import CLOSEST_EVENT_SEARCH
from streamer_plugins.cpg.sites import disambiguated
from streamer.pore.model import NUCLEOTIDE, PoreModel
from streamer.skips import Skip
from streamer.pipeline.targets import F5C_LOG_INV_SQRT_2PI, NANOPOLISH_LOG_INV_SQRT_2PI
from streamer_plugins.eventalign.viterbi import (
    NANOPOLISH_MIN_EVENTS_PER_BASE,
    STATE_CHAR_B,
    _ACGT,
    _BASE_RANK,
    realign_batch,
)


@dataclass(frozen=True)
class EventalignOptions:
    """What the rows carry: read names or indices, events scaled to the model, signal spans, samples."""

    print_read_names: bool = False
    scale_events: bool = False
    signal_index: bool = False
    samples: bool = False


@dataclass
class EventalignRows:
    """Eventalign rows of one batch as arrays; `row_off` gives each read's rows."""

    row_off: np.ndarray  # int64[n_reads + 1]
    read: np.ndarray  # int64: the read (batch index) of each row
    position: np.ndarray  # int64: reference position of the k-mer
    ref: np.ndarray  # uint8: the batch's disambiguated reference spans
    kmer_at: np.ndarray  # int64: where each row's reference k-mer starts in `ref`
    k: int
    event_index: np.ndarray  # int64, within the read
    event_level_mean: np.ndarray  # float32
    event_stdv: np.ndarray  # float32
    event_length: np.ndarray  # float32 seconds
    model_rank: np.ndarray  # int64: nucleotide rank of the model k-mer, -1 for a bad event (NNNNNN)
    model_mean: np.ndarray  # float32 (0 for a bad event)
    model_stdv: np.ndarray  # float32
    standardized_level: np.ndarray  # float32
    start_idx: np.ndarray  # int64: the event's first sample
    end_idx: np.ndarray  # int64: past its last sample
    state: np.ndarray  # uint8: 'M' or 'B'
    sample_scaling: np.ndarray  # float64[n_reads, 2]: shift and scale that put `--samples` on the model
    molecule: str = "dna"  # the summary's model_name column: "rna" for direct RNA, as f5c writes it

    def __len__(self) -> int:
        return len(self.position)

    @property
    def reference_kmer(self) -> list[str]:
        text = self.ref.tobytes().decode("ascii")
        return [text[a : a + self.k] for a in self.kmer_at.tolist()]

    @property
    def model_kmer(self) -> list[str]:
        return _kmer_names(self.model_rank, self.k)

    def columns(self, read_labels: Sequence[str], contigs: Sequence[str]) -> dict[str, object]:
        """The TSV's columns by name (numeric as arrays, text as lists); labels and contigs per read."""
        labels = np.asarray(read_labels, dtype=object)[self.read].tolist() if len(self) else []
        contig = np.asarray(contigs, dtype=object)[self.read].tolist() if len(self) else []
        return {
            "contig": contig,
            "position": self.position,
            "reference_kmer": self.reference_kmer,
            "read": labels,
            "strand": ["t"] * len(self),
            "event_index": self.event_index,
            "event_level_mean": self.event_level_mean,
            "event_stdv": self.event_stdv,
            "event_length": self.event_length,
            "model_kmer": self.model_kmer,
            "model_mean": self.model_mean,
            "model_stdv": self.model_stdv,
            "standardized_level": self.standardized_level,
            "start_idx": self.start_idx,
            "end_idx": self.end_idx,
        }


def _kmer_names(rank: np.ndarray, k: int) -> list[str]:
    """The nucleotide k-mer of each rank, NNN..N for -1 (a bad event's model k-mer); decoded per row,
    as the table of all 4^k names is large for 9-mers."""
    digits = (rank[:, None] >> (2 * np.arange(k - 1, -1, -1))) & 3
    letters = np.where(rank[:, None] < 0, ord("N"), _ACGT[digits]).astype(np.uint8)
    return np.ascontiguousarray(letters).view(f"S{k}").ravel().astype(f"U{k}").tolist()


def eventalign_batch(batch: ReadBatch, model: PoreModel, b2e_start: np.ndarray, kmer_off: np.ndarray,
                     events_per_base: np.ndarray, scale_events: bool = False, log_var: np.ndarray | None = None,
                     nanopolish: NanopolishScaling | None = None) -> EventalignRows:  # fmt: skip
    """Eventalign rows of every read of a batch that passed the stages (status 0).

    `b2e_start`, `kmer_off` and `events_per_base` are the post-alignment stage's outputs;
    `log_var` is log of its double var (f5c's; taken from the float32 var when absent). Values
    are float32 computed in the tools' order, so that printing them gives the tools' text;
    f5c's arithmetic unless `nanopolish` is given.
    """
    if model.alphabet != NUCLEOTIDE:
        raise ValueError("eventalign needs a nucleotide pore model")
    k = model.k
    ref = disambiguated(batch.ref_seq)
    status = batch.status.copy()
    epb = np.asarray(events_per_base, np.float64)
    status[(status == Skip.OK) & ~(epb > 0)] = Skip.QC_FAILED
    scalings = pack_scalings(batch.scale, batch.shift, batch.var, log_var)
    if nanopolish is None:
        model64, scalings64, log_c = np.empty((3, 0)), np.zeros((batch.n, 4)), F5C_LOG_INV_SQRT_2PI
    else:
        np_stdv = nanopolish.level_stdv
        model64 = np.stack([nanopolish.level_mean, np_stdv, np.log(np_stdv)])
        with np.errstate(divide="ignore", invalid="ignore"):
            scalings64 = np.stack([nanopolish.scale, nanopolish.shift, nanopolish.var, np.log(nanopolish.var)], axis=1)
        log_c = NANOPOLISH_LOG_INV_SQRT_2PI
        epb = np.maximum(epb, NANOPOLISH_MIN_EVENTS_PER_BASE)
    lp_soft = np.float32(math.log(1.0 - HmmParams.start_to_clip))
    row_off, position, event, state, rank = realign_batch(
        ref, batch.ref_seq_off, batch.ref_start, batch.cigar, batch.cigar_off, batch.rc, batch.seq_off, batch.ev_mean,
        batch.ev_off, status, b2e_start, kmer_off, epb, k, pack_model(model.level_mean, model.level_stdv), scalings,
        model64, scalings64, log_c, HmmParams().as_array(), lp_soft, _BASE_RANK, CLOSEST_EVENT_SEARCH,
    )  # fmt: skip
    read = np.repeat(np.arange(batch.n, dtype=np.int64), np.diff(row_off))
    g = batch.ev_off[read] + event
    mean = batch.ev_mean[g]
    bad = state == STATE_CHAR_B
    r = np.maximum(rank, 0)
    if nanopolish is None:
        shift = batch.shift[read].astype(np.float32)
        scale = batch.scale[read].astype(np.float32)
        var = batch.var[read].astype(np.float32)
        mu = model.level_mean[r].astype(np.float32)
        sd = model.level_stdv[r].astype(np.float32)
        if scale_events:
            mean = (mean - shift) / scale
        else:
            mu = scale * mu + shift
            sd = sd * var
        sample_scaling = np.stack([batch.shift, batch.scale], axis=1).astype(np.float32).astype(np.float64)
    else:
        shift, scale, var = nanopolish.shift[read], nanopolish.scale[read], nanopolish.var[read]
        mu, sd = nanopolish.level_mean[r], nanopolish.level_stdv[r]
        if scale_events:
            mean = ((mean - shift) / scale).astype(np.float32)
        else:
            mu = scale * mu + shift
            sd = sd * var
        mu, sd = mu.astype(np.float32), sd.astype(np.float32)
        sample_scaling = np.stack([nanopolish.shift, nanopolish.scale], axis=1)
    mu = np.where(bad, np.float32(0), mu)
    sd = np.where(bad, np.float32(0), sd)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (mean - mu) / (np.sqrt(var) * sd)  # float32 (f5c) or double (nanopolish) denominator
    start = batch.ev_start[g].astype(np.int64)
    length = batch.ev_length[g]
    return EventalignRows(
        row_off=row_off,
        read=read,
        position=position,
        ref=ref,
        kmer_at=batch.ref_seq_off[read] + position - batch.ref_start[read],
        k=k,
        event_index=event,
        event_level_mean=mean.astype(np.float32),
        event_stdv=batch.ev_stdv[g],
        event_length=(length / batch.sample_rate[read].astype(np.float32)).astype(np.float32),
        model_rank=rank,
        model_mean=mu.astype(np.float32),
        model_stdv=sd.astype(np.float32),
        standardized_level=z.astype(np.float32),
        start_idx=start,
        end_idx=start + length.astype(np.int64),
        state=state,
        sample_scaling=sample_scaling,
    )


COMPAT = ("f5c", "nanopolish")


class EventalignStage:
    """Eventalign as a stage of the chain, after recalibration (`streamer.analyses` entry point
    `eventalign`); its rows, an `EventalignRows`, go to `batch.products["eventalign"]`.

    Placed before the CpG caller, which fails the reads it finds no CpG in, it sees every read
    that passed post-alignment QC. `compat` picks whose arithmetic it follows (see the module
    docstring): "f5c" (1.1) or "nanopolish" (0.14); both share the stages before it, which are f5c's.
    """

    name = "eventalign"
    chunk = 1

    def __init__(self, scale_events: bool = False, compat: str = "f5c"):
        if compat not in COMPAT:
            raise ValueError(f"compat must be one of {COMPAT}, not {compat!r}")
        self.scale_events = scale_events
        self.compat = compat

    def open(self, pipeline) -> None:
        pass

    def __call__(self, batch: ReadBatch, pipeline) -> None:
        kmer = pipeline.kmer_model
        post = batch.post
        nanopolish = None
        if self.compat == "nanopolish":  # recalibrated again from the method-of-moments scalings
            nanopolish = nanopolish_scaling(batch, kmer)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_var = np.log(post.exact[:, 2])  # NaN for the reads not recalibrated, which give no rows
        rows = eventalign_batch(batch, kmer, post.b2e_start, post.kmer_off, post.events_per_base, self.scale_events,
                                log_var, nanopolish)  # fmt: skip
        rows.molecule = "rna" if pipeline.options.chemistry.reverse_signal else "dna"
        batch.products[self.name] = rows


