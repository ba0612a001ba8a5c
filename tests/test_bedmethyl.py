"""bedMethyl: modkit's 18 columns, with counts that agree with meth-freq on the same calls."""

import dataclasses
import io
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import ECOLI, REFERENCE, SHARED

from streamer_plugins.outputs.bedmethyl import BedMethyl
from streamer_plugins.cpg.caller import CALLS
from streamer_plugins.cpg.calls import CALLS_HEADER, MethCalls
from streamer_plugins.texts import Texts
from streamer_plugins.outputs.calls_tsv import read_calls
from streamer_plugins.outputs.methfreq import MethFreq
from streamer_plugins.outputs.sinks import MethFreqTable

CALL_FILES = [ECOLI / "meth.f5c-1.1.tsv", SHARED / "expected" / "f5c-1.1" / "meth.tsv"]


def bed_of(lines, source="<calls>") -> BedMethyl:
    """bedMethyl of the rows of a calls TSV, read back as records."""
    bed = BedMethyl()
    for block in read_calls(lines, source):
        bed.add_calls(block.products[CALLS], block.ref_names)
    return bed


def bed_rows(bed: BedMethyl) -> list[list[str]]:
    out = io.StringIO()
    bed.write(out)
    return [line.split("\t") for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("path", CALL_FILES, ids=["fixture", "shared-2kb"])
def test_counts_agree_with_meth_freq(path):
    if not path.is_file():
        pytest.skip(f"{path} not present")
    with open(path) as fh:
        bed = bed_of(fh, path)
    rows = bed_rows(bed)
    assert rows and all(len(r) == 18 for r in rows)
    valid, mod = Counter(), Counter()
    for r in rows:
        chrom, start, end, code, score, strand, s2, e2, colour = r[:9]
        n_valid, pct, n_mod, n_canon, n_other, n_del, n_fail, n_diff, n_nocall = r[9:]
        assert (code, colour, score, s2, e2) == ("m", "255,0,0", n_valid, start, end)
        assert int(end) == int(start) + 1 and strand in "+-"
        assert int(n_valid) == int(n_mod) + int(n_canon) > 0
        assert pct == f"{100 * int(n_mod) / int(n_valid):.2f}"
        assert n_other == n_del == n_diff == n_nocall == "0"
        site = int(start) - (strand == "-")  # the CpG's C on the forward strand
        valid[chrom, site] += int(n_valid)
        mod[chrom, site] += int(n_mod)
    freq = MethFreqTable(table=MethFreq(split_groups=True))
    with open(path) as fh:
        for block in read_calls(fh, path):
            freq.on_batch(block)
    freq = freq.table
    want = {(c, s): (st.called_sites, st.called_sites_methylated) for c, s, e, st in freq.rows()}
    assert {k: (valid[k], mod[k]) for k in valid} == want


def test_strands_fail_and_group_split():
    bed = BedMethyl()
    bed.add("chr1", "+", 100, 3.0, "AAAAACGTTTTCGAAAAA")  # CpGs at 100 and 106
    bed.add("chr1", "-", 100, -2.6, "AAAAACGTTTTCGAAAAA")
    bed.add("chr1", "+", 100, 2.49, "AAAAACGTTTTCGAAAAA")
    got = {(int(r[1]), r[5]): (r[9], r[11], r[12], r[15]) for r in bed_rows(bed)}
    assert got == {
        (100, "+"): ("1", "1", "0", "1"), (106, "+"): ("1", "1", "0", "1"),
        (101, "-"): ("1", "0", "1", "0"), (107, "-"): ("1", "0", "1", "0"),
    }  # fmt: skip
    only_fail = BedMethyl()
    only_fail.add("chr1", "+", 100, 1.0, "AAAAACGAAAAA")
    assert bed_rows(only_fail) == []


def test_calls_records_match_their_tsv():
    calls = MethCalls(
        read=np.array([0, 1]), start=np.array([10, 20]), end=np.array([10, 20]), strand=np.array([1, -1], np.int8),
        llr=np.array([2.504, -7.0]), ll_meth=np.zeros(2), ll_unmeth=np.zeros(2), num_motifs=np.array([1, 1], np.int32),
        sequence=Texts.of(["AAAAACGAAAAA", "AAAAACGAAAAA"]),
    )  # fmt: skip
    from_calls = BedMethyl()
    from_calls.add_calls(calls, ["c1", "c2"])
    from_tsv = bed_of([CALLS_HEADER, "c1\t+\t10\t10\tr\t2.50\t0\t0\t1\t1\tAAAAACGAAAAA\n",
                       "c2\t-\t20\t20\tr\t-7.00\t0\t0\t1\t1\tAAAAACGAAAAA\n"])  # fmt: skip
    assert bed_rows(from_calls) == bed_rows(from_tsv) == [
        ["c1", "10", "11", "m", "1", "+", "10", "11", "255,0,0", "1", "100.00", "1", "0", "0", "0", "0", "0", "0"],
        ["c2", "21", "22", "m", "1", "-", "21", "22", "255,0,0", "1", "0.00", "0", "1", "0", "0", "0", "0", "0"],
    ]


def test_streamer_call_writes_bedmethyl_of_its_calls(tmp_path):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp_path / "reads.fasta"),
                           "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"),
                           "-o", str(tmp_path / "meth.tsv"), "--bedmethyl", str(tmp_path / "meth.bed"), "-t", "2"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "meth.tsv") as fh:
        want = bed_of(fh)
    assert (tmp_path / "meth.bed").read_text().splitlines() == ["\t".join(r) for r in bed_rows(want)]


