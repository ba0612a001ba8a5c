"""`streamer compare-meth`: streamer's own CpG frequencies against a bedMethyl, per CpG.

On the fixture's reads `streamer call --bedmethyl` and `meth-freq` count the same calls two ways
(bedMethyl per strand, meth-freq per group): the comparison must find every site and no
difference. A modBAM of the same calls aggregated by `streamer pileup` (dorado's path) is
checked against a plain dict join written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ECOLI, REFERENCE
from streamer.cli import EXIT_FAILED, main


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("call")
    subprocess.run(streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5", "-o", d / "meth.tsv", "--bedmethyl", d / "meth.bed",
                            "--modbam", d / "mod.bam"), check=True, capture_output=True, timeout=300)  # fmt: skip
    with open(d / "freq.tsv", "w") as fh:
        subprocess.run(streamer("meth-freq", d / "meth.tsv"), check=True, stdout=fh, timeout=120)
    subprocess.run(streamer("pileup", d / "mod.bam", "--cpg", "--ref", REFERENCE, "--no-filtering", "-o",
                            d / "pileup.bed"), check=True, capture_output=True, timeout=120)  # fmt: skip
    return d


def compare_json(capsys, hmm: Path, bed: Path, *flags) -> dict:
    assert main(["compare-meth", "--hmm", str(hmm), "--dorado", str(bed), "--json", *map(str, flags)]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_same_calls_counted_two_ways_agree_at_every_site(outputs, capsys):
    r = compare_json(capsys, outputs / "freq.tsv", outputs / "meth.bed", "--min-coverage", 1)
    assert r["hmm_sites"] == r["dorado_sites"] == r["sites_in_both"] > 1000
    assert r["pearson"] == pytest.approx(1.0) and r["spearman"] == pytest.approx(1.0)
    assert r["mean_abs_diff"] == 0 and r["mean_diff"] == 0


def _plain_join(freq: Path, bed: Path, min_coverage: int) -> dict:
    """(contig, + strand C) -> (HMM called, methylated, bed valid, modified), written the simple way."""
    hmm = {}
    for line in freq.read_text().splitlines()[1:]:
        chrom, start, _, _, called, meth, _, seq = line.split("\t")
        first = seq.index("CG")
        for i in range(len(seq) - 1):
            if seq[i:i + 2] == "CG":
                hmm[chrom, int(start) + i - first] = (int(called), int(meth))
    dorado: dict = {}
    for line in bed.read_text().splitlines():
        f = line.split("\t")
        if f[3] != "m":
            continue
        key = (f[0], int(f[1]) - (f[5] == "-"))
        valid, nmod = dorado.get(key, (0, 0))
        dorado[key] = (valid + int(f[9]), nmod + int(f[11]))
    return {k: (*hmm[k], *dorado[k]) for k in hmm.keys() & dorado.keys()
            if hmm[k][0] >= min_coverage and dorado[k][0] >= min_coverage}


def test_the_modbam_pileup_against_a_plain_join(outputs, capsys, tmp_path):
    r = compare_json(capsys, outputs / "freq.tsv", outputs / "pileup.bed", "--min-coverage", 2, "-o",
                     tmp_path / "sites.tsv")
    want = _plain_join(outputs / "freq.tsv", outputs / "pileup.bed", 2)
    assert r["sites_in_both"] == len(want) > 200
    diffs = [h_m / h_c - d_m / d_c for h_c, h_m, d_c, d_m in want.values()]
    assert r["mean_diff"] == pytest.approx(sum(diffs) / len(diffs))
    assert r["mean_abs_diff"] == pytest.approx(sum(map(abs, diffs)) / len(diffs))
    assert 0.5 < r["pearson"] < 1.0  # the modBAM's probabilities are the calls' LLRs, quantised to 1/256
    rows = (tmp_path / "sites.tsv").read_text().splitlines()[1:]
    got = {(f[0], int(f[1])): tuple(map(int, (f[2], f[3], f[5], f[6]))) for f in (row.split("\t") for row in rows)}
    assert got == want


def test_known_differences(tmp_path, capsys):
    freq = tmp_path / "freq.tsv"
    freq.write_text("chromosome\tstart\tend\tnum_motifs_in_group\tcalled_sites\tcalled_sites_methylated\t"
                    "methylated_frequency\tgroup_sequence\n"
                    "chr1\t10\t10\t1\t10\t5\t0.500\tAAAAACGAAAA\n"
                    "chr1\t20\t23\t2\t10\t10\t1.000\tAAAAACGACGAAAA\n")  # two CpGs: 20 and 23
    bed = tmp_path / "x.bed"
    row = "chr1\t{}\t{}\tm\t10\t{}\t{}\t{}\t255,0,0\t10\t{:.2f}\t{}\t{}\t0\t0\t0\t0\t0\n"
    bed.write_text("".join(row.format(p, p + 1, s, p, p + 1, 100 * m / 10, m, 10 - m)
                           for p, s, m in ((10, "+", 2), (11, "-", 2), (20, "+", 9), (24, "-", 9), (30, "+", 1))))
    r = compare_json(capsys, freq, bed, "--min-coverage", 5)
    # site 10: 0.5 against 4/20; 20: 1.0 against 0.9; 23: 1.0 against 0.9 (its - strand C at 24)
    assert (r["hmm_sites"], r["dorado_sites"], r["sites_in_both"]) == (3, 4, 3)
    assert r["mean_diff"] == pytest.approx((0.3 + 0.1 + 0.1) / 3)
    assert r["weighted_mean_abs_diff"] == pytest.approx((0.3 * 10 + 0.1 * 10 + 0.1 * 10) / 30)


def test_a_malformed_row_is_one_line_naming_file_and_line(tmp_path, capsys):
    freq = tmp_path / "freq.tsv"
    freq.write_text("chromosome\tstart\tend\tnum_motifs_in_group\tcalled_sites\tcalled_sites_methylated\t"
                    "methylated_frequency\tgroup_sequence\nchr1\tten\t10\t1\t10\t5\t0.5\tACGTA\n")
    bed = tmp_path / "x.bed"
    bed.write_text("")
    assert main(["compare-meth", "--hmm", str(freq), "--dorado", str(bed)]) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"streamer compare-meth: {freq}:2: expected 8 tab-separated columns with whole numbers in 2-6"]
