"""modBAM: MM/ML tags that pysam reads back as the probabilities written, within 1/256."""

import array
import csv
import math
import shutil
import subprocess
import sys

import pysam
import pytest
from conftest import ECOLI, REFERENCE, SHARED

from streamer.io.alignments import AlignmentFilter
from streamer_plugins.outputs.modbam import ModCalls, mod_tags, probability_code, write_modbam


def tsv_calls(path) -> ModCalls:
    calls = ModCalls()
    with open(path) as fh:
        for r in csv.DictReader(fh, delimiter="\t"):
            calls.add(r["read_name"], r["chromosome"], r["strand"] == "-", int(r["start"]),
                      float(r["log_lik_ratio"]), r["sequence"])  # fmt: skip
    return calls


def expected_sites(rec: pysam.AlignedSegment, calls: ModCalls) -> dict[int, float]:
    """SEQ position -> probability of every called CpG C the read carries."""
    qpos = {r: q for q, r in rec.get_aligned_pairs(matches_only=True)}
    want = "G" if rec.is_reverse else "C"
    out = {}
    for ref_pos, llr in calls.by_record.get((rec.query_name, rec.reference_name, rec.is_reverse), ()):
        q = qpos.get(ref_pos + rec.is_reverse)
        if q is not None and rec.query_sequence[q] == want:
            out[q] = 1 / (1 + math.exp(-llr))
    return out


def check_round_trip(out_bam, calls: ModCalls) -> int:
    n_sites = 0
    with pysam.AlignmentFile(str(out_bam)) as fh:
        for rec in fh:
            want = expected_sites(rec, calls)
            got = rec.modified_bases or {}
            if not want:
                assert not rec.has_tag("MM")
                continue
            assert rec.get_tag("MM").startswith("C+m?,") and rec.get_tag("MN") == len(rec.query_sequence)
            sites = dict(got[("C", int(rec.is_reverse), "m")])
            assert set(sites) == set(want)
            for q, p in want.items():
                assert abs((sites[q] + 0.5) / 256 - p) <= 1 / 256
            n_sites += len(want)
    return n_sites


@pytest.mark.parametrize("bam, tsv", [
    (ECOLI / "reads.bam", ECOLI / "meth.f5c-1.1.tsv"),
    (SHARED / "reads.mg1655.sorted.bam", SHARED / "expected" / "f5c-1.1" / "meth.tsv"),
], ids=["fixture", "shared-2kb"])  # fmt: skip
def test_round_trip(tmp_path, bam, tsv):
    if not bam.is_file():
        pytest.skip(f"{bam} not present")
    calls = tsv_calls(tsv)
    out = tmp_path / "mod.bam"
    write_modbam(bam, out, calls, AlignmentFilter())
    assert check_round_trip(out, calls) > 1000
    with pysam.AlignmentFile(str(bam)) as a, pysam.AlignmentFile(str(out)) as b:
        assert b.header.to_dict()["PG"][-1]["ID"] == "streamer"
        for x, y in zip(a, b, strict=True):  # same records, same order, other tags intact
            assert (x.query_name, x.flag, x.reference_start, x.cigarstring, x.query_sequence) == (
                y.query_name, y.flag, y.reference_start, y.cigarstring, y.query_sequence)  # fmt: skip
            assert {t: v for t, v in y.get_tags() if t not in ("MM", "ML", "MN")} == dict(x.get_tags())
    assert (tmp_path / "mod.bam.bai").is_file()


def test_probability_codes():
    assert [probability_code(x) for x in (-1000.0, -2.5, 0.0, 2.5, 1000.0)] == [0, 19, 128, 236, 255]


def _record(seq: str, reverse: bool, tags) -> pysam.AlignedSegment:
    header = pysam.AlignmentHeader.from_dict({"SQ": [{"SN": "c", "LN": 1000}]})
    rec = pysam.AlignedSegment(header)
    rec.query_name, rec.query_sequence, rec.flag = "r", seq, 16 if reverse else 0
    rec.reference_id, rec.reference_start, rec.cigarstring, rec.mapping_quality = 0, 100, f"{len(seq)}M", 60
    for tag, value in tags:
        rec.set_tag(tag, value)
    return rec


@pytest.mark.parametrize("reverse", [False, True])
def test_deltas_count_cs_of_the_read_as_sequenced(reverse):
    rec = _record("ACGTTCGGACGA", reverse, [])  # reference 100..111: CpGs at 101, 105, 109
    mm, ml = mod_tags(rec, [(105, 3.0), (109, -3.0)])
    # forward: Cs at 1, 5, 9, the 2nd and 3rd called; reverse: read as sequenced TCGTCCGAACGT,
    # Cs at 1, 4, 5, 10, the CpGs' Cs (SEQ 10 and 6) are read positions 1 and 5: the 1st and 3rd
    assert (mm, ml) == (("C+m?,0,1", [12, 243]) if reverse else ("C+m?,1,0", [243, 12]))
    rec.set_tag("MM", mm + ";")
    rec.set_tag("ML", array.array("B", ml))
    want = {6: 243, 10: 12} if reverse else {5: 243, 9: 12}
    assert dict(rec.modified_bases[("C", int(reverse), "m")]) == want


def test_existing_tags_replaced_consistently(tmp_path):
    header = {"HD": {"VN": "1.6", "SO": "unsorted"}, "SQ": [{"SN": "c", "LN": 1000}]}
    seq = "AACGTTCGAA"  # CpGs at reference 102, 106
    tags = [("MM", "A+a?,0;C+m?,0,0;"), ("ML", array.array("B", [7, 50, 60])), ("mv", array.array("b", [5, 1, 0]))]
    src = tmp_path / "in.bam"
    with pysam.AlignmentFile(str(src), "wb", header=header) as fh:
        for name in ("called", "uncalled"):
            rec = _record(seq, False, tags)
            rec.query_name = name
            fh.write(rec)
    calls = ModCalls()
    calls.add("called", "c", False, 102, 4.0, "AAAAACGTTCGAAAAA")
    write_modbam(src, tmp_path / "out.bam", calls, AlignmentFilter())
    with pysam.AlignmentFile(str(tmp_path / "out.bam")) as fh:
        called, uncalled = list(fh)
    assert called.get_tag("MM") == "A+a?,0;C+m?,0,0;" and list(called.get_tag("ML")) == [7, 251, 251]
    assert uncalled.get_tag("MM") == "A+a?,0;" and list(uncalled.get_tag("ML")) == [7]
    assert list(called.get_tag("mv")) == list(uncalled.get_tag("mv")) == [5, 1, 0]
    assert not (tmp_path / "out.bam.bai").exists()


def test_streamer_call_writes_modbam_of_its_calls(tmp_path):
    shutil.copy(ECOLI / "reads.fasta", tmp_path / "reads.fasta")
    proc = subprocess.run([sys.executable, "-m", "streamer", "call", "-r", str(tmp_path / "reads.fasta"),
                           "-b", str(ECOLI / "reads.bam"), "-g", str(REFERENCE), "--signal", str(ECOLI / "fast5"),
                           "-o", str(tmp_path / "meth.tsv"), "--modbam", str(tmp_path / "mod.bam"), "-t", "2"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert check_round_trip(tmp_path / "mod.bam", tsv_calls(tmp_path / "meth.tsv")) > 1000
