"""Simulated R10.4.1 reads: a known sequence turned into 5 kHz raw signal with the 9-mer level table.

As squigulator does it: each k-mer of the read dwells a random number of samples (gamma
distributed, mean sample_rate / 400 bases per second) at its model level, every sample with
Gaussian noise of the k-mer's stdv; the read's own shift and scale move the levels off the
model (what the scaling stage must undo); pA becomes ADC counts through a PromethION R10.4.1
calibration (2048 ADC levels). The k-mer each sample came from is kept, so a test can check
which k-mer each event was assigned to.

For methylation, `simulate_methylated` draws each CpG of a reference stretch as methylated with
a chosen probability and takes the levels of k-mers holding a methylated C (M) from a CpG model,
the others from the nucleotide table, so the truth is known per site; `synthetic_cpg_model`
builds such a model from the nucleotide table, M levels shifted from the C levels by a known
amount that depends on where in the k-mer each M sits, and `write_text_model` writes either
model as the nanopolish/f5c text both tools read (shortest decimals that read back as the same
float32).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pysam

from streamer.io.signal_record import SignalRecord
from streamer.io.slow5 import write_blow5
from streamer.pore.model import METH_CODE, METHYL_CPG, NUC_CODE, NUCLEOTIDE, PoreModel, logf

SAMPLE_RATE = 5000.0
BASES_PER_SECOND = 400.0
DIGITISATION = 2048.0  # PromethION R10.4.1: ADC 0..2047
OFFSET = -285.0
RANGE = 383.12  # pA per 2048 ADC steps: scale 0.187 pA
R10_RUN = {"flow_cell_product_code": "FLO-PRO114M", "sequencing_kit": "SQK-LSK114"}
M_SHIFT_PA = 4.0  # largest shift of a methylated C's k-mer level, for an M at the k-mer's middle
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


def kmer_ranks(seq: str, k: int, alphabet: str = NUCLEOTIDE) -> np.ndarray:
    codes = METH_CODE if alphabet == METHYL_CPG else NUC_CODE
    digits = codes[np.frombuffer(seq.encode(), np.uint8)].astype(np.int64)
    if (digits < 0).any():
        raise ValueError(f"sequence must be {alphabet} only")
    windows = np.lib.stride_tricks.sliding_window_view(digits, k)
    return windows @ (len(alphabet) ** np.arange(k - 1, -1, -1))


def simulate(model: PoreModel, seq: str, rng: np.random.Generator, shift: float = 6.0, scale: float = 1.08,
             dwell_shape: float = 3.0, read_id: str | None = None) -> SimulatedRead:  # fmt: skip
    """One read of `seq` (ACGT, as sequenced) at 5 kHz and 400 bases/s."""
    ranks = kmer_ranks(seq, model.k)
    return _signal(model.level_mean[ranks], model.level_stdv[ranks], seq, rng, shift, scale, dwell_shape, read_id)


def _signal(mean: np.ndarray, stdv: np.ndarray, seq: str, rng: np.random.Generator, shift: float, scale: float,
            dwell_shape: float, read_id: str | None) -> SimulatedRead:  # fmt: skip
    """Raw signal of a read whose k-mers have these model levels."""
    mean_dwell = SAMPLE_RATE / BASES_PER_SECOND
    dwell = np.maximum(1, np.rint(rng.gamma(dwell_shape, mean_dwell / dwell_shape, len(mean)))).astype(np.int64)
    sample_kmer = np.repeat(np.arange(len(mean)), dwell)
    level = scale * mean.astype(np.float64) + shift
    pa = level[sample_kmer] + rng.normal(0.0, 1.0, len(sample_kmer)) * stdv[sample_kmer]
    raw = np.clip(np.rint(pa * DIGITISATION / RANGE - OFFSET), 0, DIGITISATION - 1).astype(np.int16)
    record = SignalRecord(read_id=read_id or str(uuid.UUID(bytes=rng.bytes(16), version=4)), raw=raw,
                          digitisation=DIGITISATION, offset=OFFSET, range=RANGE, sample_rate=SAMPLE_RATE)  # fmt: skip
    return SimulatedRead(record, seq, sample_kmer, shift, scale)


@dataclass(frozen=True)
class MethylatedRead:
    read: SimulatedRead
    sites: np.ndarray  # int64: reference offsets (in the stretch, forward strand) of the C of each CpG
    methylated: np.ndarray  # bool per site: the truth the read was simulated with


def cpg_sites(stretch: str) -> np.ndarray:
    """Offsets of the C of every CpG in a forward-strand sequence."""
    b = np.frombuffer(stretch.encode(), np.uint8)
    return np.flatnonzero((b[:-1] == ord("C")) & (b[1:] == ord("G")))


def simulate_methylated(kmer_model: PoreModel, meth_model: PoreModel, stretch: str, rc: bool, p_meth: float,
                        rng: np.random.Generator, **kw) -> MethylatedRead:  # fmt: skip
    """A read of the reference `stretch` (forward strand; sequenced as its reverse complement when
    `rc`) with each CpG methylated with probability `p_meth`: on either strand the CpG's C is M,
    and k-mers holding an M take their levels from `meth_model`, the rest from `kmer_model`."""
    k = kmer_model.k
    sites = cpg_sites(stretch)
    methylated = rng.random(len(sites)) < p_meth
    marked = np.frombuffer(stretch.encode(), np.uint8).copy()
    if rc:  # the reverse strand's C of a CpG is the complement of the forward G
        marked = np.frombuffer(reverse_complement(stretch).encode(), np.uint8).copy()
        marked[len(stretch) - 2 - sites[methylated]] = ord("M")
    else:
        marked[sites[methylated]] = ord("M")
    read_seq = marked.tobytes().decode()
    nuc = kmer_ranks(read_seq.replace("M", "C"), k)
    meth = kmer_ranks(read_seq, k, METHYL_CPG)
    has_m = np.lib.stride_tricks.sliding_window_view(marked == ord("M"), k).any(axis=1)
    mean = np.where(has_m, meth_model.level_mean[meth], kmer_model.level_mean[nuc])
    stdv = np.where(has_m, meth_model.level_stdv[meth], kmer_model.level_stdv[nuc])
    read = _signal(mean, stdv, read_seq.replace("M", "C"), rng, kw.get("shift", 6.0), kw.get("scale", 1.08),
                   kw.get("dwell_shape", 3.0), kw.get("read_id"))  # fmt: skip
    return MethylatedRead(read, sites, methylated)


def m_shift_profile(k: int) -> np.ndarray:
    """pA added to a k-mer's level per M at each position: largest mid-k-mer, alternating in sign
    so that k-mers with several Ms (CpG-dense ones) differ from those with one."""
    return np.array([M_SHIFT_PA * math.sin(math.pi * (j + 0.5) / k) * (1 if j % 2 == 0 else -0.5) for j in range(k)])


def synthetic_cpg_model(kmer_model: PoreModel) -> PoreModel:
    """A CpG (ACGMT) model from a nucleotide one: each k-mer's level is that of its C-for-M k-mer
    plus `m_shift_profile` summed over its M positions; stdvs are those of the C k-mer."""
    k = kmer_model.k
    ranks = np.arange(5**k, dtype=np.int64)
    digits = (ranks[:, None] // 5 ** np.arange(k - 1, -1, -1)) % 5  # A C G M T
    nuc_digits = np.array([0, 1, 2, 1, 3])[digits]  # M reads as C
    nuc = nuc_digits @ (4 ** np.arange(k - 1, -1, -1))
    shift = (digits == 3) @ m_shift_profile(k)
    mean = (kmer_model.level_mean[nuc] + shift).astype(np.float32)
    stdv = kmer_model.level_stdv[nuc].copy()
    return PoreModel(f"synthetic_cpg_{k}mer", k, METHYL_CPG, mean, stdv, logf(stdv))


def write_text_model(model: PoreModel, path: Path) -> None:
    """The model as nanopolish/f5c text (`#k`, `#alphabet`, column line, one row per k-mer)."""
    alphabet = "cpg" if model.alphabet == METHYL_CPG else "nucleotide"
    kmers = _all_kmers(model.k, model.alphabet)
    with open(path, "w") as fh:
        fh.write(f"#model_name\t{model.name}\n#k\t{model.k}\n#alphabet\t{alphabet}\n")
        fh.write("kmer\tlevel_mean\tlevel_stdv\tsd_mean\tsd_stdv\tweight\n")
        fh.writelines(f"{km}\t{m}\t{s}\t1\t1\t1\n" for km, m, s in zip(kmers, map(str, model.level_mean),
                                                                      map(str, model.level_stdv)))  # fmt: skip


def _all_kmers(k: int, alphabet: str) -> list[str]:
    """Every k-mer in rank order, built by columns (millions of them)."""
    ranks = np.arange(len(alphabet) ** k, dtype=np.int64)
    letters = np.frombuffer(alphabet.encode(), np.uint8)
    cols = letters[(ranks[:, None] // len(alphabet) ** np.arange(k - 1, -1, -1)) % len(alphabet)]
    return cols.astype(np.uint8).view(f"S{k}").ravel().astype(str).tolist()


@dataclass(frozen=True)
class Placed:
    """A simulated read and where it came from: the forward-strand stretch at `start`."""

    read: SimulatedRead
    start: int
    rc: bool
    stretch: str


def write_run(work: Path, reads: Sequence[Placed], contig: str, length: int) -> None:
    """The files both tools read: `sim.blow5` (R10.4.1 run metadata), the sequences as basecalls
    (`reads.fasta`) and their exact alignments (`reads.bam`, sorted and indexed)."""
    write_blow5(work / "sim.blow5", [p.read.record for p in reads], header=R10_RUN)
    (work / "reads.fasta").write_text("".join(f">{p.read.record.read_id}\n{p.read.seq}\n" for p in reads))
    header = {"HD": {"VN": "1.6", "SO": "unsorted"}, "SQ": [{"SN": contig, "LN": length}]}
    with pysam.AlignmentFile(str(work / "unsorted.bam"), "wb", header=header) as bam:
        for p in reads:
            rec = pysam.AlignedSegment(bam.header)
            rec.query_name, rec.query_sequence, rec.flag = p.read.record.read_id, p.stretch, 16 if p.rc else 0
            rec.reference_id, rec.reference_start, rec.mapping_quality = 0, p.start, 60
            rec.cigartuples = [(0, len(p.stretch))]
            bam.write(rec)
    pysam.sort("-o", str(work / "reads.bam"), str(work / "unsorted.bam"))
    pysam.index(str(work / "reads.bam"))
    (work / "unsorted.bam").unlink()
