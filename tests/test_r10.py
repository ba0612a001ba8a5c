"""R10.4.1: the uncalled4 9-mer level table loads and validates; the pore is told from run
metadata; methylation on R10.4.1 data without its CpG model stops with a plain message; eventalign on simulated
R10.4.1 reads puts their events on the 9-mers they came from."""

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pysam
import pytest
from conftest import ECOLI, REFERENCE
from r10_sim import R10_RUN, reverse_complement, simulate

from streamer.errors import ModelError
from streamer.io.pod5 import write_pod5
from streamer.io.reference import Reference
from streamer.io.slow5 import write_blow5
from streamer.pipeline.chemistry import F5C_RELEASES, pore_from_metadata, pore_of_file
from streamer.pipeline.chemistry import R10 as R10_CHEMISTRY
from streamer.pore.model import NUCLEOTIDE, _kmer_at_rank, load_model

R10_KMER_MODEL, R10_METH_MODEL = R10_CHEMISTRY.kmer_model.name, R10_CHEMISTRY.meth_model.name

R10_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "r10" / "dna_r10.4.1_400bps_9mer.npz"
FORMATS = Path(__file__).resolve().parents[2] / "shared" / "data" / "formats"
CONTIG = "NC_000913.3"


def write_npz(path, k=2, kmers=None, drop=None, empty_stdv=False):
    n = 4**k
    arrays = {
        "kmer": np.array(kmers if kmers is not None else [_kmer_at_rank(r, k, NUCLEOTIDE) for r in range(n)]),
        "current.mean": np.linspace(-1, 1, n, dtype=np.float32),
        "current.stdv": np.zeros(0, np.float32) if empty_stdv else np.full(n, 0.1, np.float32),
        "_k": np.int64(k), "_pa_mean": np.float64(90.0), "_pa_stdv": np.float64(20.0), "_name": np.str_("tiny"),
    }  # fmt: skip
    arrays.pop(drop, None)
    np.savez(path, **arrays)
    return path


def test_npz_levels_in_pa(tmp_path):
    model = load_model(write_npz(tmp_path / "m.npz"))
    assert (model.name, model.k, model.alphabet, model.n_kmers) == ("tiny", 2, "ACGT", 16)
    assert model.level_mean[0] == pytest.approx(70.0) and model.level_mean[-1] == pytest.approx(110.0)
    assert model.level_stdv == pytest.approx(np.full(16, 2.0))


@pytest.mark.parametrize("case, message", [
    ({"kmers": ["AA"] * 16}, "out of rank order"),
    ({"kmers": [_kmer_at_rank(r, 2, NUCLEOTIDE) for r in range(15)]}, "15 rows, expected 4^2 = 16"),
    ({"kmers": ["AAN", *(_kmer_at_rank(r, 2, NUCLEOTIDE) for r in range(1, 16))]}, "out of rank order"),
    ({"drop": "_pa_stdv"}, "no '_pa_stdv' array"),
    ({"empty_stdv": True}, "no level stdv (its 'current.stdv' is empty)"),
])  # fmt: skip
def test_npz_validated(tmp_path, case, message):
    with pytest.raises(ModelError, match=re.escape(message)):
        load_model(write_npz(tmp_path / "m.npz", **case))


@pytest.mark.skipif(not R10_MODEL.is_file(), reason="../shared R10 model not present")
def test_r10_9mer_table():
    model = load_model(R10_MODEL)
    assert (model.k, model.alphabet, model.n_kmers, model.name) == (9, "ACGT", 4**9, "dna_r10.4.1_400bps_9mer")
    assert 40 < model.level_mean.min() < model.level_mean.max() < 170 and (model.level_stdv > 0).all()


def test_pore_from_metadata():
    assert pore_from_metadata(["FLO-PRO114M", "sqk-lsk114"]) == "r10"
    assert pore_from_metadata(["FLO-MIN114"]) == "r10"
    assert pore_from_metadata(["python/recipes/nc/NC_48Hr_Sequencing_Run_FLO-MIN106_SQK-LSK108.py"]) == "r9"
    assert pore_from_metadata(["FLO-PRO002", "sqk-lsk109"]) == "r9"
    assert pore_from_metadata(["genomic_dna", ""]) is None


def test_pore_of_files():
    assert pore_of_file(next((ECOLI / "fast5").iterdir())) == "r9"
    assert pore_of_file(ECOLI / "reads.fasta") is None
    shared = {"pod5_dorado/chr1_MAT.pod5": "r10", "blow5_slow5tools/na12878_prom_merged_r9.4.1_chr22_read1.blow5": "r9"}
    for name, pore in shared.items():
        if (FORMATS / name).is_file():
            assert pore_of_file(FORMATS / name) == pore


