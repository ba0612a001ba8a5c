"""The fixture's E. coli reads as ABEA receives them: basecalls, detected events, scalings."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamer.pipeline.events import detect_events
from streamer.io.fast5 import iter_fast5
from streamer.io.fastx import load_basecalls
from streamer.pipeline.scaling import estimate_scalings

ECOLI = Path(__file__).parent / "data" / "ecoli"


def fixture_reads(model) -> tuple:
    """(basecalls, event means per read, shift, scale) of every fixture read with a basecall."""
    calls = load_basecalls(ECOLI / "reads.fasta")
    seqs, signals = [], []
    for path in sorted((ECOLI / "fast5").glob("*.fast5")):
        for rec in iter_fast5(path):
            if rec.read_id in calls:
                seqs.append(calls[rec.read_id])
                signals.append(rec.to_pa().astype(np.float32))
    sig_off = np.zeros(len(signals) + 1, np.int64)
    np.cumsum([len(s) for s in signals], out=sig_off[1:])
    ev_off, _, _, ev_mean, _ = detect_events(np.concatenate(signals), sig_off)
    seq = np.frombuffer("".join(seqs).encode(), dtype=np.uint8)
    seq_off = np.zeros(len(seqs) + 1, np.int64)
    np.cumsum([len(s) for s in seqs], out=seq_off[1:])
    shift, scale, _ = estimate_scalings(seq, seq_off, ev_mean, ev_off, np.zeros(len(seqs), np.int8), model)
    means = [ev_mean[ev_off[i] : ev_off[i + 1]] for i in range(len(seqs))]
    return seqs, means, shift, scale
