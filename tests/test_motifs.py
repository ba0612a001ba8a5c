"""GpC, dam and dcm (`--methylation`): the motifs' sites and k-mers as nanopolish 0.14 writes them, the
fixture's calls byte for byte nanopolish's, meth-freq by nanopolish's script's rule, bedMethyl at the
modified base, the daemon's key, and on the shared reads (with nanopolish installed) the parity of the
issue: the same rows, at least 99.6% of ratios identical and all within 0.01."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ECOLI, REFERENCE, SHARED, needs_shared
from daemon_support import rows
from streamer.pore.model import load_default_models
from streamer.pore.motifs import CPG, DAM, DCM, GPC, MOTIFS, motif
from streamer.pipeline.targets import CPU
from streamer_plugins.cpg.hmm import window_kmer_rank
from streamer_plugins.cpg.hmm_cells import hmm_cells
from streamer_plugins.cpg.sites import motif_sites
from streamer_plugins.outputs.bedmethyl import BedMethyl
from streamer_plugins.outputs.methfreq import MethFreq
from test_daemon_e2e import TIMEOUT, daemons, fixture_copy, replay  # noqa: F401 (fixtures)

OTHERS = ("gpc", "dam", "dcm")

# nanopolish 0.14's recognition tables (src/common/nanopolish_alphabet.cpp): the sites, the sites with
# their modified base as M, and the complement of the latter, which its reverse complement writes backwards
NANOPOLISH_SITES = {
    "cpg": (("CG",), ("MG",), ("GM",)),
    "gpc": (("GC",), ("GM",), ("MG",)),
    "dam": (("GATC",), ("GMTC",), ("CTMG",)),
    "dcm": (("CCAGG", "CCTGG"), ("CMAGG", "CMTGG"), ("GGTMC", "GGAMC")),
}
_PAIR = {"A": "T", "C": "G", "G": "C", "T": "A"}


def nanopolish_methylate(seq: str, name: str) -> str:
    """Left to right, every whole site replaced by its methylated form (nanopolish's `methylate`)."""
    sites, methylated, _ = NANOPOLISH_SITES[name]
    out, i = list(seq), 0
    while i < len(seq):
        hit = next((j for j, s in enumerate(sites) if seq.startswith(s, i)), None)
        if hit is None:
            i += 1
            continue
        out[i : i + len(sites[hit])] = methylated[hit]
        i += len(sites[hit])
    return "".join(out)


def nanopolish_reverse_complement(seq: str, name: str) -> str:
    """A methylated site's complement written backwards, every other base complemented."""
    _, methylated, complement = NANOPOLISH_SITES[name]
    out, i = [], 0
    while i < len(seq):
        hit = next((j for j, s in enumerate(methylated) if seq.startswith(s, i)), None)
        if hit is None:
            out.append(_PAIR[seq[i]])
            i += 1
        else:
            out.extend(complement[hit])
            i += len(complement[hit])
    return "".join(reversed(out))


def rank(kmer: str) -> int:
    return int("".join(str("ACGMT".index(b)) for b in kmer), 5)


def streamer(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamer", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)  # fmt: skip


def calls_by_key(path) -> dict[tuple, dict]:
    with open(path) as fh:
        return {(r["read_name"], r["strand"], int(r["start"])): r for r in csv.DictReader(fh, delimiter="\t")}


# ---------------------------------------------------------------- the motifs as data


def test_registry_names_nanopolish_motifs_and_their_modified_bases():
    assert tuple(MOTIFS) == ("cpg", "gpc", "dam", "dcm") and motif(None) is CPG
    assert [(m.base, m.mod_code, m.compat) for m in (CPG, GPC, DAM, DCM)] == [
        ("C", "m", "f5c"), ("C", "m", "nanopolish"), ("A", "a", "nanopolish"), ("C", "m", "nanopolish")]
    for m in MOTIFS.values():
        sites, methylated, _ = NANOPOLISH_SITES[m.name]
        assert m.sites == sites and all(s.index("M") == m.forward for s in methylated)
    assert DCM.find("TTCCAGGACCTGGCCAGG") == [2, 8, 13] and DAM.find("GATCGATC") == [0, 4]
    assert DCM.table().tobytes() == b"CCAGGCCTGG" and DCM.marks().tolist() == [1, 3]


def ascii_(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), np.uint8)


@pytest.mark.parametrize("name", list(MOTIFS))
def test_kmer_ranks_are_nanopolish_methylated_strands(name):
    """Every k-mer of windows dense with sites (some cut by the window's ends), both strands, both hypotheses."""
    m = MOTIFS[name]
    rng = np.random.default_rng(len(name))
    k = 6
    for _ in range(20):
        parts = [rng.choice(list(m.sites)) if rng.random() < 0.5 else "".join(rng.choice(list("ACGT"), 3))
                 for _ in range(12)]  # fmt: skip
        text = "".join(parts)
        window = text[rng.integers(0, 3) : len(text) - rng.integers(0, 3)]
        seq = ascii_(window)
        n = len(window)
        for methylated in (False, True):
            fwd = nanopolish_methylate(window, name) if methylated else window
            rev = nanopolish_reverse_complement(fwd, name)
            for ki in range(n - k + 1):
                got = [window_kmer_rank(seq, 0, n, ki, k, rc, methylated, m.table(), m.marks()) for rc in (False, True)]
                assert got == [rank(fwd[ki : ki + k]), rank(rev[n - ki - k : n - ki])]
            for rc in (False, True):  # all k-mers at once, each from the one before (the CPU's lanes)
                ranks = np.zeros(2 * (n - k + 1), np.int64)
                hmm_cells(CPU).window_ranks(seq, 0, n, k, rc, methylated, m.table(), m.marks(), ranks, 1, 2)
                want = [window_kmer_rank(seq, 0, n, ki, k, rc, methylated, m.table(), m.marks()) for ki in range(n - k + 1)]
                assert ranks[1::2].tolist() == want


def test_sites_count_the_base_after_the_aligned_span():
    """nanopolish and f5c fetch the reference to the alignment's end inclusive: a site may end there."""
    assert motif_sites(ascii_("TTGATCAAGA"), ord("T"), DAM.table()).tolist() == [2]
    assert motif_sites(ascii_("TTGATCAAGAT"), ord("C"), DAM.table()).tolist() == [2, 8]
    assert motif_sites(ascii_("TTGATCAAGAT"), 0, DAM.table()).tolist() == [2]


def test_models_load_as_methylation_models_of_their_motif():
    for name in OTHERS:
        path = ECOLI.parents[2] / "streamer" / "data" / "models" / f"r9.4_450bps.{name}.6mer.template.model"
        kmer, meth = load_default_models(None, path)
        assert meth.alphabet == "ACGMT" and meth.k == kmer.k == 6 and meth.n_kmers == 5**6


# ---------------------------------------------------------------- calls and the tables made of them


@pytest.mark.parametrize("name", OTHERS)
def test_fixture_calls_are_nanopolish_byte_for_byte(name, tmp_path):
    """`streamer call -q` on the fixture writes nanopolish 0.14's `call-methylation -q` TSV, byte for byte."""
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    out = tmp_path / "meth.tsv"
    proc = streamer("call", "-r", tmp_path / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE, "--signal",
                    ECOLI / "fast5", "-q", name, "-t", "2", "-o", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == (ECOLI / f"meth.{name}.nanopolish-0.14.tsv").read_text()
    freq = streamer("meth-freq", "--compat", "nanopolish", "-q", name, out)
    assert freq.returncode == 0 and freq.stdout == (ECOLI / f"freq.{name}.nanopolish-0.14.tsv").read_text()


def test_meth_freq_splits_groups_at_the_motifs_sites():
    freq = MethFreq(call_threshold=2.5, split_groups=True, motif=DCM)
    freq.add("c", 100, 118, 6.0, 3, "AACCAGGTTCCTGGAACCAGGTTTT")  # sites 2, 9, 16 of the sequence
    freq.add("c", 100, 118, 1.0, 3, "AACCAGGTTCCTGGAACCAGGTTTT")  # below the threshold
    assert [(s, e, st.called_sites, st.called_sites_methylated) for _, s, e, st in freq.rows()] == [
        (100, 100, 1, 1), (107, 107, 1, 1), (114, 114, 1, 1)]
    per_site = MethFreq(call_threshold=2.0, per_motif=True)  # nanopolish's script: 2.0 per site of the group
    per_site.add("c", 10, 20, -5.9, 3, "ACGTTCGTTTCG")
    per_site.add("c", 30, 30, -2.0, 1, "ACGTT")
    assert [(s, st.called_sites) for _, s, _, st in per_site.rows()] == [(30, 1)]


def test_bedmethyl_counts_the_modified_base_of_each_strand():
    bed = BedMethyl(motif=DAM)
    bed.add("c", "+", 100, 3.0, "TTTTTGATCAAAAGATCTT")  # sites at 100 and 108: their A at +1
    bed.add("c", "-", 100, -3.0, "TTTTTGATCAAAAGATCTT")  # the reverse strand's A pairs with the T at +2
    out = io.StringIO()
    bed.write(out)
    got = [line.split("\t")[:6] + line.split("\t")[11:13] for line in out.getvalue().splitlines()]
    assert got == [["c", "101", "102", "a", "1", "+", "1", "0"], ["c", "102", "103", "a", "1", "-", "0", "1"],
                   ["c", "109", "110", "a", "1", "+", "1", "0"], ["c", "110", "111", "a", "1", "-", "0", "1"]]


def test_modbam_and_a_motif_without_a_model_are_one_line(tmp_path):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    base = ("call", "-r", tmp_path / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE, "--signal",
            ECOLI / "fast5", "-q", "dam")  # fmt: skip
    proc = streamer(*base, "--modbam", tmp_path / "out.bam")
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "streamer call: --modbam carries CpG calls (C+m) only: leave it out with --methylation dam"]
    proc = streamer(*base, "--pore", "r10", "--kmer-model", ECOLI.parents[2] / "streamer" / "data" / "models" /
                    "r9.4_450bps.nucleotide.6mer.template.model")  # fmt: skip
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        "streamer call: R10.4.1 reads: streamer has no dam (G6mATC) methylation model for them; pass --meth-model "
        "FILE"]