def call(tmp_path, signal, *extra):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    return subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp_path / "reads.fasta"),
                           "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(signal),
                           "-o", str(tmp_path / "meth.tsv"), "-t", "2", *extra],
                          capture_output=True, text=True)  # fmt: skip


def test_methylation_on_r10_names_the_missing_cpg_model(tmp_path, monkeypatch):
    """R10.4.1 data without the CpG 9-mer model: one plain line naming the file looked for and where
    f5c publishes it (the nucleotide table, here a placeholder, is found first)."""
    models = tmp_path / "models"
    (models / "r10").mkdir(parents=True)
    (models / "r10" / R10_KMER_MODEL).write_bytes(b"")
    monkeypatch.setenv("STREAMER_MODEL_DIR", str(models))
    proc = call(tmp_path, ECOLI / "fast5", "--pore", "r10")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line == (f"streamer call: R10.4.1 reads (--pore r10): {models / 'r10' / R10_METH_MODEL}: no R10.4.1 CpG "
                    f"methylation model: f5c publishes its CpG 9-mer model {R10_METH_MODEL} with its releases "
                    f"({F5C_RELEASES}); put it there or pass --meth-model FILE")  # fmt: skip
    pod5 = FORMATS / "pod5_dorado" / "chr1_MAT.pod5"
    if pod5.is_file():  # told from the file's run metadata
        proc = call(tmp_path, pod5)
        assert proc.returncode == 1 and "chr1_MAT.pod5's run metadata" in proc.stderr, proc.stderr


# --- eventalign on simulated R10.4.1 reads -------------------------------------------------------

STRETCHES = ((2_066_000, False), (2_068_500, True))  # reference start, reverse strand: two reads of 2 kb
STRETCH = 2000
SIM_SHIFT, SIM_SCALE = 6.0, 1.08


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """Two reads simulated from the 9-mer table (one per strand), as R10.4.1 POD5 and BLOW5, with their
    sequences as basecalls and an exact alignment to the reference."""
    if not R10_MODEL.is_file():
        pytest.skip("../shared R10 model not present")
    model = load_model(R10_MODEL)
    tmp = tmp_path_factory.mktemp("r10sim")
    rng = np.random.default_rng(2024)
    with Reference(REFERENCE) as ref:
        contig_len = ref.length(CONTIG)
        stretches = [ref.fetch(CONTIG, start, start + STRETCH) for start, _ in STRETCHES]
    reads = [simulate(model, reverse_complement(s) if rc else s, rng, SIM_SHIFT, SIM_SCALE)
             for s, (_, rc) in zip(stretches, STRETCHES)]  # fmt: skip
    assert write_pod5(tmp / "sim.pod5", [r.record for r in reads], run=R10_RUN) == 2
    assert write_blow5(tmp / "sim.blow5", [r.record for r in reads], header=R10_RUN) == 2
    assert pore_of_file(tmp / "sim.pod5") == pore_of_file(tmp / "sim.blow5") == "r10"
    (tmp / "reads.fasta").write_text("".join(f">{r.record.read_id}\n{r.seq}\n" for r in reads))
    header = {"HD": {"VN": "1.6", "SO": "coordinate"}, "SQ": [{"SN": CONTIG, "LN": contig_len}]}
    with pysam.AlignmentFile(str(tmp / "reads.bam"), "wb", header=header) as bam:
        for r, s, (start, rc) in zip(reads, stretches, STRETCHES):
            rec = pysam.AlignedSegment(bam.header)
            rec.query_name, rec.query_sequence, rec.flag = r.record.read_id, s, 16 if rc else 0
            rec.reference_id, rec.reference_start, rec.mapping_quality = 0, start, 60
            rec.cigartuples = [(0, STRETCH)]
            bam.write(rec)
    pysam.index(str(tmp / "reads.bam"))
    return tmp, model, reads


def eventalign(tmp, signal, *flags):
    return subprocess.run([sys.executable, "-m", "streamer", "eventalign", "-r", str(tmp / "reads.fasta"),
                           "-b", str(tmp / "reads.bam"), "-g", str(REFERENCE), "--signal", str(signal), "-t", "2",
                           *flags], capture_output=True, text=True)  # fmt: skip