def test_the_compiled_rows_are_pythons_formatting_of_the_counts_in_any_blocks():
    """Both tables are written by compiled kernels a block of sites at a time: byte for byte the rows Python's
    formatting makes of the same counts (awkward ratios such as 1/16 and 2/3 included), whatever the blocks."""
    rng = np.random.default_rng(7)
    n = 3000
    start = np.sort(rng.choice(40 * n, n, replace=False)).astype(np.int64)
    num = rng.integers(1, 4, n).astype(np.int32)
    calls = MethCalls(read=rng.integers(0, 3, n), start=start, end=start + 7 * (num - 1), strand=np.ones(n, np.int8),
                      llr=np.round(rng.normal(0, 4, n), 2), ll_meth=np.zeros(n), ll_unmeth=np.zeros(n), num_motifs=num,
                      sequence=Texts.of(["ACGTTCG" * int(k) for k in num]))  # fmt: skip
    contigs = ["chrB", "chrA", "chr10"]
    freq, bed = MethFreq(), BedMethyl()
    for _ in range(16):  # up to 16 calls a site, each round's ratios drawn anew: frequencies of n/16, n/3... to round
        again = dataclasses.replace(calls, llr=np.round(rng.normal(0, 4, n), 2))
        freq.add_calls(again, contigs)
        bed.add_calls(again, contigs)
    want = "".join(f"{c}\t{s}\t{e}\t{st.group_size}\t{st.called_sites}\t{st.called_sites_methylated}"
                   f"\t{st.called_sites_methylated / st.called_sites:.3f}\t{st.sequence}\n"
                   for c, s, e, st in freq.rows())  # fmt: skip
    assert freq.format().split("\n", 1)[1] == want
    assert b"".join(bytes(c) for c in freq.chunks(rows_per_chunk=7)) == freq.format().encode()
    want = "".join(f"{c}\t{p}\t{p + 1}\tm\t{k.n_valid}\t{s}\t{p}\t{p + 1}\t255,0,0\t{k.n_valid}"
                   f"\t{100 * k.n_mod / k.n_valid:.2f}\t{k.n_mod}\t{k.n_canonical}\t0\t0\t{k.n_fail}\t0\t0\n"
                   for c, p, s, k in bed.rows())  # fmt: skip
    out = io.StringIO()
    bed.write(out)
    assert out.getvalue() == want and len(want.splitlines()) > 1000
    assert b"".join(bytes(c) for c in bed.chunks(rows_per_chunk=5)) == want.encode()
