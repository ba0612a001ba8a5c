"""`streamer compare-meth`: streamer's own CpG frequencies against a bedMethyl, per meth-freq row.

On the fixture's reads `streamer call --bedmethyl` and `meth-freq` count the same calls two ways
(bedMethyl per CpG and strand, meth-freq per group or, with -s, per CpG): the comparison must
find every row and no difference. A modBAM of the same calls aggregated by `streamer pileup`
(dorado's path) is checked against a plain computation written here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ECOLI, REFERENCE
from streamer.cli import EXIT_FAILED, main

STATS = ("pearson", "spearman", "mean_abs_diff", "mean_diff",
         "weighted_pearson", "weighted_spearman", "weighted_mean_abs_diff", "weighted_mean_diff")
FREQ_HEADER = ("chromosome\tstart\tend\tnum_motifs_in_group\tcalled_sites\tcalled_sites_methylated\t"
               "methylated_frequency\tgroup_sequence\n")


def streamer(*args) -> list[str]:
    return [sys.executable, "-m", "streamer", *map(str, args)]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("call")
    subprocess.run(streamer("call", "-r", ECOLI / "reads.fasta", "-b", ECOLI / "reads.bam", "-g", REFERENCE,
                            "--signal", ECOLI / "fast5", "-o", d / "meth.tsv", "--bedmethyl", d / "meth.bed",
                            "--modbam", d / "mod.bam", "-t", 2), check=True, capture_output=True, timeout=300)  # fmt: skip
    for name, flags in (("freq.tsv", ()), ("freq-split.tsv", ("-s",))):
        subprocess.run(streamer("meth-freq", d / "meth.tsv", *flags, "-o", d / name), check=True, timeout=120)
    for name, flags in (("pileup.bed", ()), ("combined.bed", ("--combine-strands", "--mixed-delim", "--header"))):
        subprocess.run(streamer("pileup", d / "mod.bam", "--cpg", "--ref", REFERENCE, "--no-filtering", *flags,
                                "-o", d / name), check=True, capture_output=True, timeout=120)  # fmt: skip
    return d


def compare_json(capsys, hmm: Path, bed: Path, *flags) -> dict:
    assert main(["compare-meth", "--hmm", str(hmm), "--dorado", str(bed), "--json", *map(str, flags)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("table", ["freq.tsv", "freq-split.tsv"])
def test_the_same_calls_counted_two_ways_agree_at_every_row(outputs, capsys, table):
    r = compare_json(capsys, outputs / table, outputs / "meth.bed", "--min-coverage", 1)
    split = compare_json(capsys, outputs / "freq-split.tsv", outputs / "meth.bed", "--min-coverage", 1)
    assert r["hmm_sites"] == r["sites_in_both"] == r["sites_compared"] > 400
    assert r["hmm_cpgs"] == r["dorado_sites"] == split["hmm_sites"] > r["hmm_sites"] * (table == "freq.tsv")
    for key in ("pearson", "spearman", "weighted_pearson", "weighted_spearman"):
        assert r[key] == pytest.approx(1.0)
    for key in ("mean_abs_diff", "mean_diff", "weighted_mean_abs_diff", "weighted_mean_diff"):
        assert r[key] == 0


def _freq_rows(path: Path) -> list[tuple]:
    rows = []
    for line in path.read_text().splitlines()[1:]:
        chrom, start, end, n, called, meth, _, _ = line.split("\t")
        rows.append((chrom, int(start), int(end), int(n), int(called), int(meth)))
    return rows


def _bed_sites(path: Path, code: str = "m") -> dict:
    sites: dict = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if f[0] == "chrom" or f[3] != code:
            continue
        key = (f[0], int(f[1]) - (f[5] == "-"))
        valid, nmod = sites.get(key, (0, 0))
        sites[key] = (valid + int(f[9]), nmod + int(f[11]))
    return sites


def _plain_join(freq: Path, bed: Path, min_coverage: int) -> list[tuple]:
    """Rows both sides cover: (row, dorado CpGs, valid, modified), dorado summed over the row's CpGs."""
    sites = _bed_sites(bed)
    out = []
    for row in _freq_rows(freq):
        chrom, start, end, n, called, _ = row
        hits = [sites[chrom, p] for p in range(start, end + 1) if (chrom, p) in sites]
        valid, nmod = sum(h[0] for h in hits), sum(h[1] for h in hits)
        if called and valid and called / n >= min_coverage and valid / n >= min_coverage:
            out.append((row, len(hits), valid, nmod))
    return out


def _pearson(a, b, w=None):
    w = w or [1.0] * len(a)
    total = sum(w)
    ma, mb = sum(x * y for x, y in zip(a, w)) / total, sum(x * y for x, y in zip(b, w)) / total
    cov = sum(wi * (x - ma) * (y - mb) for x, y, wi in zip(a, b, w))
    return cov / math.sqrt(sum(wi * (x - ma) ** 2 for x, wi in zip(a, w)) * sum(wi * (y - mb) ** 2 for y, wi in zip(b, w)))