@pytest.fixture(scope="module")
def simulated_eventalign(simulated):
    tmp, _, _ = simulated
    out, summary = tmp / "eventalign.pod5.tsv", tmp / "summary.tsv"
    proc = eventalign(tmp, tmp / "sim.pod5", "--kmer-model", str(R10_MODEL), "--scale-events", "--signal-index",
                      "--print-read-names", "-o", str(out), "--summary", str(summary))  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return out, summary


def test_simulated_r10_eventalign(simulated, simulated_eventalign):
    """Events are found, the read is scaled, ABEA and eventalign succeed, and at least 90% of the
    aligned events land on the reference 9-mer their samples were simulated from."""
    tmp, model, reads = simulated
    out, summary = simulated_eventalign
    with open(out) as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    with open(summary) as fh:
        summaries = {s["read_name"]: s for s in csv.DictReader(fh, delimiter="\t")}
    assert set(summaries) == {r.record.read_id for r in reads}
    k, levels = model.k, np.array([model.level_mean.min(), model.level_mean.max()], np.float64)
    for read, (start, rc) in zip(reads, STRETCHES):
        s = summaries[read.record.read_id]
        n_kmers = STRETCH - k + 1
        assert n_kmers <= int(s["num_events"]) <= 4 * n_kmers  # segmented at about a k-mer per event or finer
        # the read's scaling maps model levels onto the simulated ones, across the model's whole range
        fitted = float(s["scale"]) * levels + float(s["shift"])
        assert np.abs(fitted - (SIM_SCALE * levels + SIM_SHIFT)).max() < 2.5, s
        mine = [r for r in rows if r["read_name"] == read.record.read_id]
        matched = [r for r in mine if r["model_kmer"] != "N" * k]
        assert len(matched) >= 0.97 * len(mine)
        positions = np.array([int(r["position"]) for r in matched])
        assert positions.min() <= start + 10 and positions.max() >= start + STRETCH - k - 10
        right = 0
        for r in matched:
            ki = np.bincount(read.sample_kmer[int(r["start_idx"]) : int(r["end_idx"])]).argmax()  # the event's k-mer
            right += int(r["position"]) == (start + STRETCH - k - ki if rc else start + ki)
            assert r["model_kmer"] == (reverse_complement(r["reference_kmer"]) if rc else r["reference_kmer"])
            rank = int(r["model_kmer"].translate(str.maketrans("ACGT", "0123")), 4)
            assert float(r["model_mean"]) == pytest.approx(model.level_mean[rank], abs=0.0051)
            assert float(r["model_stdv"]) == pytest.approx(model.level_stdv[rank], abs=0.0051)
        assert right / len(matched) >= 0.90, (read.record.read_id, right, len(matched))


def test_simulated_r10_blow5_same_rows(simulated, simulated_eventalign):
    """The same reads as BLOW5 (pore told from its header) give the same rows byte for byte."""
    tmp, _, _ = simulated
    out = tmp / "eventalign.blow5.tsv"
    proc = eventalign(tmp, tmp / "sim.blow5", "--kmer-model", str(R10_MODEL), "--scale-events", "--signal-index",
                      "--print-read-names", "-o", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == simulated_eventalign[0].read_text()


def test_simulated_r10_gpu_abea_equals_cpu(simulated):
    """On a GPU the 9-mer reads are aligned by the CUDA kernels: the rows equal the CPU-only run's."""
    from test_gpu_abea import _gpu_present

    if not _gpu_present():
        pytest.skip("no CUDA GPU")
    tmp, _, _ = simulated
    flags = ("--kmer-model", str(R10_MODEL), "--scale-events", "--signal-index", "--print-read-names", "--samples")
    gpu = eventalign(tmp, tmp / "sim.pod5", *flags, "-o", str(tmp / "ea.gpu.tsv"))
    cpu = eventalign(tmp, tmp / "sim.pod5", *flags, "-o", str(tmp / "ea.cpu.tsv"), "--disable-cuda")
    assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stderr + cpu.stderr
    assert "GPU ABEA on" in gpu.stderr and "GPU ABEA on" not in cpu.stderr
    assert (tmp / "ea.gpu.tsv").read_text() == (tmp / "ea.cpu.tsv").read_text()


def test_r10_eventalign_needs_the_9mer_model(simulated, monkeypatch):
    tmp, _, _ = simulated
    monkeypatch.setenv("STREAMER_MODEL_DIR", str(tmp / "no-models"))
    proc = eventalign(tmp, tmp / "sim.pod5", "-o", str(tmp / "x.tsv"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "sim.pod5's run metadata" in proc.stderr and "--kmer-model" in proc.stderr, proc.stderr
