"""R10.4.1: the uncalled4 9-mer level table loads and validates; the pore is told from run
metadata; methylation on R10.4.1 data stops with a plain message."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ECOLI, REFERENCE

from streamer.errors import ModelError
from streamer.io.poretype import pore_from_metadata, pore_of_file
from streamer.poremodel import NUCLEOTIDE, _kmer_at_rank, load_model

R10_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "r10" / "dna_r10.4.1_400bps_9mer.npz"
FORMATS = Path(__file__).resolve().parents[2] / "shared" / "data" / "formats"


def write_npz(path, k=2, kmers=None, drop=None):
    n = 4**k
    arrays = {
        "kmer": np.array(kmers if kmers is not None else [_kmer_at_rank(r, k, NUCLEOTIDE) for r in range(n)]),
        "current.mean": np.linspace(-1, 1, n, dtype=np.float32), "current.stdv": np.full(n, 0.1, np.float32),
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


def test_methylation_on_r10_stops_plainly(tmp_path):
    proc = call(tmp_path, ECOLI / "fast5", "--pore", "r10")
    assert proc.returncode == 1
    assert "no public R10.4.1 CpG methylation model exists" in proc.stderr and "Traceback" not in proc.stderr
    pod5 = FORMATS / "pod5_dorado" / "chr1_MAT.pod5"
    if pod5.is_file():  # told from the file's run metadata
        proc = call(tmp_path, pod5)
        assert proc.returncode == 1 and "chr1_MAT.pod5's run metadata" in proc.stderr, proc.stderr
