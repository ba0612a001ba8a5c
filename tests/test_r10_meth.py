"""R10.4.1 methylation inputs: the methylation simulator keeps the truth per CpG and draws the
signal of methylated k-mers from the CpG model; the daemon finds R10.4.1 models by `pipeline.pore`."""

import numpy as np
import pytest
from conftest import REFERENCE
from r10_sim import cpg_sites, reverse_complement, simulate_methylated, synthetic_cpg_model

from streamer import config
from streamer.commands.run import model_files
from streamer.errors import ConfigError
from streamer.io.reference import Reference
from streamer.poremodel import METHYL_CPG, R10_KMER_MODEL, R10_METH_MODEL, load_default_models

CONTIG = "NC_000913.3"


@pytest.fixture(scope="module")
def models():
    kmer = load_default_models()[0]  # any k works; the shipped 6-mer table keeps the test free of ../shared
    return kmer, synthetic_cpg_model(kmer)


@pytest.fixture(scope="module")
def stretch():
    with Reference(REFERENCE) as ref:
        return ref.fetch(CONTIG, 1_000_000, 1_003_000)


def kmer_means(read):
    """Mean pA of the samples of each k-mer of the read, scale and shift undone."""
    rec = read.record
    pa = (rec.raw.astype(np.float64) + rec.offset) * rec.range / rec.digitisation
    sums = np.bincount(read.sample_kmer, weights=pa)
    return (sums / np.bincount(read.sample_kmer) - read.shift) / read.scale


@pytest.mark.parametrize("rc", [False, True])
def test_methylated_kmers_follow_the_cpg_model(models, stretch, rc):
    kmer, meth = models
    rng = np.random.default_rng(11)
    sim = simulate_methylated(kmer, meth, stretch, rc, 0.5, rng, shift=3.0, scale=1.05)
    k = kmer.k
    assert np.array_equal(sim.sites, cpg_sites(stretch)) and len(sim.sites) > 100
    assert 0.4 < sim.methylated.mean() < 0.6
    assert sim.read.seq == (reverse_complement(stretch) if rc else stretch)
    # where the read's methylated Cs sit: the site's C (forward) or the complement of its G (reverse)
    pos = len(stretch) - 2 - sim.sites if rc else sim.sites
    marked = np.frombuffer(sim.read.seq.encode(), np.uint8).copy()
    marked[pos[sim.methylated]] = ord("M")
    seq = marked.tobytes().decode()
    observed = kmer_means(sim.read)
    rank4 = lambda s: int(s.replace("M", "C").translate(str.maketrans("ACGT", "0123")), 4)  # noqa: E731
    rank5 = lambda s: int(s.translate(str.maketrans(METHYL_CPG, "01234")), 5)  # noqa: E731
    with_m = [i for i in range(len(seq) - k + 1) if "M" in seq[i : i + k]]
    without = [i for i in range(len(seq) - k + 1) if "M" not in seq[i : i + k]]
    c_level = np.array([kmer.level_mean[rank4(seq[i : i + k])] for i in with_m])
    m_level = np.array([meth.level_mean[rank5(seq[i : i + k])] for i in with_m])
    differs = np.abs(m_level - c_level) > 1.0
    # methylated k-mers sit at the CpG model's level, not the C one's; the rest at the nucleotide table's
    closer_to_m = np.abs(observed[with_m] - m_level) < np.abs(observed[with_m] - c_level)
    assert closer_to_m[differs].mean() > 0.8
    plain = np.array([kmer.level_mean[rank4(seq[i : i + k])] for i in without])
    assert np.median(np.abs(observed[without] - plain)) < 1.0


def test_methylation_probability_is_the_truth_rate(models, stretch):
    kmer, meth = models
    rng = np.random.default_rng(5)
    assert not simulate_methylated(kmer, meth, stretch, False, 0.0, rng).methylated.any()
    assert simulate_methylated(kmer, meth, stretch, True, 1.0, rng).methylated.all()


def test_daemon_finds_r10_models_by_pore(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMER_MODEL_DIR", str(tmp_path / "env"))
    r9 = config.PipelineConfig()
    assert r9.pore == "r9" and model_files(r9) == (None, None)
    folder = tmp_path / "models" / "r10"
    folder.mkdir(parents=True)
    (folder / R10_KMER_MODEL).write_bytes(b"")
    r10 = config.PipelineConfig(pore="r10", model_dir=tmp_path / "models")
    with pytest.raises(ConfigError, match=f"pipeline.pore r10: {folder / R10_METH_MODEL}: no R10.4.1 CpG methylation"):
        model_files(r10)
    (folder / R10_METH_MODEL).write_bytes(b"")
    assert model_files(r10) == (folder / R10_KMER_MODEL, folder / R10_METH_MODEL)
    cfg = config.load(None, {"pipeline.pore": "r10", "pipeline.model_dir": str(tmp_path / "models")}, require=())
    assert model_files(cfg.pipeline) == (folder / R10_KMER_MODEL, folder / R10_METH_MODEL)
