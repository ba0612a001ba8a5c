"""Simulated direct RNA reads (RNA002, RNA004): transcripts made up at random, reads of them whose
signal runs 3'->5' at 70 or 130 bases per second from a U-as-T level table, as f5c reads them.

As `r10_sim` does for DNA (gamma-distributed dwells, Gaussian noise of the k-mer's stdv, the read's
own shift and scale, pA turned into ADC counts through a MinKNOW calibration), with what direct RNA
changes: the molecule enters the pore 3' end first, so the read's last k-mer is the first in the
signal; basecalls are written with U, as RNA basecallers write them; the run metadata names the RNA
kit (`experiment_type rna`, `sqk-rna002`/`sqk-rna004`, as MinKNOW writes them). The k-mer each sample
came from is kept (an index into the read's k-mers, 5'->3'), so a test can check where each event
landed. Reads are aligned to the transcripts with mappy (minimap2's binding), as the daemon aligns.

Neither RNA004 9-mer table is small enough for tests/data, so `synthetic_rna004_model` derives one from
the shipped RNA002 5-mer table (each 9-mer's level that of its middle 5-mer, pulled by its flanks);
benchmarks may take any real text table instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pysam

from r10_sim import Placed, SimulatedRead, kmer_ranks, write_text_model
from streamer.daemon.aligner import ReadAligner
from streamer.io.alignments import AlignmentFilter
from streamer.io.signal_record import SignalRecord
from streamer.io.pod5 import write_pod5
from streamer.io.slow5 import write_blow5
from streamer.pore.model import NUCLEOTIDE, PoreModel, logf

__all__ = ["RNA002_KIT", "RNA004_KIT", "Placed", "RnaKit", "kmer_truth", "make_transcripts", "simulate_rna",
           "simulate_reads", "synthetic_rna004_model", "write_rna_run", "write_text_model"]  # fmt: skip


@dataclass(frozen=True)
class RnaKit:
    """A direct RNA kit as a run records it: rate, speed, ADC calibration and run metadata."""

    pore: str  # streamer's --pore
    sample_rate: float
    bases_per_second: float
    digitisation: float
    offset: float
    range: float  # pA over `digitisation` ADC steps
    run: dict  # run metadata, as the signal files carry it

    @property
    def samples_per_base(self) -> float:
        return self.sample_rate / self.bases_per_second


RNA002_KIT = RnaKit("rna002", 3012.0, 70.0, 8192.0, 13.0, 1467.61,  # MinION R9.4.1: 14-bit ADC
                    {"experiment_type": "rna", "flow_cell_product_code": "FLO-MIN106",
                     "sequencing_kit": "sqk-rna002"})  # fmt: skip
RNA004_KIT = RnaKit("rna004", 4000.0, 130.0, 2048.0, -259.0, 291.5,  # PromethION RNA004: 11-bit ADC
                    {"experiment_type": "rna", "flow_cell_product_code": "FLO-PRO004RA",
                     "sequencing_kit": "sqk-rna004"})  # fmt: skip


def synthetic_rna004_model(rna002: PoreModel) -> PoreModel:
    """A 9-mer U-as-T table from the 5-mer one: each 9-mer's level is 0.8 of its middle 5-mer's plus 0.1
    of each flanking 5-mer's (so that all nine bases count), its stdv the middle 5-mer's."""
    if rna002.k != 5:
        raise ValueError("derives from a 5-mer table")
    ranks = np.arange(4**9, dtype=np.int64)
    left, mid, right = ranks >> 8, (ranks >> 4) & 0x3FF, ranks & 0x3FF
    mean64 = rna002.level_mean.astype(np.float64)
    mean = (0.8 * mean64[mid] + 0.1 * mean64[left] + 0.1 * mean64[right]).astype(np.float32)
    stdv = rna002.level_stdv[mid].copy()
    return PoreModel("synthetic_rna004_9mer", 9, NUCLEOTIDE, mean, stdv, logf(stdv))


def make_transcripts(rng: np.random.Generator, n: int = 6, lengths: tuple[int, int] = (1500, 4000)) -> dict[str, str]:
    """`n` random transcripts (ACGT, as transcriptome FASTAs are written), named tx1, tx2, ..."""
    return {f"tx{i + 1}": "".join(rng.choice(list("ACGT"), int(rng.integers(*lengths)))) for i in range(n)}


def simulate_rna(model: PoreModel, seq: str, kit: RnaKit, rng: np.random.Generator, shift: float = 4.0,
                 scale: float = 1.05, dwell_shape: float = 3.0,
                 read_id: str | None = None) -> SimulatedRead:  # fmt: skip
    """One read of `seq` (5'->3', ACGT) whose signal runs 3'->5'; `sample_kmer` indexes the read's k-mers
    5'->3', so it decreases along the signal."""
    ranks = kmer_ranks(seq, model.k)[::-1]  # the order the pore reads them
    mean_dwell = kit.samples_per_base
    dwell = np.maximum(1, np.rint(rng.gamma(dwell_shape, mean_dwell / dwell_shape, len(ranks)))).astype(np.int64)
    sample_kmer = np.repeat(np.arange(len(ranks))[::-1], dwell)
    level = scale * model.level_mean.astype(np.float64)[ranks] + shift
    stdv = model.level_stdv.astype(np.float64)[ranks]
    order = np.repeat(np.arange(len(ranks)), dwell)
    pa = level[order] + rng.normal(0.0, 1.0, len(order)) * stdv[order]
    raw = np.clip(np.rint(pa * kit.digitisation / kit.range - kit.offset), -kit.digitisation,
                  kit.digitisation - 1).astype(np.int16)  # fmt: skip
    record = SignalRecord(read_id=read_id or str(uuid.UUID(bytes=rng.bytes(16), version=4)), raw=raw,
                          digitisation=kit.digitisation, offset=kit.offset, range=kit.range,
                          sample_rate=kit.sample_rate)  # fmt: skip
    return SimulatedRead(record, seq, sample_kmer, shift, scale)


def simulate_reads(model: PoreModel, transcripts: dict[str, str], kit: RnaKit, n_reads: int, rng: np.random.Generator,
                   lengths: tuple[int, int] = (400, 1500)) -> list[Placed]:  # fmt: skip
    """`n_reads` reads, each of a random transcript from near its 3' end (where direct RNA reads start) to a
    random length, with a random shift, scale and dwell shape."""
    names = sorted(transcripts)
    reads = []
    for _ in range(n_reads):
        name = names[int(rng.integers(len(names)))]
        tx = transcripts[name]
        end = len(tx) - int(rng.integers(0, 40))
        start = max(0, end - int(rng.integers(*lengths)))
        stretch = tx[start:end]
        sim = simulate_rna(model, stretch, kit, rng, shift=float(rng.normal(0, 6)), scale=float(rng.uniform(0.9, 1.15)),
                           dwell_shape=float(rng.uniform(1.5, 4.0)))  # fmt: skip
        reads.append(Placed(sim, start, False, stretch))
    return reads


def write_rna_run(work: Path, kit: RnaKit, reads: Sequence[Placed], transcripts: dict[str, str], *,
                  signal: str = "blow5") -> Path:  # fmt: skip
    """The files both tools read: `transcripts.fa` (+ .fai), the signal (`sim.blow5`, or `sim.pod5`) with the
    kit's run metadata, the basecalls with U (`reads.fastq`), and their mappy alignments (`reads.bam`, sorted
    and indexed). Returns the signal file."""
    work.mkdir(parents=True, exist_ok=True)
    fasta = work / "transcripts.fa"
    fasta.write_text("".join(f">{name}\n{seq}\n" for name, seq in transcripts.items()))
    pysam.faidx(str(fasta))
    records = [p.read.record for p in reads]
    path = work / f"sim.{signal}"
    if signal == "pod5":
        write_pod5(path, records, run=kit.run)
    else:
        write_blow5(path, records, header=kit.run)
    basecalls = [(p.read.record.read_id, p.read.seq.replace("T", "U")) for p in reads]
    (work / "reads.fastq").write_text("".join(f"@{rid}\n{seq}\n+\n{'5' * len(seq)}\n" for rid, seq in basecalls))
    aligner = ReadAligner(fasta, AlignmentFilter(), threads=1)
    with pysam.AlignmentFile(str(work / "unsorted.bam"), "wb", header=aligner.header) as bam:
        for rid, seq in basecalls:
            for rec in aligner.records(rid, seq.replace("U", "T")):
                bam.write(rec)
    pysam.sort("-o", str(work / "reads.bam"), str(work / "unsorted.bam"))
    pysam.index(str(work / "reads.bam"))
    (work / "unsorted.bam").unlink()
    return path


def kmer_truth(read: Placed, start_idx: np.ndarray, end_idx: np.ndarray) -> np.ndarray:
    """The transcript position of the k-mer each event's samples were mostly simulated from (events by
    their first and past-last sample)."""
    kmer = read.read.sample_kmer
    return np.array([read.start + int(np.bincount(kmer[a:b]).argmax()) for a, b in zip(start_idx, end_idx)])
