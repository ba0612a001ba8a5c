"""Method-of-moments scalings: f5c's read1 values, batch semantics, reads that cannot be scaled."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from streamer.io.fastx import load_basecalls
from streamer.pore.model import load_default_models
from streamer.pipeline.scaling import estimate_scalings
from streamer.skips import Skip

from conftest import ECOLI, READ1


@pytest.fixture(scope="session")
def nuc_model():
    return load_default_models()[0]


def parse_events(path: Path) -> np.ndarray:
    """Event means of an f5c `{start,length,mean,stdv,-1,-1}` dump, as the float32 f5c held.

    Printed with 6 decimals, a level of 50-150 pA rounds back to the exact float32.
    """
    rows = re.findall(r"\{([^}]*)\}", path.read_text())
    return np.array([float(r.split(",")[2]) for r in rows], dtype=np.float32)


def pack(seqs: list[str], means: list[np.ndarray]):
    """Flat (seq, seq_off, ev_mean, ev_off, status) of a batch."""
    seq = np.frombuffer("".join(seqs).encode("ascii"), dtype=np.uint8)
    seq_off = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=seq_off[1:])
    ev_off = np.zeros(len(means) + 1, dtype=np.int64)
    np.cumsum([len(m) for m in means], out=ev_off[1:])
    ev_mean = np.concatenate(means).astype(np.float32) if means else np.zeros(0, np.float32)
    return seq, seq_off, ev_mean, ev_off, np.zeros(len(seqs), dtype=np.int8)


def read1() -> tuple[str, np.ndarray]:
    """f5c's single-read case: read1's basecalls and its exact event means."""
    seq = load_basecalls(ECOLI / "reads.fasta", {READ1})[READ1]
    return seq, parse_events(ECOLI / "read1.events.exp")


def test_read1_matches_f5c(nuc_model):
    seq, means = read1()
    shift, scale, var = estimate_scalings(*pack([seq], [means]), nuc_model)
    expected = dict(re.findall(r"(shift|scale): (-?[\d.]+)", (ECOLI / "read1.scalings.exp").read_text()))
    assert f"{shift[0]:.2f}" == expected["shift"]
    assert f"{scale[0]:.2f}" == expected["scale"]
    assert var[0] == 1.0
    # the same moments in numpy, double precision, rounded once to float32
    kmers = [seq[i : i + 6] for i in range(len(seq) - 5)]
    ranks = [int(km.translate(str.maketrans("ACGT", "0123")), 4) for km in kmers]
    levels = nuc_model.level_mean[ranks].astype(np.float64)
    e = means.astype(np.float64)
    ref_shift = e.mean() - levels.mean()
    ref_scale = np.mean((e - ref_shift) ** 2) / np.mean(levels**2)
    assert shift[0] == pytest.approx(np.float32(ref_shift), abs=1e-6)
    assert scale[0] == pytest.approx(np.float32(ref_scale), abs=1e-7)


def test_batch_skips_failed_and_unscalable_reads(nuc_model):
    seq, means = read1()
    batch = pack([seq, seq, "ACGT", seq], [means, means, means[:10], np.zeros(0, np.float32)])
    status = batch[-1]
    status[1] = Skip.NO_SIGNAL
    shift, scale, _ = estimate_scalings(*batch, nuc_model)
    assert list(status) == [Skip.OK, Skip.NO_SIGNAL, Skip.SHORT_READ, Skip.NO_EVENTS]
    assert shift[0] != 0 and shift[1] == 0 and scale[1] == 1


def test_rejects_float64_levels(nuc_model):
    seq, means = read1()
    batch = list(pack([seq], [means]))
    batch[2] = batch[2].astype(np.float64)
    with pytest.raises(ValueError, match="float32"):
        estimate_scalings(*batch, nuc_model)
