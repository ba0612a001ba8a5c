"""The synthetic read a pipeline's warm-up runs through every stage (`Pipeline.start`): its kernels loaded,
or compiled, before real data arrives, and a GPU that cannot run them found at start-up."""

from __future__ import annotations

import numpy as np

from streamer.io.signal_record import SignalRecord
from streamer.pipeline.batch import CIGAR_M, ReadInput
from streamer.pore.model import PoreModel


def synthetic_read(model: PoreModel, n_bases: int = 600, samples_per_kmer: int = 9, seed: int = 7,
                   reverse: bool = False) -> ReadInput:  # fmt: skip
    """A read whose signal follows the model exactly (plus noise), aligned end to end to itself; `reverse`:
    its signal runs 3'->5', as direct RNA's does."""
    rng = np.random.default_rng(seed)
    seq = "".join(rng.choice(list("ACGT"), n_bases))
    ranks = [int(seq[i : i + model.k].translate(str.maketrans("ACGT", "0123")), 4) for i in range(n_bases - model.k + 1)]
    levels = np.repeat(model.level_mean[ranks[::-1] if reverse else ranks], samples_per_kmer)
    signal = levels + rng.normal(0, 1.0, len(levels))
    unit = 0.125  # pA per ADC step
    raw = np.round(signal / unit).astype(np.int16)
    return ReadInput(
        read_id="warm-up",
        seq=seq,
        signal=SignalRecord("warm-up", raw, digitisation=8.0, offset=0.0, range=1.0, sample_rate=4000.0),
        ref_name="synthetic",
        ref_start=0,
        ref_end=n_bases,
        rc=False,
        cigar=np.array([[CIGAR_M, n_bases]], dtype=np.int32),
        ref_seq=seq,
    )
