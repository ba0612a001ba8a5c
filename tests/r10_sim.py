"""Simulated R10.4.1 reads: a known sequence turned into 5 kHz raw signal with the 9-mer level table.

As squigulator does it: each k-mer of the read dwells a random number of samples (gamma
distributed, mean sample_rate / 400 bases per second) at its model level, every sample with
Gaussian noise of the k-mer's stdv; the read's own shift and scale move the levels off the
model (what the scaling stage must undo); pA becomes ADC counts through a PromethION R10.4.1
calibration (2048 ADC levels). The k-mer each sample came from is kept, so a test can check
which k-mer each event was assigned to.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from streamer.io.fast5 import SignalRecord
from streamer.poremodel import NUC_CODE, PoreModel

SAMPLE_RATE = 5000.0
BASES_PER_SECOND = 400.0
DIGITISATION = 2048.0  # PromethION R10.4.1: ADC 0..2047
OFFSET = -285.0
RANGE = 383.12  # pA per 2048 ADC steps: scale 0.187 pA
R10_RUN = {"flow_cell_product_code": "FLO-PRO114M", "sequencing_kit": "SQK-LSK114"}
_COMPLEMENT = str.maketrans("ACGT", "TGCA")


def reverse_complement(seq: str) -> str:
    return seq.translate(_COMPLEMENT)[::-1]


@dataclass(frozen=True)
class SimulatedRead:
    record: SignalRecord  # raw ADC samples and calibration
    seq: str  # the read as sequenced (the reverse complement of the reference for a reverse-strand read)
    sample_kmer: np.ndarray  # int64 per sample: index of the read k-mer it was simulated from
    shift: float  # pA added to every scaled model level
    scale: float  # factor on every model level


def kmer_ranks(seq: str, k: int) -> np.ndarray:
    digits = NUC_CODE[np.frombuffer(seq.encode(), np.uint8)].astype(np.int64)
    if (digits < 0).any():
        raise ValueError("sequence must be ACGT only")
    windows = np.lib.stride_tricks.sliding_window_view(digits, k)
    return windows @ (4 ** np.arange(k - 1, -1, -1))


def simulate(model: PoreModel, seq: str, rng: np.random.Generator, shift: float = 6.0, scale: float = 1.08,
             dwell_shape: float = 3.0, read_id: str | None = None) -> SimulatedRead:  # fmt: skip
    """One read of `seq` (ACGT, as sequenced) at 5 kHz and 400 bases/s."""
    ranks = kmer_ranks(seq, model.k)
    mean_dwell = SAMPLE_RATE / BASES_PER_SECOND
    dwell = np.maximum(1, np.rint(rng.gamma(dwell_shape, mean_dwell / dwell_shape, len(ranks)))).astype(np.int64)
    sample_kmer = np.repeat(np.arange(len(ranks)), dwell)
    level = scale * model.level_mean[ranks].astype(np.float64) + shift
    pa = level[sample_kmer] + rng.normal(0.0, 1.0, len(sample_kmer)) * model.level_stdv[ranks][sample_kmer]
    raw = np.clip(np.rint(pa * DIGITISATION / RANGE - OFFSET), 0, DIGITISATION - 1).astype(np.int16)
    record = SignalRecord(read_id=read_id or str(uuid.UUID(bytes=rng.bytes(16), version=4)), raw=raw,
                          digitisation=DIGITISATION, offset=OFFSET, range=RANGE, sample_rate=SAMPLE_RATE)  # fmt: skip
    return SimulatedRead(record, seq, sample_kmer, shift, scale)