def _ranks(x):
    ordered = sorted(x)
    return [ordered.index(v) + (ordered.count(v) - 1) / 2 for v in x]


def _plain_stats(joined) -> dict:
    fh = [row[5] / row[4] for row, *_ in joined]
    fd = [nmod / valid for _, _, valid, nmod in joined]
    w = [min(row[4] / row[3], valid / row[3]) for row, _, valid, _ in joined]
    d = [a - b for a, b in zip(fh, fd)]
    return {"pearson": _pearson(fh, fd), "spearman": _pearson(_ranks(fh), _ranks(fd)),
            "mean_abs_diff": sum(map(abs, d)) / len(d), "mean_diff": sum(d) / len(d),
            "weighted_pearson": _pearson(fh, fd, w), "weighted_spearman": _pearson(_ranks(fh), _ranks(fd), w),
            "weighted_mean_abs_diff": sum(abs(x) * y for x, y in zip(d, w)) / sum(w),
            "weighted_mean_diff": sum(x * y for x, y in zip(d, w)) / sum(w)}


@pytest.mark.parametrize("table, min_coverage", [("freq.tsv", 1), ("freq-split.tsv", 1), ("freq-split.tsv", 2)])
def test_the_modbam_pileup_against_a_plain_computation(outputs, capsys, tmp_path, table, min_coverage):
    r = compare_json(capsys, outputs / table, outputs / "pileup.bed", "--min-coverage", min_coverage,
                     "-o", tmp_path / "sites.tsv")
    want = _plain_join(outputs / table, outputs / "pileup.bed", min_coverage)
    assert r["sites_compared"] == len(want) > 100
    assert r["dorado_sites"] == sum(v[0] > 0 for v in _bed_sites(outputs / "pileup.bed").values())
    for key, value in _plain_stats(want).items():
        assert r[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert 0.5 < r["pearson"] < 1.0  # the modBAM's probabilities are the calls' LLRs, quantised to 1/256
    lines = (tmp_path / "sites.tsv").read_text().splitlines()
    assert lines[0].split("\t")[:3] == ["chromosome", "start", "end"]
    got = [(f[0], *map(int, f[1:6]), *map(int, f[8:11])) for f in (line.split("\t") for line in lines[1:])]
    assert got == [(*row[:5], row[5], cpgs, valid, nmod) for row, cpgs, valid, nmod in want]


def test_combined_strands_and_mixed_delimiters_give_the_same_comparison(outputs, capsys):
    per_strand = compare_json(capsys, outputs / "freq.tsv", outputs / "pileup.bed", "--min-coverage", 1)
    combined = compare_json(capsys, outputs / "freq.tsv", outputs / "combined.bed", "--min-coverage", 1)
    assert (outputs / "combined.bed").read_text().startswith("chrom\t")
    assert combined == per_strand


def _bed_row(chrom: str, pos: int, strand: str, valid: int, nmod: int, code: str = "m") -> str:
    return (f"{chrom}\t{pos}\t{pos + 1}\t{code}\t{valid}\t{strand}\t{pos}\t{pos + 1}\t255,0,0\t{valid}\t"
            f"{100 * nmod / valid:.2f}\t{nmod}\t{valid - nmod}\t0\t0\t0\t0\t0\n")


def _hand_made(tmp_path: Path, shift: int) -> tuple[Path, Path]:
    """Dorado: 10 reads per CpG, split between strands; the HMM's methylated counts `shift` above."""
    freq, bed = tmp_path / f"freq{shift}.tsv", tmp_path / "x.bed"
    rows, beds = [], []
    for i, (pos, nmod) in enumerate([(10, 2), (30, 5), (50, 7), (70, 3)]):
        chrom = f"chr{1 + i % 2}"
        rows.append(f"{chrom}\t{pos}\t{pos}\t1\t10\t{nmod + shift}\t0\tAAAAACGAAAA\n")
        beds += [_bed_row(chrom, pos, "+", 6, nmod // 2), _bed_row(chrom, pos + 1, "-", 4, nmod - nmod // 2),
                 _bed_row(chrom, pos, "+", 6, 6, "h")]
    # a group of two CpGs (90 and 93), 10 reads: 20 calls; dorado 5 of 10 and 7 of 10 at its CpGs
    rows.append(f"chr1\t90\t93\t2\t20\t{12 + 2 * shift}\t0\tAAAAACGACGAAAAA\n")
    beds += [_bed_row("chr1", 90, "+", 10, 5), _bed_row("chr1", 94, "-", 10, 7)]
    # 3 reads only: in both, not compared at the default --min-coverage 5; dorado's 120 in no row
    rows.append("chr1\t110\t110\t1\t3\t3\t1\tAAAAACGAAAA\n")
    beds += [_bed_row("chr1", 110, "+", 3, 0), _bed_row("chr1", 120, "+", 9, 1)]
    freq.write_text(FREQ_HEADER + "".join(sorted(rows)))
    bed.write_text("".join(sorted(beds)))
    return freq, bed


def test_identical_frequencies(tmp_path, capsys):
    r = compare_json(capsys, *_hand_made(tmp_path, 0))
    assert (r["hmm_sites"], r["hmm_cpgs"], r["dorado_sites"], r["sites_in_both"], r["sites_compared"]) == (6, 7, 8, 6, 5)
    assert r["pearson"] == r["spearman"] == r["weighted_pearson"] == r["weighted_spearman"] == pytest.approx(1.0)
    assert r["mean_abs_diff"] == r["mean_diff"] == r["weighted_mean_abs_diff"] == r["weighted_mean_diff"] == 0


def test_a_shifted_table(tmp_path, capsys):
    r = compare_json(capsys, *_hand_made(tmp_path, 1))
    # +1 of 10 calls at each CpG, +2 of 20 in the group
    for key in ("pearson", "spearman", "weighted_pearson", "weighted_spearman"):
        assert r[key] == pytest.approx(1.0)
    for key in ("mean_abs_diff", "mean_diff", "weighted_mean_abs_diff", "weighted_mean_diff"):
        assert r[key] == pytest.approx(0.1)
    r = compare_json(capsys, *_hand_made(tmp_path, 1), "--min-coverage", 3, "--mod-code", "h")
    # h: 6 of 6 on the + strand only; the HMM row at 110 has 3 reads, dorado none there
    assert (r["dorado_sites"], r["sites_in_both"], r["sites_compared"]) == (4, 4, 4)
    assert r["mean_diff"] == pytest.approx(sum(m / 10 - 1 for m in (3, 6, 8, 4)) / 4)


def test_text_summary_and_per_row_table(tmp_path, capsys):
    freq, bed = _hand_made(tmp_path, 1)
    out = tmp_path / "rows.tsv"
    assert main(["compare-meth", "--hmm", str(freq), "--dorado", str(bed), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "6 rows in both, 5 with >= 5 reads per CpG" in text and "mean 0.1000" in text
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(rows) == 6 and rows[1][:4] == ["chr1", "10", "10", "1"]
    group = next(r for r in rows if r[1] == "90")
    assert group[4:] == ["20", "14", "0.7000", "10.0000", "2", "20", "12", "0.6000", "10.0000"]


def test_nanopolish_column_name_and_column_order(tmp_path, capsys):
    freq, bed = _hand_made(tmp_path, 0)
    want = compare_json(capsys, freq, bed)
    lines = freq.read_text().replace("num_motifs_in_group", "num_cpgs_in_group").splitlines()
    moved = tmp_path / "moved.tsv"  # group_sequence first: columns are found by name
    moved.write_text("".join("\t".join([f[-1], *f[:-1]]) + "\n" for f in (line.split("\t") for line in lines)))
    assert compare_json(capsys, moved, bed) == want


@pytest.mark.parametrize("which, text, message", [
    ("hmm", FREQ_HEADER + "chr1\tten\t10\t1\t10\t5\t0.5\tACGTA\n", "2: start is not a whole number: 'ten'"),
    ("hmm", FREQ_HEADER.replace("called_sites\t", "") + "chr1\t10\t10\t1\t5\t0.5\tACGTA\n",
     "1: not a methylation frequency TSV: no column called_sites"),
    ("hmm", FREQ_HEADER + "chr1\t10\t10\t1\t10\t5\t0.5\n", "2: expected 8 columns, found 7"),
    ("hmm", FREQ_HEADER + "chr1\t10\t10\t1\t10\t12\t1.2\tACGTA\n", "2: inconsistent row"),
    ("dorado", "chrom\tstart\n" + _bed_row("c", 5, "+", 4, 1) + _bed_row("c", 6, "-", 4, 1).replace("\t4\t", "\tx\t", 2),
     "3: Nvalid_cov is not a whole number: 'x'"),
    ("dorado", _bed_row("c", 5, "+", 4, 1) + _bed_row("c", 9, "+", 4, 1)[:-3] + "\n", "2: expected 18 columns, found 17"),
    ("dorado", _bed_row("c", 5, "*", 4, 1), "1: strand is not +, - or .: '*'"),
], ids=["number", "column", "width", "counts", "bed-number", "bed-width", "strand"])  # fmt: skip
def test_bad_input_is_one_line_naming_file_and_line(tmp_path, capsys, which, text, message):
    files = {"hmm": tmp_path / "freq.tsv", "dorado": tmp_path / "x.bed"}
    files["hmm"].write_text(FREQ_HEADER)
    files["dorado"].write_text("")
    files[which].write_text(text)
    out = tmp_path / "rows.tsv"
    argv = ["compare-meth", "--hmm", str(files["hmm"]), "--dorado", str(files["dorado"]), "-o", str(out)]
    assert main(argv) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"streamer compare-meth: {files[which]}:{message}")
    assert not out.exists()
