"""R10.4.1 methylation: the simulator keeps the truth per CpG and draws the signal of methylated
k-mers from the CpG model; the daemon finds R10.4.1 models by the pore; `streamer call` on
simulated R10.4.1 reads, with both 9-mer models found in the model folder, recovers the truth."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REFERENCE
from r10_sim import (
    Placed,
    cpg_sites,
    reverse_complement,
    simulate_methylated,
    synthetic_cpg_model,
    write_run,
    write_text_model,
)

from streamer import config
from streamer.commands.run import model_files
from streamer.errors import ConfigError
from streamer.io.reference import Reference
from streamer.pipeline.chemistry import F5C_RELEASES
from streamer.pipeline.chemistry import R10 as R10_CHEMISTRY
from streamer.pore.model import METHYL_CPG, load_default_models, load_model

R10_KMER_MODEL, R10_METH_MODEL = R10_CHEMISTRY.kmer_model.name, R10_CHEMISTRY.meth_model.name

CONTIG = "NC_000913.3"
R10_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "r10" / "dna_r10.4.1_400bps_9mer.npz"


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


def test_daemon_finds_r10_models_by_pore(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("STREAMER_MODEL_DIR", str(tmp_path / "env"))
    auto = config.PipelineConfig()
    assert auto.pore == "auto" and model_files(auto, None, "") == (None, None, True)  # nothing said: r9's
    assert model_files(auto, "r9", "x") == (None, None, True)
    folder = tmp_path / "models" / "r10"
    folder.mkdir(parents=True)
    r10 = config.PipelineConfig(pore="r10", model_dir=tmp_path / "models")
    with pytest.raises(ConfigError, match=f"pipeline.pore r10: {folder / R10_KMER_MODEL}: no R10.4.1 9-mer"):
        model_files(r10, "r10", "pipeline.pore r10")
    (folder / R10_KMER_MODEL).write_bytes(b"")
    # no CpG model: one line naming it; no calls, the rest goes on
    with caplog.at_level("WARNING"):
        assert model_files(r10, "r10", "pipeline.pore r10") == (folder / R10_KMER_MODEL, None, False)
    assert [r.getMessage() for r in caplog.records] == [
        f"pipeline.pore r10: {folder / R10_METH_MODEL}: no R10.4.1 CpG methylation model: f5c publishes its CpG "
        f"9-mer model {R10_METH_MODEL} with its releases ({F5C_RELEASES}); put it there or pass --meth-model FILE; "
        "no methylation calls, the outputs that need none are written"]
    (folder / R10_METH_MODEL).write_bytes(b"")
    assert model_files(r10, "r10", "") == (folder / R10_KMER_MODEL, folder / R10_METH_MODEL, True)
    cfg = config.load(None, {"pipeline.model_dir": str(tmp_path / "models")}, require=())
    assert model_files(cfg.pipeline, "r10", "") == (folder / R10_KMER_MODEL, folder / R10_METH_MODEL, True)


# --- streamer call on simulated R10.4.1 reads with known methylation -------------------------------

READS = ((150_000, False), (420_000, True), (1_700_000, False), (3_100_000, True))  # starts, reverse strand
READ_LEN = 3000


@pytest.fixture(scope="module")
def r10_meth_run(tmp_path_factory):
    """Four 3 kb reads (two per strand), each CpG methylated with probability 0.5, as an R10.4.1 BLOW5;
    the 9-mer table and the synthetic CpG 9-mer model (5^9 rows, text) in a model folder."""
    if not R10_MODEL.is_file():
        pytest.skip("../shared R10 model not present")
    tmp = tmp_path_factory.mktemp("r10meth")
    kmer = load_model(R10_MODEL)
    meth = synthetic_cpg_model(kmer)
    folder = tmp / "models" / "r10"
    folder.mkdir(parents=True)
    (folder / R10_KMER_MODEL).symlink_to(R10_MODEL)
    write_text_model(meth, folder / R10_METH_MODEL)
    rng = np.random.default_rng(99)
    placed, truth = [], {}
    with Reference(REFERENCE) as ref:
        for start, rc in READS:
            stretch = ref.fetch(CONTIG, start, start + READ_LEN)
            sim = simulate_methylated(kmer, meth, stretch, rc, 0.5, rng, shift=float(rng.normal(0, 5)),
                                      scale=float(rng.uniform(0.95, 1.1)))  # fmt: skip
            placed.append(Placed(sim.read, start, rc, stretch))
            rid = sim.read.record.read_id
            truth.update({(rid, start + int(p)): bool(m) for p, m in zip(sim.sites, sim.methylated)})
        write_run(tmp, placed, CONTIG, ref.length(CONTIG))
    return tmp, truth


def call(tmp, out):
    env = {"STREAMER_MODEL_DIR": str(tmp / "models"), "STREAMER_MODEL_CACHE_DIR": str(tmp / "cache")}
    return subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp / "reads.fasta"), "-b",
                           str(tmp / "reads.bam"), "-g", str(REFERENCE), "--signal", str(tmp / "sim.blow5"), "-t", "2",
                           "--disable-cuda", "-o", str(out)], capture_output=True, text=True,
                          env={**os.environ, **env})  # fmt: skip


def test_r10_calls_recover_the_truth(r10_meth_run):
    """The pore comes from the BLOW5's run metadata, both models from the model folder; the CpG
    model is parsed on the first start and read from the cache after (same calls). Single-CpG calls
    separate methylated from unmethylated sites (f5c 1.6 on 48 such reads: AUC 0.986)."""
    tmp, truth = r10_meth_run
    first = call(tmp, tmp / "meth.tsv")
    assert first.returncode == 0, first.stderr
    assert "parsed once and cached" in first.stderr
    again = call(tmp, tmp / "meth.again.tsv")
    assert again.returncode == 0 and "parsed once" not in again.stderr, again.stderr
    assert (tmp / "meth.tsv").read_text() == (tmp / "meth.again.tsv").read_text()
    with open(tmp / "meth.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert {r["strand"] for r in rows} == {"+", "-"}
    single = [(float(r["log_lik_ratio"]), truth[(r["read_name"], int(r["start"]))]) for r in rows
              if r["num_motifs"] == "1"]  # fmt: skip
    llr = np.array([x for x, _ in single])
    label = np.array([y for _, y in single])
    assert len(single) > 100 and 0.3 < label.mean() < 0.7
    pos, neg = llr[label], llr[~label]
    auc = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert auc > 0.95
    assert ((llr > 0) == label).mean() > 0.85
