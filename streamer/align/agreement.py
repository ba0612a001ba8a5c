"""The `auto` alignment engine's choice: the `gpu` engine where a GPU is there and the engine agrees with
mappy on reads simulated from the reference itself, else mappy.

The check is the criterion of the alignment benchmark (`docs/alignment.md`): of the reads whose mappy
primary has MAPQ >= 20, the share whose engine primary is on the same contig and strand and overlaps
it by at least 90% of the shorter span (`records.agree`); the engine is taken at 99% or more. The
reads are R9.4.1-like slices (the harder profile) of windows spread evenly over the reference, so a
check costs seconds and a copy of the windows only, whatever the genome's size; none is a chimera (of
two equal halves, either is a right primary). Everything here is pure: the edge
(`streamer.daemon.aligner`) finds the GPU, runs the aligners and keeps the result beside the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pysam

from streamer.align.bases import decode
from streamer.align.records import agree, primary_of
from streamer.align.simulate import PROFILES, simulate_reads

CHECK_READS = 300
CHECK_MEAN_LENGTH = 4000
CHECK_WINDOWS = 30  # stretches of the reference the reads come from, spread evenly over it
CHECK_WINDOW = 200_000
CHECK_MIN_LENGTH = 500
MIN_MAPQ = 20  # reads compared: those mappy maps at this MAPQ or more
MIN_AGREEMENT = 0.99


@dataclass(frozen=True)
class Agreement:
    """How far an engine's primaries agree with mappy's on the check's reads."""

    reads: int  # simulated
    compared: int  # of them, those whose mappy primary has MAPQ >= MIN_MAPQ
    agreed: int  # of those, the ones whose engine primary agrees

    @property
    def passed(self) -> bool:
        return self.compared > 0 and self.agreed >= MIN_AGREEMENT * self.compared

    def text(self) -> str:
        share = f", {100 * self.agreed / self.compared:.1f}%" if self.compared else ""
        return f"agreed with mappy on {self.agreed} of {self.compared} reads mapped at MAPQ >= {MIN_MAPQ}{share}"


@dataclass(frozen=True)
class EngineChoice:
    """The engine a run aligns with: the one asked for (`alignment.engine`, `--align-engine`), the one
    used, why, and the check that decided it (for `auto` where a GPU is there)."""

    asked: str
    engine: str
    why: str
    check: Agreement | None = None

    def line(self) -> str:
        return f"alignment engine {self.asked}: {self.engine} ({self.why})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.check.passed if self.check is not None else None}


def asked_for(engine: str) -> EngineChoice:
    """An engine named outright: used as it is."""
    return EngineChoice(engine, engine, "as asked")


def choose_engine(no_gpu: str, check: Agreement | None) -> EngineChoice:
    """`auto`'s engine. `no_gpu`: why the gpu engine cannot be used ("" where a GPU is there and the
    engine started); `check`: its agreement with mappy (None where it was not run)."""
    if no_gpu:
        return EngineChoice("auto", "mappy", no_gpu)
    if check is None:
        return EngineChoice("auto", "mappy", "the gpu engine was not checked against mappy")
    if check.passed:
        return EngineChoice("auto", "gpu", f"the gpu engine {check.text()}", check)
    return EngineChoice("auto", "mappy", f"the gpu engine {check.text()}: under {MIN_AGREEMENT:.0%}", check)


def agreement(mappy: Sequence[list[pysam.AlignedSegment]], engine: Sequence[list[pysam.AlignedSegment]]
              ) -> Agreement:  # fmt: skip
    """The engine's records of each read (`records_all`) against mappy's, read by read."""
    if len(mappy) != len(engine):
        raise ValueError(f"records of {len(mappy)} and {len(engine)} reads")
    compared = agreed = 0
    for theirs, ours in zip(mappy, engine):
        ref = primary_of(theirs)
        if ref is None or ref.mapping_quality < MIN_MAPQ:
            continue
        compared += 1
        own = primary_of(ours)
        agreed += own is not None and agree(ref, own)
    return Agreement(len(mappy), compared, agreed)


def check_windows(names: Sequence[str], genome: np.ndarray, contig_offsets: np.ndarray,
                  count: int = CHECK_WINDOWS, size: int = CHECK_WINDOW) -> list[tuple[str, np.ndarray]]:  # fmt: skip
    """Up to `count` stretches of `size` bases (views, no copy) starting at even steps over the contigs
    laid end to end, each cut at its contig's end; those too short for a read are left out."""
    total = int(contig_offsets[-1])
    if total == 0:
        return []
    starts = np.unique((np.arange(count) * total) // max(count, 1))
    out = []
    for start in starts:
        ctg = int(np.searchsorted(contig_offsets, start, side="right")) - 1
        end = min(int(start) + size, int(contig_offsets[ctg + 1]))
        if end - start >= CHECK_MIN_LENGTH:
            out.append((f"{names[ctg]}:{start - contig_offsets[ctg]}", genome[start:end]))
    return out


def check_reads(names: Sequence[str], genome: np.ndarray, contig_offsets: np.ndarray,
                n: int = CHECK_READS) -> list[tuple[str, str]]:  # fmt: skip
    """The check's (read id, sequence) pairs, the same for the same reference."""
    windows = check_windows(names, genome, contig_offsets)
    if not windows:
        return []
    reads = simulate_reads(windows, n, PROFILES["r9"], mean_length=CHECK_MEAN_LENGTH, min_length=CHECK_MIN_LENGTH,
                           chimeras=0.0, seed=1, prefix="check_")  # fmt: skip
    return [(name, decode(reads.seq(i))) for i, name in enumerate(reads.names)]