def test_daemon_calls_the_configured_motif(fixture_copy, daemons, tmp_path):  # noqa: F811
    """`pipeline.methylation: dam` on a replayed run: the rows of `streamer call -q dam` (nanopolish's)."""
    live, out = tmp_path / "live", tmp_path / "out"
    live.mkdir()
    d = daemons(tmp_path, live, out, "--methylation", "dam")
    rep = replay(fixture_copy, live, "--interval", "0.3", "--batch-size", "3")
    assert rep.wait(TIMEOUT) == 0
    assert d.wait() == 0, d.output()
    assert rows(out / "meth.tsv") == rows(ECOLI / "meth.dam.nanopolish-0.14.tsv")
    assert {line.split("\t")[3] for line in (out / "meth.bed").read_text().splitlines()} == {"a"}
    bad = streamer("run", "--watch", live, "-g", REFERENCE, "-o", tmp_path / "o2", "--methylation", "gpc",
                   "--modbam")  # fmt: skip
    assert bad.returncode == 78 and "output.modbam: modBAM carries CpG calls (C+m) only" in bad.stderr


# ---------------------------------------------------------------- the shared reads against nanopolish


@needs_shared
@pytest.mark.skipif(shutil.which("nanopolish") is None, reason="nanopolish not installed")
def test_shared_reads_match_nanopolish_call_methylation(tmp_path):
    """Issue 28's parity: nanopolish 0.14 `call-methylation -q` run here on the 112 shared reads."""
    work = tmp_path / "np"
    shutil.copytree(SHARED / "fast5_files", work / "fast5_files")
    shutil.copy(SHARED / "reads.fasta", work / "reads.fasta")
    genome = work / "ref.fa"
    genome.write_bytes(subprocess.run(["gzip", "-dc", REFERENCE], capture_output=True, check=True).stdout)
    subprocess.run(["nanopolish", "index", "-d", "fast5_files", "reads.fasta"], cwd=work, check=True,
                   capture_output=True)  # fmt: skip
    bam = SHARED / "reads.mg1655.sorted.bam"
    for name in OTHERS:
        theirs = work / f"{name}.nanopolish.tsv"
        with open(theirs, "w") as fh:
            subprocess.run(["nanopolish", "call-methylation", "-q", name, "-r", "reads.fasta", "-b", bam, "-g",
                            genome], cwd=work, check=True, stdout=fh, stderr=subprocess.DEVNULL)  # fmt: skip
        ours = tmp_path / f"{name}.tsv"
        proc = streamer("call", "-r", work / "reads.fasta", "-b", bam, "-g", genome, "--signal", work / "fast5_files",
                        "-q", name, "-t", "2", "-o", ours)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        a, b = calls_by_key(ours), calls_by_key(theirs)
        assert set(a) == set(b) and len(a) > 1000
        same = np.mean([a[key]["log_lik_ratio"] == b[key]["log_lik_ratio"] for key in a])
        diff = max(abs(float(a[key]["log_lik_ratio"]) - float(b[key]["log_lik_ratio"])) for key in a)
        assert same >= 0.996 and diff <= 0.01 + 1e-9, (name, same, diff)
        assert all(a[key]["sequence"] == b[key]["sequence"] and a[key]["num_motifs"] == b[key]["num_motifs"]
                   for key in a)  # fmt: skip


@needs_shared
def test_meth_freq_compat_nanopolish_is_its_script():
    """The shared reads' CpG calls by nanopolish 0.14 counted as calculate_methylation_frequency.py does."""
    proc = streamer("meth-freq", "--compat", "nanopolish", SHARED / "expected" / "nanopolish-0.14" / "meth.tsv")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (SHARED / "expected" / "nanopolish-0.14" / "freq.tsv").read_text()
